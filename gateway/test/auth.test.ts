// API keys over real sockets: the official SDK and raw fetch, keys from the configuration and
// from CONDUIT_API_KEYS, the browser's subprotocol form on a WebSocket upgrade, the public
// routes, and no key ever written back in a response or a log line.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import http from 'node:http';
import { after, before, test } from 'node:test';
import type { FastifyInstance } from 'fastify';
import OpenAI from 'openai';
import type { ResponsesClientEvent, ResponsesServerEvent } from 'openai/resources/responses/responses';
import { ResponsesWS } from 'openai/resources/responses/ws';
import WebSocket from 'ws';
import { resolveApiKeys } from '../../configs/api-keys.ts';
import { validateConfig } from '../../configs/schema.ts';
import { MODEL_NAME, startTestGateway, type TestGateway } from './harness.ts';
import type { Script } from './scripted-engine.ts';

const ALICE_KEY = 'sk-alice-7f3a9c1e5b';
const BOB_KEY = 'sk-bob-2d8e4f6a0c';
// Wrong keys are written down too: they must not come back either.
const WRONG_KEY = 'sk-wrong-91b3d5f7';
const WRONG_KEY_OF_ALICES_LENGTH = 'sk-alice-7f3a9c1e5c';
const EVERY_KEY = [ALICE_KEY, BOB_KEY, WRONG_KEY, WRONG_KEY_OF_ALICES_LENGTH];
const TEST_WS_ROUTE = '/test/ws';

let gateway: TestGateway;
let script: Script = { steps: [] };
const logLines: string[] = [];
/** Every response's status line, headers and body, to search for keys. */
const responsesSeen: string[] = [];

/** A websocket route that echoes, to prove the key check applies to any upgrade. */
async function addTestRoutes(app: FastifyInstance) {
  app.get(TEST_WS_ROUTE, { websocket: true }, (socket) => {
    socket.on('message', (data) => socket.send(`echo ${data.toString()}`));
  });
}

before(async () => {
  const config = validateConfig(
    { server: { api_keys: [{ key: ALICE_KEY, name: 'alice' }] }, models: [{ path: 'm' }] },
    '/etc/conduit/keys.yaml',
  );
  const apiKeys = resolveApiKeys(config.server, { CONDUIT_API_KEYS: ` ${BOB_KEY} ` });
  gateway = await startTestGateway(() => script, {
    gatewayOptions: {
      access: { apiKeys },
      logger: { level: 'trace', stream: { write: (line: string) => logLines.push(line) } },
    },
    beforeListen: addTestRoutes,
  });
});
after(() => gateway.close());

async function fetchRecorded(route: string, init: RequestInit = {}): Promise<{ response: Response; body: string }> {
  const response = await fetch(`${gateway.baseUrl}${route}`, init);
  const body = await response.text();
  responsesSeen.push(`${response.status} ${JSON.stringify([...response.headers])}\n${body}`);
  return { response, body };
}

function client(apiKey: string) {
  return new OpenAI({ baseURL: `${gateway.baseUrl}/v1`, apiKey, maxRetries: 0 });
}

const chatBody = { model: MODEL_NAME, messages: [{ role: 'user' as const, content: 'hi' }] };

function assertUnauthorized(response: Response, body: string, message: RegExp) {
  assert.equal(response.status, 401);
  assert.equal(response.headers.get('www-authenticate'), 'Bearer');
  const parsed = JSON.parse(body);
  assert.deepEqual(Object.keys(parsed.error).sort(), ['code', 'message', 'param', 'type']);
  assert.equal(parsed.error.code, 'invalid_api_key');
  assert.equal(parsed.error.type, 'invalid_request_error');
  assert.equal(parsed.error.param, null);
  assert.match(parsed.error.message, message);
}

