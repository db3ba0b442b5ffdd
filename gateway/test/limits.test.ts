// Per-key requests and tokens per minute, and caps on requests in flight, over real sockets:
// 429 in OpenAI's envelope with Retry-After, x-ratelimit-* headers on every response of a limited
// key, the SDK's RateLimitError, recovery once the clock (driven by the test) has moved on, and
// slots given back when a stream ends or its client leaves.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { afterEach, test } from 'node:test';
import OpenAI from 'openai';
import type { ResponsesClientEvent, ResponsesServerEvent } from 'openai/resources/responses/responses';
import { ResponsesWS } from 'openai/resources/responses/ws';
import type { AccessOptions } from '../server.ts';
import { MODEL_NAME, startTestGateway, type TestGateway } from './harness.ts';
import type { Script } from './scripted-engine.ts';

let gateway: TestGateway;
let script: Script = { steps: [] };
let clockMs = 0;
afterEach(() => gateway.close());

async function startLimited(access: Omit<AccessOptions, 'nowMs'>) {
  clockMs = 1_000_000;
  gateway = await startTestGateway(() => script, { gatewayOptions: { access: { ...access, nowMs: () => clockMs } } });
}

function client(apiKey: string) {
  return new OpenAI({ baseURL: `${gateway.baseUrl}/v1`, apiKey, maxRetries: 0 });
}

