// Triton's generate extension for the LLMs, over a real gateway and a scripted engine worker.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import http from 'node:http';
import { after, before, test } from 'node:test';
import { within } from '../../../test/wait.ts';
import { oneTokenPerStep, sseEvents, startTestGateway, type TestGateway } from '../../test/harness.ts';
import type { Script } from '../../test/scripted-engine.ts';

let gateway: TestGateway;
let script: Script = { steps: [] };
before(async () => {
  gateway = await startTestGateway(() => script);
});
after(() => gateway.close());

test('generate answers with the prompt and the whole text (as the vLLM backend by default), the id echoed, parameters read from `parameters` too', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens(' the quick brown fox')), finishReason: 'length' };
  const response = await gateway.post('/v2/models/tiny/generate', { id: 'g-1', text_input: 'Say:', parameters: { max_tokens: 4, temperature: 0 } });
  assert.equal(response.status, 200);
  const body = await response.json() as Record<string, unknown>;
  assert.deepEqual(body, {
    id: 'g-1', model_name: 'tiny', model_version: '1', text_output: 'Say: the quick brown fox', finish_reason: 'length',
    usage: { prompt_tokens: gateway.tokens('Say:').length, completion_tokens: 4, total_tokens: gateway.tokens('Say:').length + 4, prompt_tokens_details: { cached_tokens: 0 } },
  });
  const sent = gateway.engine.requests.at(-1)!;
  assert.equal(sent.sampling.maxTokens, 4);
  assert.equal(sent.sampling.temperature, 0);
  assert.deepEqual(sent.promptTokenIds, gateway.tokens('Say:'));
});

test('generate_stream sends one SSE event per text delta, then the finish', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens(' hello world')), finishReason: 'stop' };
  const response = await gateway.post('/v2/models/tiny/versions/1/generate_stream', { text_input: 'Hi', max_tokens: 8 });
  assert.equal(response.status, 200);
  assert.equal(response.headers.get('content-type'), 'text/event-stream; charset=utf-8');
  const events = sseEvents(await response.text()) as Array<Record<string, unknown>>;
  assert.deepEqual(events.slice(0, -1).map((e) => e.text_output), [' hello', ' world']);
  assert.equal(events.at(-1)!.finish_reason, 'stop');
  assert.ok(events.every((e) => e.model_name === 'tiny' && e.model_version === '1'));
});

test('a stop string cuts the text', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens(' one two three')), finishReason: 'length' };
  const body = await (await gateway.post('/v2/models/tiny/generate', { text_input: 'x', stop: ' two', exclude_input_in_output: true })).json() as { text_output: string; finish_reason: string };
  assert.equal(body.text_output, ' one');
  assert.equal(body.finish_reason, 'stop');
});

test('exclude_input_in_output: true leaves the prompt out of /generate; streaming never echoes it and refuses false', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens(' red green')), finishReason: 'length' };
  for (const where of ['top', 'parameters']) {
    const request = where === 'top' ? { text_input: 'Colours:', exclude_input_in_output: true } : { text_input: 'Colours:', parameters: { exclude_input_in_output: true } };
    const body = await (await gateway.post('/v2/models/tiny/generate', request)).json() as { text_output: string };
    assert.equal(body.text_output, ' red green');
  }
  const echoed = await (await gateway.post('/v2/models/tiny/generate', { text_input: 'Colours:', exclude_input_in_output: false })).json() as { text_output: string };
  assert.equal(echoed.text_output, 'Colours: red green');
  const streamed = sseEvents(await (await gateway.post('/v2/models/tiny/generate_stream', { text_input: 'Colours:' })).text()) as Array<{ text_output: string }>;
  assert.equal(streamed.map((event) => event.text_output).join(''), ' red green');
  const refused = await gateway.post('/v2/models/tiny/generate_stream', { text_input: 'Colours:', exclude_input_in_output: false });
  assert.equal(refused.status, 400);
  assert.deepEqual(await refused.json(), { error: 'When streaming, `exclude_input_in_output` = False is not allowed.' });
  const badType = await gateway.post('/v2/models/tiny/generate', { text_input: 'Colours:', exclude_input_in_output: 'yes' });
  assert.equal(badType.status, 400);
});

