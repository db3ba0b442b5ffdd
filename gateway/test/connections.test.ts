// What the server enforces on connections: a dripped body or dripped headers are cut by their
// timeouts with a 408 in the OpenAI envelope, idle keep-alive connections close, a response is
// never cut by the receive timeout, and connections past the cap are refused.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { MODEL_NAME, oneTokenPerStep, sseEvents, startTestGateway, type TestGateway } from './harness.ts';
import { connect, parseResponse, postHead, sleep } from './raw-client.ts';
import type { Script } from './scripted-engine.ts';

const HEADERS_TIMEOUT_MS = 300;
const RECEIVE_TIMEOUT_MS = 600;
const KEEP_ALIVE_TIMEOUT_MS = 1500;
const MAX_CONNECTIONS = 3;

let gateway: TestGateway;
let capped: TestGateway;
let script: Script = { steps: [] };
before(async () => {
  gateway = await startTestGateway(() => script, {
    limits: { headersTimeoutMs: HEADERS_TIMEOUT_MS, receiveTimeoutMs: RECEIVE_TIMEOUT_MS, keepAliveTimeoutMs: KEEP_ALIVE_TIMEOUT_MS },
  });
  capped = await startTestGateway(() => script, { limits: { maxConnections: MAX_CONNECTIONS } });
});
after(async () => {
  await gateway.close();
  await capped.close();
});

const request = JSON.stringify({ model: MODEL_NAME, prompt: 'x', max_tokens: 1 });

async function expectReceiveTimeout(connection: Awaited<ReturnType<typeof connect>>) {
  const { status, body } = parseResponse(connection.received());
  assert.equal(status, 408);
  assert.equal(JSON.parse(body).error.code, 'receive_timeout');
}

test('a body dripped one byte at a time is cut at the receive timeout with a 408', { timeout: 10_000 }, async () => {
  const connection = await connect(gateway.baseUrl);
  const startMs = performance.now();
  connection.socket.write(postHead('/v1/completions', Buffer.byteLength(request)));
  let numSentBytes = 0;
  let isClosed = false;
  void connection.closed.then(() => (isClosed = true));
  while (!isClosed && numSentBytes < request.length) {
    connection.socket.write(request[numSentBytes++]);
    await sleep(100);
  }
  await connection.closed;
  const elapsedMs = performance.now() - startMs;
  assert.ok(numSentBytes < request.length, 'the whole body got through');
  assert.ok(elapsedMs >= RECEIVE_TIMEOUT_MS && elapsedMs < RECEIVE_TIMEOUT_MS + 1000, `closed after ${elapsedMs} ms`);
  await expectReceiveTimeout(connection);
});

test('headers dripped one byte at a time are cut at the headers timeout', { timeout: 10_000 }, async () => {
  const connection = await connect(gateway.baseUrl);
  const startMs = performance.now();
  const head = postHead('/v1/completions', 2);
  let isClosed = false;
  void connection.closed.then(() => (isClosed = true));
  for (let i = 0; !isClosed && i < head.length; i++) {
    connection.socket.write(head[i]);
    await sleep(50);
  }
  await connection.closed;
  const elapsedMs = performance.now() - startMs;
  assert.ok(elapsedMs >= HEADERS_TIMEOUT_MS && elapsedMs < HEADERS_TIMEOUT_MS + 1000, `closed after ${elapsedMs} ms`);
  await expectReceiveTimeout(connection);
});

test('a connection that never sends a byte is closed at the headers timeout', { timeout: 10_000 }, async () => {
  const connection = await connect(gateway.baseUrl);
  const startMs = performance.now();
  await connection.closed;
  const elapsedMs = performance.now() - startMs;
  assert.ok(elapsedMs < HEADERS_TIMEOUT_MS + 1000, `closed after ${elapsedMs} ms`);
});

test('an idle keep-alive connection outlives the headers timeout, then closes at the keep-alive timeout', { timeout: 10_000 }, async () => {
  script = { steps: [gateway.tokens('ok')], finishReason: 'stop' };
  const connection = await connect(gateway.baseUrl);
  let isClosed = false;
  void connection.closed.then(() => (isClosed = true));
  connection.socket.write(postHead('/v1/completions', Buffer.byteLength(request)) + request);
  await sleep(2 * HEADERS_TIMEOUT_MS + 200);
  assert.equal(isClosed, false);
  // A second request on the same connection, after idling past the headers timeout.
  const numReceivedBefore = connection.received().length;
  connection.socket.write(postHead('/v1/completions', Buffer.byteLength(request)) + request);
  await sleep(200);
  assert.equal(isClosed, false);
  const second = parseResponse(connection.received().subarray(numReceivedBefore));
  assert.equal(second.status, 200);
  const idleStartMs = performance.now();
  await connection.closed;
  const idleMs = performance.now() - idleStartMs;
  assert.ok(idleMs > KEEP_ALIVE_TIMEOUT_MS - 500 && idleMs < KEEP_ALIVE_TIMEOUT_MS + 1500, `closed after ${idleMs} ms idle`);
});

test('a response that streams for longer than the receive timeout is never cut', { timeout: 10_000 }, async () => {
  script = { steps: oneTokenPerStep(gateway.tokens(' a b c d e f g h i j')), stepIntervalMs: RECEIVE_TIMEOUT_MS / 4, finishReason: 'length' };
  const startMs = performance.now();
  const response = await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x', stream: true });
  const events = sseEvents(await response.text()) as { choices: { text: string }[] }[];
  assert.ok(performance.now() - startMs > 2 * RECEIVE_TIMEOUT_MS);
  assert.equal(events.pop(), '[DONE]');
  assert.equal(events.map((event) => event.choices[0].text).join(''), ' a b c d e f g h i j');
});

test('connections past the cap are refused; a freed slot serves again', { timeout: 10_000 }, async () => {
  script = { steps: [capped.tokens('ok')], finishReason: 'stop' };
  const open = await Promise.all(Array.from({ length: MAX_CONNECTIONS }, () => connect(capped.baseUrl)));
  const refused = await connect(capped.baseUrl);
  refused.socket.write(postHead('/v1/completions', Buffer.byteLength(request)) + request);
  await refused.closed;
  assert.equal(refused.received().length, 0, 'a refused connection gets no response');
  // The open ones still serve.
  open[0].socket.write(postHead('/v1/completions', Buffer.byteLength(request), true) + request);
  await open[0].closed;
  assert.equal(parseResponse(open[0].received()).status, 200);
  const response = await capped.post('/v1/completions', { model: MODEL_NAME, prompt: 'x' });
  assert.equal(response.status, 200);
  for (const connection of open) connection.socket.destroy();
});
