// Streams that do not flow: a long prefill gets its headers and keep-alive comments, a reader that
// stops reading is cancelled at the buffer bound (its request aborted in the worker) while other
// streams go on.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { after, before, test } from 'node:test';
import OpenAI from 'openai';
import type { GenerateRequest } from '../../engine/types.ts';
import { MODEL_NAME, oneTokenPerStep, sseEvents, startTestGateway, type TestGateway } from './harness.ts';
import { connect, parseResponse, postHead } from './raw-client.ts';
import type { Script } from './scripted-engine.ts';

const KEEP_ALIVE_MS = 100;
const BUFFER_LIMIT_BYTES = 64 * 1024;
const FLOOD_PROMPT = 'flood';

let gateway: TestGateway;
let script: Script = { steps: [] };
let flood: Script;
before(async () => {
  gateway = await startTestGateway((request) => (isFlood(request) ? flood : script), {
    limits: { sseKeepAliveMs: KEEP_ALIVE_MS, streamMaxBufferedBytes: BUFFER_LIMIT_BYTES },
  });
  // Far more than the kernel's socket buffers hold: about 1 KB of text per step.
  flood = { steps: Array(20_000).fill(gateway.tokens(' lorem ipsum dolor'.repeat(60))), hang: true };
});
after(() => gateway.close());

function isFlood(request: GenerateRequest): boolean {
  return gateway.tokenizer.decode(request.promptTokenIds, { skipSpecialTokens: true }) === FLOOD_PROMPT;
}

const messages = [{ role: 'user', content: 'hi' }];

/** The SSE body's comments and data events, in order. */
function sseRecords(body: string): string[] {
  return body.split('\n\n').filter((record) => record !== '');
}

test('a long prefill gets its headers and a keep-alive comment every interval, then its tokens', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens('Hello world')), finishReason: 'stop', firstStepDelayMs: 4.5 * KEEP_ALIVE_MS };
  const response = await gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages, stream: true });
  assert.equal(response.status, 200);
  const body = await response.text();
  const records = sseRecords(body);
  const numComments = records.filter((record) => record === ': keep-alive').length;
  assert.ok(numComments >= 3, `${numComments} keep-alive comments in ${body}`);
  // The role chunk went with the headers, the comments followed, the text came after them all.
  assert.match(records[0], /"role":"assistant"/);
  assert.deepEqual(records.slice(1, 1 + numComments), Array(numComments).fill(': keep-alive'));
  const withoutComments = records.filter((record) => !record.startsWith(':')).join('\n\n') + '\n\n';
  const events = sseEvents(withoutComments) as { choices: { delta: { content?: string } }[] }[];
  assert.equal(events.pop(), '[DONE]');
  assert.equal(events.map((event) => event.choices[0].delta.content ?? '').join(''), 'Hello world');
});

test('the SDK reads through the comments', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens('Still here')), finishReason: 'stop', firstStepDelayMs: 2.5 * KEEP_ALIVE_MS };
  const client = new OpenAI({ baseURL: `${gateway.baseUrl}/v1`, apiKey: 'unused', maxRetries: 0 });
  const stream = await client.completions.create({ model: MODEL_NAME, prompt: 'x', stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, 'Still here');
});

test('a request that never outputs still gets its headers; leaving aborts it', { timeout: 10_000 }, async () => {
  script = { steps: [], hang: true };
  const controller = new AbortController();
  const response = await fetch(`${gateway.baseUrl}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL_NAME, prompt: 'x', stream: true }),
    signal: controller.signal,
  });
  assert.equal(response.status, 200);
  const reader = response.body!.getReader();
  const { value } = await reader.read();
  assert.equal(new TextDecoder().decode(value), ': keep-alive\n\n');
  const aborted = once(gateway.engine, 'abort');
  controller.abort();
  assert.deepEqual(await aborted, [gateway.engine.requests.at(-1)!.requestId]);
});

test('an error after the keep-alive began is an SSE error event; before it, an HTTP status', async () => {
  const error = { code: 'kv_cache_too_small' as const, message: 'The prompt needs 9 blocks; the cache has 8.' };
  script = { steps: [], error, firstStepDelayMs: 2.5 * KEEP_ALIVE_MS };
  const late = await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x', stream: true });
  assert.equal(late.status, 200);
  const records = sseRecords(await late.text());
  assert.deepEqual(records.slice(-2), [`data: {"error":{"message":"${error.message}","type":"invalid_request_error","param":null,"code":"kv_cache_too_small"}}`, 'data: [DONE]']);

  script = { steps: [], error };
  const early = await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x', stream: true });
  assert.equal(early.status, 400);
  assert.equal((await early.json()).error.code, 'kv_cache_too_small');
});

test('a reader that stops reading is cancelled at the bound, its request aborted, while other streams go on', { timeout: 30_000 }, async () => {
  // A stream that runs across the slow reader's whole life.
  script = { steps: oneTokenPerStep(gateway.tokens(' one two three four five six seven eight')), stepIntervalMs: 20, finishReason: 'length' };
  const other = gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages, stream: true }).then((response) => response.text());

  const floodRequest = new Promise<GenerateRequest>((resolve) => {
    const onGenerate = (request: GenerateRequest) => {
      if (!isFlood(request)) return;
      gateway.engine.off('generate', onGenerate);
      resolve(request);
    };
    gateway.engine.on('generate', onGenerate);
  });
  const connection = await connect(gateway.baseUrl);
  const body = JSON.stringify({ model: MODEL_NAME, prompt: FLOOD_PROMPT, stream: true });
  connection.socket.write(postHead('/v1/completions', Buffer.byteLength(body), true) + body);
  connection.socket.pause();
  const { requestId } = await floodRequest;
  const abortedIds: string[] = [];
  while (!abortedIds.includes(requestId)) abortedIds.push(...(await once(gateway.engine, 'abort')));

  // The other stream is whole.
  const events = sseEvents(await other) as { choices: { delta: { content?: string } }[] }[];
  assert.equal(events.pop(), '[DONE]');
  assert.equal(events.map((event) => event.choices[0].delta.content ?? '').join(''), ' one two three four five six seven eight');

  // Reading again, the slow client finds its stream ended with the reason.
  connection.socket.resume();
  await connection.closed;
  const { status, body: received } = parseResponse(connection.received());
  assert.equal(status, 200);
  assert.ok(received.endsWith('data: [DONE]\n\n'));
  const errorRecord = sseRecords(received).at(-2)!;
  const { error } = JSON.parse(errorRecord.slice('data: '.length));
  assert.equal(error.code, 'client_too_slow');
  const numUnsentBytes = Number(/(\d+) bytes were waiting/.exec(error.message)![1]);
  // Past the bound by at most the one chunk that crossed it.
  assert.ok(numUnsentBytes > BUFFER_LIMIT_BYTES && numUnsentBytes < BUFFER_LIMIT_BYTES + 8 * 1024, `${numUnsentBytes} bytes unsent`);
});
