// No request can stall the others: several 5 MB prompts (parsed, rendered and tokenized off the
// event loop, or refused by their length before anyone tokenizes them) while other streams run;
// no turn of the event loop computes for long, /health keeps answering and the streams keep
// receiving tokens. Large bodies and prompts get the same answers as small ones, and the same
// errors.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Worker } from 'node:worker_threads';
import { WebSocket } from 'ws';
import type { GenerateRequest } from '../../engine/types.ts';
import { watchLoopTurns } from '../../test/thread-time.ts';
import { LONG_MODEL_NAME, MODEL_NAME, sseEvents, startTestGateway, type TestGateway } from './harness.ts';
import type { Script } from './scripted-engine.ts';

/**
 * The most CPU time one turn of the event loop may take while large prompts are worked on: a
 * 5 MB prompt tokenized on the loop takes 4-5 s of it. The gateway's own handling of a
 * tokenized 5 MB prompt (its million ids) takes one turn 70-210 ms on a 2-core machine under
 * load, which this bound leaves to its own work.
 */
const LOOP_TURN_BOUND_MS = 500;
const NUM_LARGE_PROMPTS = 4;
const LARGE_PROMPT_CHARS = 5_000_000;
const STREAM_PROMPT = 'stream';

let gateway: TestGateway;
let streamScript: Script;
before(async () => {
  gateway = await startTestGateway((request) => (isStream(request) ? streamScript : { steps: [[13]] }), {
    bodyLimitBytes: 8 * 1024 * 1024,
    longModelLen: 4 * 1024 * 1024,
  });
  // Tokens every 20 ms for about four seconds.
  // The offload threads start on first use (a second of CPU each, off the loop); started here,
  // the machine's two cores are not shared with their start while the loop is watched.
  await Promise.all([1, 2].map(() => gateway.post('/tokenize', { model: LONG_MODEL_NAME, prompt: 'warm '.repeat(1000) })));
  streamScript = { steps: Array(200).fill(gateway.tokens(' tick')), stepIntervalMs: 20, finishReason: 'length' };
});
after(() => gateway.close());

function isStream(request: GenerateRequest): boolean {
  // Decoding a million-token prompt here would hold the loop this test watches.
  return request.promptTokenIds.length < 16 && gateway.tokenizer.decode(request.promptTokenIds, { skipSpecialTokens: true }) === STREAM_PROMPT;
}

const words = 'The quick brown fox jumps over the lazy dog. Grüße aus Köln, 東京 🎉 ';
const largeText = words.repeat(Math.ceil(LARGE_PROMPT_CHARS / words.length)).slice(0, LARGE_PROMPT_CHARS);

interface StreamWatch {
  /** performance.now() of each chunk received. */
  chunkTimesMs: number[];
  done: Promise<void>;
}

function watchStream(): StreamWatch {
  const chunkTimesMs: number[] = [];
  const done = (async () => {
    const response = await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: STREAM_PROMPT, stream: true });
    const reader = response.body!.getReader();
    for (;;) {
      const { done: isDone } = await reader.read();
      if (isDone) return;
      chunkTimesMs.push(performance.now());
    }
  })();
  return { chunkTimesMs, done };
}

