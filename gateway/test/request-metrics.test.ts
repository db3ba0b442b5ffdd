// The request metric families vLLM users' dashboards expect, read back from a real /metrics
// after generations whose endings and token counts the test knows.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { within } from '../../test/wait.ts';
import { startTestGateway, MODEL_NAME, type TestGateway } from './harness.ts';
import type { Script } from './scripted-engine.ts';

/** The samples of a Prometheus text exposition, by series (`name{labels}` as written). */
function parseExposition(text: string): Map<string, number> {
  const samples = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const space = line.lastIndexOf(' ');
    samples.set(line.slice(0, space), Number(line.slice(space + 1)));
  }
  return samples;
}

let script: Script;
let gateway: TestGateway;

before(async () => {
  gateway = await startTestGateway(() => script);
});
after(() => gateway.close());

async function scrape(): Promise<Map<string, number>> {
  return parseExposition(await (await fetch(`${gateway.metricsUrl}/metrics`)).text());
}

function complete(maxTokens = 16): Promise<Response> {
  return gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'count these', max_tokens: maxTokens });
}

const model = `model_name="${MODEL_NAME}"`;

test('generations count by finish reason; ITL has tokens - 1 per request; queue and prefill come from the worker', async () => {
  const before = await scrape();
  const delta = (series: string) => (before.has(series) ? -before.get(series)! : 0);

  // stop, 4 tokens in 3 steps (two arrive together), with the worker's queue and prefill times
  script = { steps: [[11], [12, 13], [14]], finishReason: 'stop', queueTimeMs: 250, prefillTimeMs: 40 };
  assert.equal((await complete()).status, 200);
  // length, 3 tokens
  script = { steps: [[21], [22], [23]], finishReason: 'length' };
  assert.equal((await complete()).status, 200);
  // error after 2 tokens (a worker's error output carries none), not streamed: a 500
  script = { steps: [[31], [32], []], error: { code: 'internal_error', message: 'boom' } };
  assert.equal((await complete()).status, 500);
  // abort: the client leaves a stream after its first token
  script = { steps: [[41]], hang: true };
  const controller = new AbortController();
  const streaming = await fetch(`${gateway.baseUrl}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL_NAME, prompt: 'p', stream: true }),
    signal: controller.signal,
  });
  await streaming.body!.getReader().read();
  const aborted = within(new Promise((resolve) => gateway.engine.once('abort', resolve)), 'the abort');
  controller.abort();
  await aborted;

  const after = await scrape();
  const grew = (series: string) => (after.get(series) ?? 0) + delta(series);
  for (const [reason, count] of [['stop', 1], ['length', 1], ['error', 1], ['abort', 1]] as const) {
    assert.equal(grew(`conduit_request_success_total{${model},finished_reason="${reason}"}`), count, reason);
  }
  // (4 - 1) + (3 - 1) + (2 - 1) + (1 - 1): every token but each request's first.
  assert.equal(grew(`conduit_inter_token_latency_seconds_count{${model}}`), 6);
  // The two tokens of one step are 0 s apart.
  assert.ok(grew(`conduit_inter_token_latency_seconds_bucket{le="0.0005",${model}}`) >= 1);
  // Only the first request's worker reported queue and prefill times.
  assert.equal(grew(`conduit_request_queue_time_seconds_count{${model}}`), 1);
  assert.equal(grew(`conduit_request_queue_time_seconds_sum{${model}}`), 0.25);
  assert.equal(grew(`conduit_request_prefill_time_seconds_sum{${model}}`), 0.04);
  // Finished requests (stop, length) have latencies and token counts.
  assert.equal(grew(`conduit_e2e_request_latency_seconds_count{${model}}`), 2);
  assert.equal(grew(`conduit_request_decode_time_seconds_count{${model}}`), 2);
  assert.equal(grew(`conduit_request_generation_tokens_count{${model}}`), 2);
  assert.equal(grew(`conduit_request_generation_tokens_sum{${model}}`), 7);
  assert.equal(grew(`conduit_request_generation_tokens_bucket{le="2",${model}}`), 0);
  assert.equal(grew(`conduit_request_generation_tokens_bucket{le="5",${model}}`), 2);
  const numPromptTokens = gateway.engine.requests.at(-2)!.promptTokenIds.length;
  assert.equal(grew(`conduit_request_prompt_tokens_count{${model}}`), 2);
  assert.equal(grew(`conduit_request_prompt_tokens_sum{${model}}`), 2 * numPromptTokens);
  assert.equal(grew(`conduit_time_to_first_token_seconds_count{${model}}`), 4);
});

test('HTTP requests have a duration histogram by endpoint, method and status', async () => {
  script = { steps: [[1]], finishReason: 'length' };
  await (await complete(1)).json();
  await (await fetch(`${gateway.baseUrl}/v1/models`)).json();
  const samples = await scrape();
  assert.ok(samples.get('conduit_http_request_duration_seconds_count{endpoint="/v1/completions",method="POST",status_code="200"}')! >= 1);
  assert.ok(samples.get('conduit_http_request_duration_seconds_count{endpoint="/v1/models",method="GET",status_code="200"}')! >= 1);
  assert.ok(samples.get('conduit_http_request_duration_seconds_sum{endpoint="/v1/models",method="GET",status_code="200"}')! > 0);
});