test("errors are Triton's bodies: unknown model, bad body, a worker error before and after the first event", async () => {
  const unknown = await gateway.post('/v2/models/nope/generate', { text_input: 'x' });
  assert.equal(unknown.status, 404);
  assert.deepEqual(await unknown.json(), { error: "Request for unknown model: 'nope' is not found" });
  const bad = await gateway.post('/v2/models/tiny/generate', { text_input: 3 });
  assert.equal(bad.status, 400);
  assert.match((await bad.json() as { error: string }).error, /^text_input: /);
  script = { steps: [], error: { code: 'kv_cache_too_small', message: 'too big' } };
  const early = await gateway.post('/v2/models/tiny/generate_stream', { text_input: 'x' });
  assert.equal(early.status, 400);
  assert.deepEqual(await early.json(), { error: 'too big' });
  script = { steps: oneTokenPerStep(gateway.tokens('Hello world')), error: { code: 'internal_error', message: 'worker fell over' } };
  const late = await gateway.post('/v2/models/tiny/generate_stream', { text_input: 'x' });
  assert.equal(late.status, 200);
  const events = sseEvents(await late.text());
  // A worker's internal text stays in the log; clients read the catalogue's message.
  assert.deepEqual(events.at(-1), { error: 'The server failed while running the request.' });
});

test('an LLM has metadata and readiness under /v2 too', async () => {
  // Every input and output of the v2 model (llm-models.test.ts); the first of each here.
  const metadata = await (await fetch(`${gateway.baseUrl}/v2/models/tiny`)).json() as Record<string, unknown[]>;
  assert.deepEqual({ ...metadata, inputs: metadata.inputs.slice(0, 1), outputs: metadata.outputs.slice(0, 1) }, {
    name: 'tiny', versions: ['1'], platform: 'conduit_llm',
    inputs: [{ name: 'text_input', datatype: 'BYTES', shape: [1] }],
    outputs: [{ name: 'text_output', datatype: 'BYTES', shape: [-1] }],
  });
  assert.equal((await fetch(`${gateway.baseUrl}/v2/models/tiny/ready`)).status, 200);
  assert.equal((await fetch(`${gateway.baseUrl}/v2/models/tiny/versions/2/ready`)).status, 400);
  assert.equal((await fetch(`${gateway.baseUrl}/v2/health/ready`)).status, 200);
});

test('an LLM whose workers have no live engine stream is not ready, nor is the server', async (t) => {
  gateway.engine.isStreamDown = true;
  t.after(() => {
    gateway.engine.isStreamDown = false;
  });
  assert.equal((await fetch(`${gateway.baseUrl}/v2/models/tiny/ready`)).status, 400);
  assert.equal((await fetch(`${gateway.baseUrl}/v2/health/ready`)).status, 400);
  gateway.engine.isStreamDown = false;
  assert.equal((await fetch(`${gateway.baseUrl}/v2/models/tiny/ready`)).status, 200);
  assert.equal((await fetch(`${gateway.baseUrl}/v2/health/ready`)).status, 200);
});

test('a generate_stream reader that lets more than the bound pile up is cut: the request aborted in its worker, an error event last', { timeout: 60_000 }, async () => {
  // Far more than the socket buffers on both ends hold: about 30 MB of events.
  const flood: Script = { steps: Array<number[]>(40_000).fill(Array<number>(100).fill(15496)) };
  const slowGateway = await startTestGateway(() => flood, { limits: { sseBufferLimitBytes: 64 * 1024 } });
  try {
    const aborted = once(slowGateway.engine, 'abort');
    const request = http.request(`${slowGateway.baseUrl}/v2/models/tiny/generate_stream`, { method: 'POST', headers: { 'content-type': 'application/json' } });
    request.end(JSON.stringify({ text_input: 'flood' }));
    const [response] = (await once(request, 'response')) as [http.IncomingMessage];
    await once(response, 'data');
    response.pause();
    const [requestId] = await within(aborted, 'the abort in the worker', 20_000);
    assert.equal(requestId, slowGateway.engine.requests[0].requestId);
    let numBytes = 0;
    let tail = '';
    response.on('data', (chunk: Buffer) => {
      numBytes += chunk.length;
      tail = (tail + chunk.toString()).slice(-1000);
    });
    response.resume();
    await within(once(response, 'end'), 'the end of the stream', 20_000);
    assert.match(tail.slice(tail.lastIndexOf('data: ')), /^data: \{"error":"The client read the stream too slowly: \d+ bytes were waiting to be sent, more than the 65536-byte limit/);
    assert.ok(numBytes < 15_000_000, `bytes received: ${numBytes}`);
  } finally {
    await slowGateway.close();
  }
});