function post(apiKey: string, route: string, body: string, signal?: AbortSignal) {
  return fetch(`${gateway.baseUrl}${route}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' },
    body,
    signal,
  });
}

function get(apiKey: string, route: string) {
  return fetch(`${gateway.baseUrl}${route}`, { headers: { authorization: `Bearer ${apiKey}` } });
}

function rateLimitHeaders(response: Response): Record<string, string | null> {
  const names = ['limit', 'remaining', 'reset'].flatMap((what) => [`x-ratelimit-${what}-requests`, `x-ratelimit-${what}-tokens`]);
  return Object.fromEntries(names.map((name) => [name, response.headers.get(name)]).filter(([, value]) => value !== null));
}

async function expectRateLimited(response: Response, type: 'requests' | 'tokens', retryAfterMs: number, message: RegExp) {
  assert.equal(response.status, 429);
  assert.equal(response.headers.get('retry-after'), String(Math.ceil(retryAfterMs / 1000)));
  assert.equal(response.headers.get('retry-after-ms'), String(retryAfterMs));
  const { error } = await response.json();
  assert.deepEqual(Object.keys(error).sort(), ['code', 'message', 'param', 'type']);
  assert.equal(error.code, 'rate_limit_exceeded');
  assert.equal(error.type, type);
  assert.match(error.message, message);
}

const KEY = 'sk-limited-1';
const OTHER_KEY = 'sk-other-2';
const chatBody = { model: MODEL_NAME, messages: [{ role: 'user' as const, content: 'hi' }] };

test('requests per minute: a bucket of two, refilled one every 30 s', async () => {
  await startLimited({ apiKeys: [{ name: 'team-a', key: KEY, limits: { requestsPerMinute: 2 } }] });
  script = { steps: [gateway.tokens('ok')], finishReason: 'stop' };
  const sdk = client(KEY);
  const first = await sdk.chat.completions.create(chatBody).withResponse();
  assert.deepEqual(rateLimitHeaders(first.response), {
    'x-ratelimit-limit-requests': '2',
    'x-ratelimit-remaining-requests': '1',
    'x-ratelimit-reset-requests': '30s',
  });
  // Streamed responses carry them too.
  const second = await post(KEY, '/v1/chat/completions', JSON.stringify({ ...chatBody, stream: true }));
  assert.equal(second.status, 200);
  assert.match(await second.text(), /data: \[DONE\]/);
  assert.deepEqual(rateLimitHeaders(second), {
    'x-ratelimit-limit-requests': '2',
    'x-ratelimit-remaining-requests': '0',
    'x-ratelimit-reset-requests': '1m0s',
  });

  const refused = await sdk.chat.completions.create(chatBody).then(
    () => assert.fail('a third request in the same instant was let in'),
    (err: unknown) => err,
  );
  assert.ok(refused instanceof OpenAI.RateLimitError);
  assert.equal(refused.code, 'rate_limit_exceeded');
  assert.equal(refused.type, 'requests');
  assert.equal(refused.headers.get('retry-after'), '30');
  assert.equal(refused.headers.get('x-ratelimit-remaining-requests'), '0');
  assert.match(refused.message, /Rate limit reached for key `team-a` on requests per min \(RPM\): Limit 2, Used 2, Requested 1\. Please try again in 30s\./);
  await expectRateLimited(await get(KEY, '/v1/models'), 'requests', 30_000, /Please try again in 30s/);

  clockMs += 29_999;
  await expectRateLimited(await post(KEY, '/v1/chat/completions', JSON.stringify(chatBody)), 'requests', 1, /in 1ms/);
  clockMs += 1;
  const recovered = await sdk.chat.completions.create(chatBody).withResponse();
  assert.equal(recovered.data.choices[0].message.content, 'ok');
  assert.equal(recovered.response.headers.get('x-ratelimit-remaining-requests'), '0');
});

test("tokens per minute: Triton's generate settles its tokens against the key's quota as /v1 does", async () => {
  const tokensPerMinute = 1000;
  await startLimited({ apiKeys: [{ name: 'team-g', key: KEY, limits: { tokensPerMinute } }] });
  script = { steps: [gateway.tokens(' a b c')], finishReason: 'length' };
  const body = JSON.stringify({ text_input: 'Hello', parameters: { max_tokens: 10 } });
  const first = await post(KEY, `/v2/models/${MODEL_NAME}/generate`, body);
  assert.equal(first.status, 200);
  const estimate = tokensPerMinute - Number(first.headers.get('x-ratelimit-remaining-tokens'));
  const { usage } = await first.json();
  assert.equal(usage.completion_tokens, 3);
  assert.notEqual(usage.total_tokens, estimate, 'the test needs the usage to differ from the estimate');
  // The first request's estimate was replaced by what it used; the second is charged its estimate.
  const second = await post(KEY, `/v2/models/${MODEL_NAME}/generate_stream`, body);
  assert.equal(second.status, 200);
  assert.equal(second.headers.get('x-ratelimit-remaining-tokens'), String(tokensPerMinute - usage.total_tokens - estimate));
  await second.text();
  const third = await post(KEY, `/v2/models/${MODEL_NAME}/generate`, body);
  assert.equal(third.headers.get('x-ratelimit-remaining-tokens'), String(tokensPerMinute - 2 * usage.total_tokens - estimate));
  await third.text();
});

test('tokens per minute: the estimate is charged at admission and settled with the usage', async () => {
  const tokensPerMinute = 100;
  await startLimited({ apiKeys: [{ name: 'team-b', key: KEY, limits: { tokensPerMinute } }] });
  script = { steps: [gateway.tokens(' a b c')], finishReason: 'length' };
  const body = JSON.stringify({ model: MODEL_NAME, prompt: 'Hello', max_tokens: 10 });
  // Four bytes of body a token, plus the most output asked for.
  const estimate = Math.ceil(Buffer.byteLength(body) / 4) + 10;
  const first = await post(KEY, '/v1/completions', body);
  assert.equal(first.status, 200);
  assert.deepEqual(rateLimitHeaders(first), {
    'x-ratelimit-limit-tokens': '100',
    'x-ratelimit-remaining-tokens': String(tokensPerMinute - estimate),
    'x-ratelimit-reset-tokens': `${(estimate * 60) / tokensPerMinute}s`,
  });
  const usage = (await first.json()).usage;
  assert.equal(usage.completion_tokens, 3);

  // A request refused by validation uses nothing and is charged nothing.
  const invalid = await post(KEY, '/v1/completions', JSON.stringify({ model: MODEL_NAME, prompt: 'x', temperature: 'hot' }));
  assert.equal(invalid.status, 400);
  assert.ok(invalid.headers.has('x-ratelimit-remaining-tokens'));
  await invalid.text();

  const second = await post(KEY, '/v1/completions', body);
  assert.equal(second.headers.get('x-ratelimit-remaining-tokens'), String(tokensPerMinute - usage.total_tokens - estimate));
  await second.text();

  // More than the whole minute: it waits for a full bucket.
  const big = JSON.stringify({ model: MODEL_NAME, prompt: 'Hello', max_tokens: 20, n: 5 });
  const bigEstimate = Math.ceil(Buffer.byteLength(big) / 4) + 20 * 5;
  assert.ok(bigEstimate > tokensPerMinute);
  const numMissingTokens = tokensPerMinute - (tokensPerMinute - 2 * usage.total_tokens);
  const waitMs = Math.ceil((numMissingTokens * 60_000) / tokensPerMinute);
  await expectRateLimited(
    await post(KEY, '/v1/completions', big),
    'tokens',
    waitMs,
    new RegExp(`on tokens per min \\(TPM\\): Limit 100, Used ${2 * usage.total_tokens}, Requested ${bigEstimate}\\.`),
  );
  const sdkRefusal = await client(KEY).completions.create({ model: MODEL_NAME, prompt: 'Hello', max_tokens: 20, n: 5 }).catch((err) => err);
  assert.ok(sdkRefusal instanceof OpenAI.RateLimitError);
  assert.equal(sdkRefusal.type, 'tokens');

  clockMs += waitMs;
  const admitted = await post(KEY, '/v1/completions', big);
  assert.equal(admitted.status, 200);
  await admitted.text();
});

test('while a request larger than its estimate runs, the bucket is in debt; it settles when it ends', async () => {
  const tokensPerMinute = 20;
  await startLimited({ apiKeys: [{ name: 'team-c', key: KEY, limits: { tokensPerMinute } }] });
  script = { steps: [gateway.tokens(' a')], hang: true };
  const huge = JSON.stringify({ model: MODEL_NAME, prompt: 'Hello', max_tokens: 40, stream: true });
  const hugeEstimate = Math.ceil(Buffer.byteLength(huge) / 4) + 40;
  const controller = new AbortController();
  const stream = await post(KEY, '/v1/completions', huge, controller.signal);
  assert.equal(stream.status, 200);
  assert.equal(stream.headers.get('x-ratelimit-remaining-tokens'), '0');
  await stream.body!.getReader().read();

  const small = JSON.stringify({ model: MODEL_NAME, prompt: 'Hi', max_tokens: 1 });
  const smallEstimate = Math.ceil(Buffer.byteLength(small) / 4) + 1;
  const debtWaitMs = Math.ceil(((smallEstimate - (tokensPerMinute - hugeEstimate)) * 60_000) / tokensPerMinute);
  assert.ok(debtWaitMs > 60_000);
  await expectRateLimited(await post(KEY, '/v1/completions', small), 'tokens', debtWaitMs, /Requested \d+\./);

  const aborted = once(gateway.engine, 'abort');
  controller.abort();
  await aborted;
  script = { steps: [gateway.tokens(' b')], finishReason: 'length' };
  const settled = await post(KEY, '/v1/completions', small);
  assert.equal(settled.status, 200);
  const numPromptTokens = gateway.engine.requests.at(-2)!.promptTokenIds.length;
  assert.equal(settled.headers.get('x-ratelimit-remaining-tokens'), String(tokensPerMinute - numPromptTokens - 1 - smallEstimate));
  await settled.text();
});

test('tokens of a stream its client abandons are charged as far as they went', async () => {
  await startLimited({ apiKeys: [{ name: 'team-d', key: KEY, limits: { tokensPerMinute: 1000 } }] });
  script = { steps: [gateway.tokens(' a'), gateway.tokens(' b')], hang: true };
  const controller = new AbortController();
  const body = JSON.stringify({ model: MODEL_NAME, prompt: 'Hello', max_tokens: 50, stream: true });
  const response = await post(KEY, '/v1/completions', body, controller.signal);
  assert.equal(response.status, 200);
  const reader = response.body!.getReader();
  const decoder = new TextDecoder();
  let text = '';
  while (!text.includes(' b')) {
    const { done, value } = await reader.read();
    assert.ok(!done, `the stream ended before its second token: ${text}`);
    text += decoder.decode(value, { stream: true });
  }
  const aborted = once(gateway.engine, 'abort');
  controller.abort();
  await aborted;
  const numPromptTokens = gateway.engine.requests.at(-1)!.promptTokenIds.length;
  const next = await get(KEY, '/v1/models');
  // The stream's 50 reserved tokens came back but for the prompt and the two tokens generated.
  assert.equal(next.headers.get('x-ratelimit-remaining-tokens'), String(1000 - numPromptTokens - 2));
});

async function openStream(apiKey: string, signal: AbortSignal): Promise<Response> {
  const response = await post(apiKey, '/v1/chat/completions', JSON.stringify({ ...chatBody, stream: true }), signal);
  assert.equal(response.status, 200);
  await response.body!.getReader().read();
  return response;
}

test('concurrent requests per key: a stream holds its slot until it ends or its client leaves', async () => {
  await startLimited({
    apiKeys: [
      { name: 'team-e', key: KEY, limits: { maxConcurrentRequests: 1 } },
      { name: 'team-f', key: OTHER_KEY, limits: {} },
    ],
  });
  script = { steps: [gateway.tokens('slow')], hang: true };
  const controller = new AbortController();
  await openStream(KEY, controller.signal);

  const refused = await client(KEY).chat.completions.create(chatBody).catch((err) => err);
  assert.ok(refused instanceof OpenAI.RateLimitError);
  assert.equal(refused.type, 'requests');
  assert.equal(refused.headers.get('retry-after'), '1');
  assert.match(refused.message, /Too many concurrent requests for key `team-e`: limit 1\./);
  // Another key is not held up.
  script = { steps: [gateway.tokens('fine')], finishReason: 'stop' };
  assert.equal((await client(OTHER_KEY).chat.completions.create(chatBody)).choices[0].message.content, 'fine');

  const aborted = once(gateway.engine, 'abort');
  controller.abort();
  await aborted;
  // Released: a request that finishes gives its slot back too.
  for (let i = 0; i < 3; i++) {
    const stream = await post(KEY, '/v1/chat/completions', JSON.stringify({ ...chatBody, stream: true }));
    assert.equal(stream.status, 200);
    assert.match(await stream.text(), /fine.*\[DONE\]/s);
  }
});

test('the server-wide cap counts every key; health probes and other keys are not held up', async () => {
  await startLimited({
    apiKeys: [
      { name: 'a', key: KEY, limits: {} },
      { name: 'b', key: OTHER_KEY, limits: {} },
    ],
    maxConcurrentRequests: 2,
  });
  script = { steps: [gateway.tokens('slow')], hang: true };
  const first = new AbortController();
  const second = new AbortController();
  await openStream(KEY, first.signal);
  await openStream(OTHER_KEY, second.signal);
  const refused = await post(OTHER_KEY, '/v1/chat/completions', JSON.stringify(chatBody));
  assert.equal(refused.status, 429);
  assert.equal(refused.headers.get('retry-after'), '1');
  const { error } = await refused.json();
  assert.equal(error.code, 'server_overloaded');
  assert.equal(error.type, 'requests');
  assert.match(error.message, /limit of 2 concurrent requests/);
  // Health probes are not requests against the cap.
  assert.equal((await fetch(`${gateway.baseUrl}/health`)).status, 200);

  const aborted = once(gateway.engine, 'abort');
  first.abort();
  await aborted;
  // The stream of `second` still runs: one slot is free again.
  script = { steps: [gateway.tokens('fine')], finishReason: 'stop' };
  assert.equal((await client(KEY).chat.completions.create(chatBody)).choices[0].message.content, 'fine');
  second.abort();
});

/** A Responses WebSocket of the SDK, with its events collected. */
async function openResponsesSocket(apiKey: string) {
  const rws = new ResponsesWS(client(apiKey));
  rws.on('error', () => {});
  const events: ResponsesServerEvent[] = [];
  let onNewEvent = () => {};
  rws.on('event', (event) => {
    events.push(event);
    onNewEvent();
  });
  const nextEvent = () => new Promise<void>((resolve) => (onNewEvent = resolve));
  /** Sends a response.create and resolves with its first event (the first output, or an error). */
  const create = async (input: string): Promise<ResponsesServerEvent> => {
    const numEventsBefore = events.length;
    rws.send({ type: 'response.create', model: MODEL_NAME, input, max_output_tokens: 5 } as ResponsesClientEvent);
    while (events.length === numEventsBefore) await nextEvent();
    return events[numEventsBefore];
  };
  /** Resolves once the response in flight has ended. */
  const ended = async () => {
    const isEnd = (event: ResponsesServerEvent) => event.type === 'response.completed' || event.type === 'response.incomplete';
    while (!isEnd(events.at(-1)!)) await nextEvent();
  };
  return { rws, create, ended };
}

test('on a Responses WebSocket each response.create is a request: it is counted, and holds a slot while it runs', async () => {
  await startLimited({ apiKeys: [{ name: 'team-w', key: KEY, limits: { requestsPerMinute: 3, maxConcurrentRequests: 1 } }] });
  script = { steps: [gateway.tokens('slow')], hang: true };
  const first = await openResponsesSocket(KEY);
  // Opening the socket took nothing: a whole minute's requests are left.
  assert.equal((await first.create('one')).type, 'response.created');

  // The turn in flight holds the key's one slot, against HTTP requests as against other sockets.
  const refused = await client(KEY).chat.completions.create(chatBody).catch((err) => err);
  assert.ok(refused instanceof OpenAI.RateLimitError);
  assert.match(refused.message, /Too many concurrent requests for key `team-w`: limit 1\./);
  const second = await openResponsesSocket(KEY);
  const refusedTurn = await second.create('two');
  assert.equal(refusedTurn.type, 'error');
  const turnError = refusedTurn as Extract<ResponsesServerEvent, { type: 'error' }> & { status: number };
  assert.equal(turnError.status, 429);
  assert.equal(turnError.code, 'rate_limit_exceeded');
  assert.match(turnError.message, /Too many concurrent requests/);

  // Closing the socket cancels its turn and gives the slot back.
  const aborted = once(gateway.engine, 'abort');
  first.rws.close();
  await aborted;
  script = { steps: [gateway.tokens(' fine')], finishReason: 'stop' };
  assert.equal((await second.create('three')).type, 'response.created');
  await second.ended();
  // Requests per minute: 'one', 'three' and this turn; the next, on the socket or over HTTP, waits 20 s.
  assert.equal((await second.create('four')).type, 'response.created');
  await second.ended();
  const overRate = (await second.create('five')) as Extract<ResponsesServerEvent, { type: 'error' }>;
  assert.equal(overRate.type, 'error');
  assert.equal(overRate.code, 'rate_limit_exceeded');
  assert.match(overRate.message, /on requests per min \(RPM\): Limit 3, Used 3, Requested 1\. Please try again in 20s\./);
  await expectRateLimited(await get(KEY, '/v1/models'), 'requests', 20_000, /in 20s/);
  clockMs += 20_000;
  assert.equal((await second.create('six')).type, 'response.created');
  await second.ended();
  second.rws.close();
});

test('a server without keys holds its one anonymous caller to the default limits', async () => {
  await startLimited({ apiKeys: [], anonymousLimits: { requestsPerMinute: 1 } });
  const anyone = new OpenAI({ baseURL: `${gateway.baseUrl}/v1`, apiKey: 'anything', maxRetries: 0 });
  await anyone.models.list();
  const refused = await anyone.models.list().catch((err) => err);
  assert.ok(refused instanceof OpenAI.RateLimitError);
  assert.match(refused.message, /Rate limit reached for this server on requests per min/);
  assert.equal(refused.headers.get('retry-after'), '60');
});

test('the Responses API is charged the tokens it used, over HTTP and per WebSocket turn', async () => {
  const tokensPerMinute = 1000;
  await startLimited({ apiKeys: [{ name: 'team-r', key: KEY, limits: { tokensPerMinute } }] });
  script = { steps: [gateway.tokens(' a b')], finishReason: 'stop' };
  const overHttp = await client(KEY).responses.create({ model: MODEL_NAME, input: 'Hello', max_output_tokens: 20 });
  const httpTokens = overHttp.usage!.total_tokens;
  assert.equal(overHttp.usage!.output_tokens, 2);
  assert.equal((await get(KEY, '/v1/models')).headers.get('x-ratelimit-remaining-tokens'), String(tokensPerMinute - httpTokens));

  const socket = await openResponsesSocket(KEY);
  await socket.create('Hello again');
  await socket.ended();
  const turnTokens = gateway.engine.requests.at(-1)!.promptTokenIds.length + 2;
  assert.equal(
    (await get(KEY, '/v1/models')).headers.get('x-ratelimit-remaining-tokens'),
    String(tokensPerMinute - httpTokens - turnTokens),
  );
  socket.rws.close();
});