/** Asks /health back to back until stop() and keeps each answer's latency. */
function watchHealth() {
  const latenciesMs: number[] = [];
  let isStopped = false;
  const done = (async () => {
    while (!isStopped) {
      const startMs = performance.now();
      const response = await fetch(`${gateway.baseUrl}/health`);
      await response.arrayBuffer();
      assert.equal(response.status, 200);
      latenciesMs.push(performance.now() - startMs);
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
  })();
  return {
    latenciesMs,
    async stop() {
      isStopped = true;
      await done;
    },
  };
}

interface LargeRequest {
  route: string;
  body: Buffer;
}

interface LargeResponse {
  status: number;
  json: {
    usage?: { prompt_tokens?: number; input_tokens?: number };
    error?: { code: string; param: string | null; message: string };
  };
}

/**
 * The large requests come from a thread of their own, as they would from other processes: the
 * client's work of sending megabytes is not the gateway's, and must not hold the loop watched.
 */
const clientThreadSource = `
const { parentPort, workerData } = require('node:worker_threads');
Promise.all(workerData.requests.map(async ({ url, body }) => {
  const response = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
  return { status: response.status, json: await response.json() };
})).then((responses) => parentPort.postMessage(responses));
`;

function postFromThread(requests: LargeRequest[]): Promise<LargeResponse[]> {
  const workerData = { requests: requests.map(({ route, body }) => ({ url: `${gateway.baseUrl}${route}`, body })) };
  const client = new Worker(clientThreadSource, { eval: true, workerData });
  return new Promise((resolve, reject) => {
    client.once('message', (responses: LargeResponse[]) => {
      resolve(responses);
      void client.terminate();
    });
    client.once('error', reject);
  });
}

async function duringLargeWork(requests: LargeRequest[]) {
  const streams = Array.from({ length: 3 }, () => watchStream());
  // The streams are flowing before the large prompts come.
  while (streams.some((stream) => stream.chunkTimesMs.length < 3)) await new Promise((resolve) => setTimeout(resolve, 10));
  const health = watchHealth();
  const loop = watchLoopTurns();
  const startMs = performance.now();
  const responses = await postFromThread(requests);
  const endMs = performance.now();
  const longestTurnMs = loop.stop();
  await health.stop();
  await Promise.all(streams.map((stream) => stream.done));
  assert.ok(
    longestTurnMs < LOOP_TURN_BOUND_MS,
    `a turn of the event loop took ${longestTurnMs.toFixed(0)} ms of ${loop.clock} time (/health latencies: ${health.latenciesMs.map((ms) => ms.toFixed(0)).join(', ')} ms)`,
  );
  assert.ok(health.latenciesMs.length >= 3, `only ${health.latenciesMs.length} health probes in ${(endMs - startMs).toFixed(0)} ms`);
  for (const stream of streams) {
    const numChunksDuring = stream.chunkTimesMs.filter((ms) => ms > startMs && ms < endMs).length;
    assert.ok(numChunksDuring > 0, 'a stream received nothing while the large prompts were worked on');
  }
  return { responses, elapsedMs: endMs - startMs };
}

/**
 * Bodies are serialized and encoded before the clock starts: the client shares the server's
 * event loop here, and its own work is not the server's.
 */
function largeBody(body: object): Buffer {
  return Buffer.from(JSON.stringify(body));
}

test('5 MB prompts, several at once (completions, chat, Responses, Triton generate), are tokenized off the loop: the loop never computes for long, /health answers and streams keep flowing', { timeout: 120_000 }, async () => {
  const expectedTokenIds = gateway.tokens(largeText);
  const completion = largeBody({ model: LONG_MODEL_NAME, prompt: largeText, max_tokens: 1 });
  const chatBody = largeBody({ model: LONG_MODEL_NAME, messages: [{ role: 'user', content: largeText }], max_tokens: 1 });
  const responsesBody = largeBody({ model: LONG_MODEL_NAME, input: largeText, max_output_tokens: 1 });
  // Triton's generate extension encodes its prompt as /v1 does.
  const generateBody = largeBody({ text_input: largeText, max_tokens: 1, exclude_input_in_output: true });
  const { responses, elapsedMs } = await duringLargeWork([
    ...Array.from({ length: NUM_LARGE_PROMPTS - 3 }, () => ({ route: '/v1/completions', body: completion })),
    { route: `/v2/models/${LONG_MODEL_NAME}/generate`, body: generateBody },
    { route: '/v1/chat/completions', body: chatBody },
    { route: '/v1/responses', body: responsesBody },
  ]);
  for (const response of responses) assert.equal(response.status, 200, JSON.stringify(response.json));
  for (const response of responses.slice(0, -2)) assert.equal(response.json.usage?.prompt_tokens, expectedTokenIds.length);
  const renderedIds = gateway.tokens(`<|user|>${largeText}<|endoftext|><|assistant|>`);
  assert.equal(responses.at(-2)!.json.usage?.prompt_tokens, renderedIds.length);
  assert.equal(responses.at(-1)!.json.usage?.input_tokens, renderedIds.length);
  const sent = gateway.engine.requests.filter((request) => request.promptTokenIds.length === expectedTokenIds.length);
  assert.deepEqual(sent.at(-1)?.promptTokenIds.slice(0, 8), expectedTokenIds.slice(0, 8));
  assert.ok(elapsedMs > LOOP_TURN_BOUND_MS, 'the large prompts took no time: the test measured nothing');
});

test('5 MB prompts a model cannot hold are refused by their length before tokenizing, without holding the loop', { timeout: 60_000 }, async () => {
  const completion = largeBody({ model: MODEL_NAME, prompt: largeText });
  const chatBody = largeBody({ model: MODEL_NAME, messages: [{ role: 'user', content: largeText }] });
  const { responses } = await duringLargeWork(
    Array.from({ length: NUM_LARGE_PROMPTS }, (_, i) =>
      i % 2 === 0 ? { route: '/v1/completions', body: completion } : { route: '/v1/chat/completions', body: chatBody },
    ),
  );
  for (const response of responses) {
    assert.equal(response.status, 400);
    const error = response.json.error!;
    assert.equal(error.code, 'context_length_exceeded');
    assert.equal(error.param, 'input_text');
    assert.match(error.message, /at most 8192/);
  }
});

test('large bodies, prompts and chats get the same answers as small ones', async () => {
  // Over the inline limits: a 100 KB body, a 3,000-character prompt, a chat of 200 messages.
  const text = largeText.slice(0, 100_000);
  const viaPool = await (await gateway.post('/tokenize', { model: LONG_MODEL_NAME, prompt: text })).json();
  assert.deepEqual(viaPool.tokens, gateway.tokens(text));
  const short = largeText.slice(0, 3000);
  assert.deepEqual((await (await gateway.post('/tokenize', { model: LONG_MODEL_NAME, prompt: short })).json()).tokens, gateway.tokens(short));
  const messages = Array.from({ length: 200 }, (_, i) => ({ role: i % 2 === 0 ? 'user' : 'assistant', content: `message ${i}` }));
  const chat = await (await gateway.post('/tokenize', { model: LONG_MODEL_NAME, messages })).json();
  const rendered = messages.map((message) => `<|${message.role}|>${message.content}<|endoftext|>`).join('') + '<|assistant|>';
  assert.deepEqual(chat.tokens, gateway.tokens(rendered));
  // And a completion on it streams as usual.
  streamScript = { steps: [gateway.tokens('ok')], finishReason: 'stop' };
  const events = sseEvents(await (await gateway.post('/v1/completions', { model: LONG_MODEL_NAME, prompt: text, stream: true })).text());
  assert.equal(events.at(-1), '[DONE]');
});

test('large bodies get the same errors: bad JSON, bad UTF-8, too many objects, a missing template', async () => {
  const padding = 'x'.repeat(100_000);
  const expectError = async (response: Response, code: string) => {
    assert.equal(response.status, 400);
    assert.equal((await response.json()).error.code, code);
  };
  await expectError(await gateway.post('/v1/completions', `{"model":"${MODEL_NAME}","prompt":"${padding}"`), 'invalid_json');
  const badUtf8 = Buffer.concat([Buffer.from(`{"model":"${MODEL_NAME}","prompt":"${padding}`), Buffer.from([0xc3, 0x28]), Buffer.from('"}')]);
  await expectError(await gateway.post('/v1/completions', badUtf8), 'invalid_utf8');
  const manyArrays = `{"model":"${MODEL_NAME}","prompt":"x","extra":[${Array(40_000).fill('[]').join(',')}]}`;
  await expectError(await gateway.post('/v1/completions', manyArrays), 'invalid_request');
  const deep = `{"model":"${MODEL_NAME}","prompt":"x","extra":${'['.repeat(500_000)}${']'.repeat(500_000)}}`;
  await expectError(await gateway.post('/v1/completions', deep), 'invalid_request');
  // Deep nesting is refused the same in a small body, parsed on the loop.
  const shallowEnough = `{"model":"${MODEL_NAME}","prompt":"x","max_tokens":1,"extra":${'['.repeat(100)}${']'.repeat(100)}}`;
  assert.equal((await gateway.post('/v1/completions', shallowEnough)).status, 200);
  await expectError(await gateway.post('/v1/completions', `{"model":"${MODEL_NAME}","prompt":"x","extra":${'['.repeat(200)}${']'.repeat(200)}}`), 'invalid_request');
  const messages = Array.from({ length: 100 }, () => ({ role: 'user', content: 'hi' }));
  await expectError(await gateway.post('/v1/chat/completions', { model: 'plain', messages }), 'chat_template_missing');
  // Still serving.
  const ok = await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x', max_tokens: 1 });
  assert.equal(ok.status, 200);
});

test('WebSocket mode: a response.create whose prompt is still tokenized off the loop is in flight', { timeout: 30_000 }, async () => {
  const input = largeText.slice(0, 20_000);
  const isTerminal = (type: string) => type === 'response.completed' || type === 'response.incomplete';
  const socket = new WebSocket(`${gateway.baseUrl.replace(/^http/, 'ws')}/v1/responses`);
  await new Promise((resolve, reject) => socket.once('open', resolve).once('error', reject));
  const events: { type: string; code?: string; response?: { usage: { input_tokens: number } } }[] = [];
  const ended = new Promise<void>((resolve) => {
    socket.on('message', (data) => {
      const event = JSON.parse(data.toString());
      events.push(event);
      if (isTerminal(event.type) && events.some((seen) => seen.type === 'error')) resolve();
    });
  });
  // Back to back: the second arrives while the first's prompt is in a thread.
  socket.send(JSON.stringify({ type: 'response.create', model: LONG_MODEL_NAME, input }));
  socket.send(JSON.stringify({ type: 'response.create', model: LONG_MODEL_NAME, input: 'another' }));
  await ended;
  socket.close();
  assert.equal(events.find((event) => event.type === 'error')?.code, 'response_already_in_flight');
  const finished = events.find((event) => isTerminal(event.type))!;
  assert.equal(finished.response!.usage.input_tokens, gateway.tokens(`<|user|>${input}<|endoftext|><|assistant|>`).length);
});