test('the SDK with a wrong key gets an AuthenticationError, with the right one an answer', async () => {
  script = { steps: [gateway.tokens('Hello')], finishReason: 'stop' };
  for (const wrongKey of [WRONG_KEY, WRONG_KEY_OF_ALICES_LENGTH]) {
    const error = await client(wrongKey).chat.completions.create(chatBody).then(
      () => assert.fail('a wrong key was let in'),
      (err: unknown) => err,
    );
    assert.ok(error instanceof OpenAI.AuthenticationError);
    assert.equal(error.status, 401);
    assert.equal(error.code, 'invalid_api_key');
    assert.equal(error.type, 'invalid_request_error');
    assert.equal(error.message, '401 Incorrect API key provided.');
    responsesSeen.push(error.message);
  }
  const completion = await client(ALICE_KEY).chat.completions.create(chatBody);
  assert.equal(completion.choices[0].message.content, 'Hello');
  const stream = await client(ALICE_KEY).chat.completions.create({ ...chatBody, stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? '';
  assert.equal(text, 'Hello');
});

test('a key from CONDUIT_API_KEYS is as good as one from the configuration', async () => {
  const models = await client(BOB_KEY).models.list();
  assert.deepEqual(models.data.map((model) => model.id), [MODEL_NAME, 'plain']);
});

test('raw requests: no key, another scheme and a wrong key are 401; the scheme is case-insensitive', async () => {
  const post = (headers: Record<string, string>) =>
    fetchRecorded('/v1/chat/completions', {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body: JSON.stringify(chatBody),
    });
  const missing = /You didn't provide an API key/;
  let { response, body } = await post({});
  assertUnauthorized(response, body, missing);
  ({ response, body } = await post({ authorization: `Basic ${Buffer.from(`user:${ALICE_KEY}`).toString('base64')}` }));
  assertUnauthorized(response, body, missing);
  ({ response, body } = await post({ authorization: 'Bearer ' }));
  assertUnauthorized(response, body, missing);
  ({ response, body } = await post({ authorization: `Bearer ${WRONG_KEY}` }));
  assertUnauthorized(response, body, /^Incorrect API key provided\.$/);
  // A body is never read for a request refused at the door: a large one is refused just the same.
  ({ response, body } = await fetchRecorded('/v1/completions', { method: 'POST', body: 'x'.repeat(100_000) }));
  assertUnauthorized(response, body, missing);

  script = { steps: [gateway.tokens('ok')], finishReason: 'stop' };
  ({ response, body } = await post({ authorization: `bearer  ${ALICE_KEY}` }));
  assert.equal(response.status, 200);
  assert.equal(JSON.parse(body).choices[0].message.content, 'ok');
});

test('/health and GET / need no key; every other route does, even an unknown one', async () => {
  assert.equal((await fetchRecorded('/health')).response.status, 200);
  assert.equal((await fetchRecorded('/health?verbose=1')).response.status, 200);
  assert.equal((await fetchRecorded('/')).response.status, 200);
  assertUnauthorized(...Object.values(await fetchRecorded('/v1/models')) as [Response, string], /didn't provide/);
  assertUnauthorized(...Object.values(await fetchRecorded('/nowhere')) as [Response, string], /didn't provide/);
  assertUnauthorized(
    ...Object.values(await fetchRecorded('/health', { method: 'POST', body: '{}' })) as [Response, string],
    /didn't provide/,
  );
  const notFound = await fetchRecorded('/nowhere', { headers: { authorization: `Bearer ${ALICE_KEY}` } });
  assert.equal(notFound.response.status, 404);
});

function wsUrl(route: string) {
  return `${gateway.baseUrl.replace('http:', 'ws:')}${route}`;
}

/** Resolves with the HTTP status a refused upgrade got, and its body. */
function refusedUpgrade(socket: WebSocket): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    socket.once('open', () => reject(new Error('the upgrade was accepted')));
    socket.once('unexpected-response', (_request, response) => {
      let body = '';
      response.on('data', (chunk: Buffer) => (body += chunk.toString()));
      response.on('end', () => resolve({ status: response.statusCode ?? 0, body }));
    });
  });
}

async function echoOnce(socket: WebSocket): Promise<string> {
  await once(socket, 'open');
  socket.send('ping');
  const [data] = await once(socket, 'message');
  socket.close();
  return (data as Buffer).toString();
}

test('a WebSocket upgrade needs a key too: by header, or offered as a subprotocol', async () => {
  const withoutKey = await refusedUpgrade(new WebSocket(wsUrl(TEST_WS_ROUTE)));
  assert.equal(withoutKey.status, 401);
  assert.equal(JSON.parse(withoutKey.body).error.code, 'invalid_api_key');
  const wrongOffer = await refusedUpgrade(new WebSocket(wsUrl(TEST_WS_ROUTE), [`openai-insecure-api-key.${WRONG_KEY}`, 'chat']));
  assert.equal(wrongOffer.status, 401);
  assert.match(JSON.parse(wrongOffer.body).error.message, /^Incorrect API key provided\.$/);
  responsesSeen.push(withoutKey.body, wrongOffer.body);

  const byHeader = new WebSocket(wsUrl(TEST_WS_ROUTE), { headers: { authorization: `Bearer ${BOB_KEY}` } });
  assert.equal(await echoOnce(byHeader), 'echo ping');

  // A browser offers the key and the protocol it speaks: the server selects the latter.
  const byOffer = new WebSocket(wsUrl(TEST_WS_ROUTE), [`openai-insecure-api-key.${ALICE_KEY}`, 'chat']);
  assert.equal(await echoOnce(byOffer), 'echo ping');
  assert.equal(byOffer.protocol, 'chat');
});

test("the SDK's ResponsesWS on /v1/responses: refused with a wrong key, answered with the right one", async () => {
  const wrong = new ResponsesWS(client(WRONG_KEY));
  const failed = new Promise<string>((resolve) => wrong.on('error', (error) => resolve(error.message)));
  wrong.send({ type: 'response.create', model: MODEL_NAME, input: 'hi' } as ResponsesClientEvent);
  assert.match(await failed, /401/);
  responsesSeen.push(await failed);

  script = { steps: [gateway.tokens(' Welcome')], finishReason: 'stop' };
  const right = new ResponsesWS(client(ALICE_KEY));
  right.on('error', () => {});
  const completed = new Promise<ResponsesServerEvent>((resolve) => right.on('response.completed', resolve));
  right.send({ type: 'response.create', model: MODEL_NAME, input: 'hi' } as ResponsesClientEvent);
  const event = (await completed) as Extract<ResponsesServerEvent, { type: 'response.completed' }>;
  const [message] = event.response.output;
  assert.ok(message.type === 'message' && message.content[0].type === 'output_text');
  assert.equal(message.content[0].text, ' Welcome');
  right.close();
});

/** A raw upgrade, to read the 101's headers whatever a client library would make of them. */
function upgradeHeaders(baseUrl: string, protocolOffer: string): Promise<http.IncomingHttpHeaders> {
  return new Promise((resolve, reject) => {
    const request = http.request(`${baseUrl}${TEST_WS_ROUTE}`, {
      headers: {
        connection: 'Upgrade',
        upgrade: 'websocket',
        'sec-websocket-version': '13',
        'sec-websocket-key': 'dGhlIHNhbXBsZSBub25jZQ==',
        'sec-websocket-protocol': protocolOffer,
      },
    });
    request.once('upgrade', (response, socket) => {
      socket.destroy();
      resolve(response.headers);
    });
    request.once('response', (response) => reject(new Error(`no upgrade: ${response.statusCode}`)));
    request.once('error', reject);
    request.end();
  });
}

test('the server never selects the key offer as the subprotocol', async () => {
  const onlyKey = await upgradeHeaders(gateway.baseUrl, `openai-insecure-api-key.${ALICE_KEY}`);
  assert.equal(onlyKey['sec-websocket-protocol'], undefined);
  const keyFirst = await upgradeHeaders(gateway.baseUrl, `openai-insecure-api-key.${ALICE_KEY}, chat, other`);
  assert.equal(keyFirst['sec-websocket-protocol'], 'chat');
  responsesSeen.push(JSON.stringify(onlyKey), JSON.stringify(keyFirst));

  // Nor does a server without keys, which has no use for the offer.
  const open = await startTestGateway(() => script, { beforeListen: addTestRoutes });
  try {
    const headers = await upgradeHeaders(open.baseUrl, `openai-insecure-api-key.${WRONG_KEY}`);
    assert.equal(headers['sec-websocket-protocol'], undefined);
    responsesSeen.push(JSON.stringify(headers));
  } finally {
    await open.close();
  }
});

test('no key, right or wrong, is ever written back in a response or a log line', () => {
  const written = [...logLines, ...responsesSeen].join('\n');
  for (const key of EVERY_KEY) assert.ok(!written.includes(key), 'a key was written back');
  // The check saw real traffic: every request above was logged (its access line, at trace level with its body).
  const entries = logLines.map((line) => JSON.parse(line));
  assert.ok(responsesSeen.length > 10);
  assert.ok(entries.filter((entry) => entry.msg === 'request completed').length >= responsesSeen.length);
  const refusals = entries.filter((entry) => entry.msg === 'request refused');
  assert.ok(refusals.length >= 8);
  assert.ok(refusals.every((entry) => entry.code === 'invalid_api_key'));
  assert.ok(refusals.some((entry) => entry.keyPresented === true));
  assert.ok(refusals.some((entry) => entry.keyPresented === false));
});
