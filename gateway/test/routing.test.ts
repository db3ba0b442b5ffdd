// The gateway's routing over several workers: sessions, spreading, retrying a request that a
// worker failed before it started, and the router's metrics. (test/integration/routing.test.ts
// routes real workers by their KV caches.)
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import OpenAI from 'openai';
import type { GenerateRequest } from '../../engine/types.ts';
import { MODEL_NAME, sseEvents, startTestGateway, type TestGateway } from './harness.ts';
import type { Script } from './scripted-engine.ts';

let gateway: TestGateway;
let scriptFor: (request: GenerateRequest) => Script = () => ({ steps: [] });
before(async () => {
  gateway = await startTestGateway((request) => scriptFor(request), { numWorkers: 3 });
});
after(() => gateway.close());

/** Which worker got each request, by request id. */
function workerOf(requestId: string): string[] {
  return gateway.engines.filter((engine) => engine.requests.some((r) => r.requestId === requestId)).map((engine) => engine.address);
}

function lastRequestIds(): string[] {
  return gateway.engines.flatMap((engine) => engine.requests.map((request) => request.requestId));
}

async function scrape(): Promise<string> {
  return (await fetch(`${gateway.metricsUrl}/metrics`)).text();
}

function sampleOf(metrics: string, name: string, labels: string): number {
  const line = metrics.split('\n').find((l) => l.startsWith(`${name}{${labels}}`));
  return line === undefined ? 0 : Number(line.split(' ').at(-1));
}

test('the turns of a session (x-session-id) go to one worker', async () => {
  scriptFor = () => ({ steps: [gateway.tokens(' ok')], finishReason: 'stop' });
  const client = new OpenAI({ baseURL: `${gateway.baseUrl}/v1`, apiKey: 'unused', maxRetries: 0 });
  const before = new Set(lastRequestIds());
  const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [];
  for (let turn = 0; turn < 4; turn++) {
    messages.push({ role: 'user', content: `t${turn}` });
    const completion = await client.chat.completions.create(
      { model: MODEL_NAME, messages },
      { headers: { 'x-session-id': 'conversation-7' } },
    );
    messages.push({ role: 'assistant', content: completion.choices[0].message.content ?? '' });
  }
  const turns = lastRequestIds().filter((id) => !before.has(id));
  assert.equal(turns.length, 4);
  assert.equal(new Set(turns.flatMap(workerOf)).size, 1, 'every turn on the worker of the first');
});

test('chained Responses turns (previous_response_id) go to the worker of the turn they continue', async () => {
  scriptFor = () => ({ steps: [gateway.tokens(' ok')], finishReason: 'stop' });
  const client = new OpenAI({ baseURL: `${gateway.baseUrl}/v1`, apiKey: 'unused', maxRetries: 0 });
  const before = new Set(lastRequestIds());
  let previousResponseId: string | undefined;
  for (let turn = 0; turn < 4; turn++) {
    const response = await client.responses.create({ model: MODEL_NAME, input: 'hi', previous_response_id: previousResponseId });
    previousResponseId = response.id;
  }
  const turns = lastRequestIds().filter((id) => !before.has(id));
  assert.equal(turns.length, 4);
  assert.equal(new Set(turns.flatMap(workerOf)).size, 1, 'every turn on the worker of the first');
});

test('requests in flight spread over the workers, counted at routing before any worker reports them', { timeout: 10_000 }, async () => {
  scriptFor = () => ({ steps: [], hang: true });
  const controllers = Array.from({ length: 9 }, () => new AbortController());
  const counts = gateway.engines.map((engine) => engine.numInFlight);
  const pending = controllers.map((controller, i) =>
    fetch(`${gateway.baseUrl}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL_NAME, prompt: `cold prompt ${i}` }),
      signal: controller.signal,
    }).catch(() => null),
  );
  while (gateway.engines.reduce((sum, engine) => sum + engine.numInFlight, 0) < 9) await new Promise((resolve) => setTimeout(resolve, 5));
  assert.deepEqual(gateway.engines.map((engine, i) => engine.numInFlight - counts[i]), [3, 3, 3]);
  for (const controller of controllers) controller.abort();
  await Promise.all(pending);
});

test('a worker that fails a request before its first output hands it to another; the client sees one answer', async () => {
  const failedOnce = new Set<string>();
  scriptFor = (request) => {
    if (failedOnce.has(request.requestId)) return { steps: [gateway.tokens(' recovered')], finishReason: 'stop' };
    failedOnce.add(request.requestId);
    return { steps: [], error: { code: 'engine_unavailable', message: 'Lost the stream to engine worker w: it died' } };
  };
  const metricsBefore = await scrape();
  const response = await gateway.post('/v1/chat/completions', {
    model: MODEL_NAME, messages: [{ role: 'user', content: 'hi' }], stream: true,
  });
  assert.equal(response.status, 200);
  const events = sseEvents(await response.text()) as { choices?: { delta: { content?: string } }[] }[];
  const text = events.flatMap((event) => (typeof event === 'object' ? (event.choices ?? []) : [])).map((c) => c.delta.content ?? '').join('');
  assert.equal(text, ' recovered');
  const [requestId] = [...failedOnce];
  const workers = workerOf(requestId);
  assert.equal(workers.length, 2, 'tried on a second worker, once');
  const metricsAfter = await scrape();
  const retriesOf = (metrics: string) =>
    gateway.engines.reduce((sum, engine) => sum + sampleOf(metrics, 'conduit_router_retries_total', `model_name="${MODEL_NAME}",worker="${engine.address}"`), 0);
  assert.equal(retriesOf(metricsAfter) - retriesOf(metricsBefore), 1);
});

test('a worker failing after output is not retried: the stream ends with the error event', async () => {
  const requestIds: string[] = [];
  scriptFor = (request) => {
    requestIds.push(request.requestId);
    return { steps: [gateway.tokens(' partial'), []], error: { code: 'engine_unavailable', message: 'Lost the stream' } };
  };
  const response = await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x', stream: true });
  const body = await response.text();
  assert.equal(requestIds.length, 1);
  const [requestId] = requestIds;
  assert.match(body, /"code":"engine_unavailable"/);
  assert.match(body, / partial/);
  assert.equal(workerOf(requestId).length, 1, 'no second worker saw it: the client had text already');
});

test('when every worker fails a request before it starts, the client gets one 503 after each was tried once', async () => {
  const requestIds: string[] = [];
  scriptFor = (request) => {
    requestIds.push(request.requestId);
    return { steps: [], error: { code: 'engine_unavailable', message: 'down' } };
  };
  const response = await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x' });
  assert.equal(response.status, 503);
  const body = (await response.json()) as { error: { code: string } };
  assert.equal(body.error.code, 'engine_unavailable');
  assert.equal(requestIds.length, 3);
  assert.equal(new Set(requestIds).size, 1);
  assert.equal(workerOf(requestIds[0]).length, 3, 'one request, tried once on each worker');
  // Other requests still succeed.
  scriptFor = () => ({ steps: [gateway.tokens(' fine')], finishReason: 'stop' });
  assert.equal((await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x' })).status, 200);
});

test('the router\'s metrics: routed requests per worker, prompt and cached tokens, decision time', async () => {
  scriptFor = () => ({ steps: [gateway.tokens(' ok')], finishReason: 'stop', numCachedTokens: 3 });
  const metricsBefore = await scrape();
  const sum = (metrics: string, name: string) =>
    gateway.engines.reduce((total, engine) => total + sampleOf(metrics, name, `model_name="${MODEL_NAME}",worker="${engine.address}"`), 0);
  for (let i = 0; i < 4; i++) assert.equal((await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'a b c d e' })).status, 200);
  const metrics = await scrape();
  assert.equal(sum(metrics, 'conduit_router_requests_total') - sum(metricsBefore, 'conduit_router_requests_total'), 4);
  assert.equal(sum(metrics, 'conduit_router_prompt_tokens_total') - sum(metricsBefore, 'conduit_router_prompt_tokens_total'), 4 * gateway.tokens('a b c d e').length);
  assert.equal(sum(metrics, 'conduit_router_cached_tokens_total') - sum(metricsBefore, 'conduit_router_cached_tokens_total'), 4 * 3);
  assert.match(metrics, new RegExp(`conduit_router_decision_duration_seconds_count\\{model_name="${MODEL_NAME}"\\} \\d+`));
  for (const engine of gateway.engines) {
    assert.match(metrics, new RegExp(`conduit_router_index_blocks\\{model_name="${MODEL_NAME}",worker="${engine.address}"\\} 0`));
  }
});
