// /v1/models, /tokenize, /detokenize, /health and the metrics server.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { MAX_MODEL_LEN, MODEL_NAME, oneTokenPerStep, startTestGateway, type TestGateway } from './harness.ts';
import type { Script } from './scripted-engine.ts';

let gateway: TestGateway;
let script: Script = { steps: [] };
before(async () => {
  gateway = await startTestGateway(() => script);
});
after(() => gateway.close());

test('/v1/models lists every served model in OpenAI list format', async () => {
  const body = await (await fetch(`${gateway.baseUrl}/v1/models`)).json();
  assert.equal(body.object, 'list');
  assert.deepEqual(
    body.data.map((model: { id: string; object: string; owned_by: string; max_model_len: number }) => [
      model.id,
      model.object,
      model.owned_by,
      model.max_model_len,
    ]),
    [
      [MODEL_NAME, 'model', 'conduit', MAX_MODEL_LEN],
      ['plain', 'model', 'conduit', MAX_MODEL_LEN],
    ],
  );
  assert.equal(typeof body.data[0].created, 'number');
  const card = await (await fetch(`${gateway.baseUrl}/v1/models/${MODEL_NAME}`)).json();
  assert.deepEqual(card, body.data[0]);
});

test('/tokenize a prompt or chat messages, /detokenize back', async () => {
  const prompt = await (await gateway.post('/tokenize', { model: MODEL_NAME, prompt: 'Hello 👋 world' })).json();
  assert.deepEqual(prompt, { tokens: [15496, 50169, 233, 995], count: 4, max_model_len: MAX_MODEL_LEN });

  const chat = await (
    await gateway.post('/tokenize', {
      model: MODEL_NAME,
      messages: [
        { role: 'developer', content: 'Be brief.' },
        { role: 'user', content: [{ type: 'text', text: 'h' }, { type: 'text', text: 'i' }] },
      ],
    })
  ).json();
  assert.deepEqual(chat.tokens, gateway.tokens('<|system|>Be brief.<|endoftext|><|user|>hi<|endoftext|><|assistant|>'));
  assert.equal(chat.count, chat.tokens.length);

  const text = await (await gateway.post('/detokenize', { model: MODEL_NAME, tokens: [15496, 50169, 233, 995, 50256] })).json();
  assert.deepEqual(text, { prompt: 'Hello 👋 world<|endoftext|>' });

  assert.equal((await gateway.post('/detokenize', { model: MODEL_NAME, tokens: [50257] })).status, 400);
  assert.equal((await gateway.post('/tokenize', { model: 'nope', prompt: 'x' })).status, 404);
  assert.equal((await gateway.post('/tokenize', { model: MODEL_NAME })).status, 400);
});

test('/tokenize counts text longer than the context, as vLLM does; generating from it is refused', async (t) => {
  // The body limit, not the context, bounds what /tokenize reads.
  const gateway = await startTestGateway(() => script, { bodyLimitBytes: 1 << 20 });
  t.after(() => gateway.close());
  const maxChars = gateway.tokenizer.maxTokenChars! * MAX_MODEL_LEN;
  // Past the length check, both on the loop and (over 2,048 characters) in the offload pool.
  for (const text of ['x '.repeat(Math.ceil(maxChars / 2) + 1), 'x '.repeat(Math.max(1100, Math.ceil(maxChars / 2) + 1))]) {
    assert.ok(text.length > maxChars);
    const response = await gateway.post('/tokenize', { model: MODEL_NAME, prompt: text });
    assert.equal(response.status, 200);
    const body = await response.json();
    assert.deepEqual(body, { tokens: gateway.tokens(text), count: gateway.tokens(text).length, max_model_len: MAX_MODEL_LEN });
    assert.ok(body.count > MAX_MODEL_LEN);
    const chat = await (await gateway.post('/tokenize', { model: MODEL_NAME, messages: [{ role: 'user', content: text }] })).json();
    assert.ok(chat.count > body.count);
    const completion = await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: text, max_tokens: 1 });
    assert.equal(completion.status, 400);
    assert.equal((await completion.json()).error.code, 'context_length_exceeded');
  }
});

test('/health is 200 while every model has a serving worker, 503 otherwise', async () => {
  const healthy = await fetch(`${gateway.baseUrl}/health`);
  assert.equal(healthy.status, 200);
  assert.deepEqual(await healthy.json(), {
    status: 'ok',
    state: 'ready',
    models: [
      { name: MODEL_NAME, numServingWorkers: 1, numWorkers: 1 },
      { name: 'plain', numServingWorkers: 1, numWorkers: 1 },
    ],
  });
  // A worker serves while its engine stream is up (what routing counts too).
  gateway.engine.isStreamDown = true;
  try {
    const unhealthy = await fetch(`${gateway.baseUrl}/health`);
    assert.equal(unhealthy.status, 503);
    assert.equal((await unhealthy.json()).status, 'unavailable');
  } finally {
    gateway.engine.isStreamDown = false;
  }
});

test('the metrics server exposes request, latency, token and worker families', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens('a b c')), finishReason: 'stop' };
  await (await gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages: [{ role: 'user', content: 'hi' }], stream: true })).text();
  await (await gateway.post('/v1/chat/completions', { model: 'missing', messages: [] })).text();
  const stats = {
    numScheduledTokens: 48, numScheduledSeqs: 3, numPreempted: 2, scheduleMs: 0.2, forwardMs: 3.8,
    numPrefixQueriedTokens: 64, numPrefixHitTokens: 32, kvUsage: 0.1, residentMemoryBytes: 123_456_789,
  };
  gateway.engine.report(stats);
  gateway.engine.report({ ...stats, numPreempted: 0, numPrefixQueriedTokens: 0, numPrefixHitTokens: 0, numScheduledTokens: 3 });
  const response = await fetch(`${gateway.metricsUrl}/metrics`);
  assert.equal(response.status, 200);
  assert.match(response.headers.get('content-type') ?? '', /^text\/plain/);
  const text = await response.text();
  for (const family of [
    'process_cpu_seconds_total',
    'conduit_http_requests_total{endpoint="/v1/chat/completions",status_code="200"} 1',
    'conduit_http_requests_total{endpoint="/v1/chat/completions",status_code="400"} 1',
    `conduit_time_to_first_token_seconds_count{model_name="${MODEL_NAME}"} 1`,
    `conduit_e2e_request_latency_seconds_count{model_name="${MODEL_NAME}"} 1`,
    `conduit_prompt_tokens_total{model_name="${MODEL_NAME}"} ${gateway.engine.requests.at(-1)!.promptTokenIds.length}`,
    `conduit_generation_tokens_total{model_name="${MODEL_NAME}"} 3`,
    `conduit_num_requests_running{model_name="${MODEL_NAME}",worker="scripted:0"} 0`,
    `conduit_num_requests_waiting{model_name="${MODEL_NAME}",worker="scripted:0"} 0`,
    `conduit_kv_blocks_used{model_name="${MODEL_NAME}",worker="scripted:0"} 10`,
    `conduit_kv_blocks_total{model_name="${MODEL_NAME}",worker="scripted:0"} 100`,
    `conduit_kv_cache_usage_ratio{model_name="${MODEL_NAME}",worker="scripted:0"} 0.1`,
    `conduit_worker_resident_memory_bytes{model_name="${MODEL_NAME}",worker="scripted:0"} 123456789`,
    `conduit_num_queued_prefill_tokens{model_name="${MODEL_NAME}",worker="scripted:0"} 0`,
    `conduit_num_preemptions_total{model_name="${MODEL_NAME}",worker="scripted:0"} 2`,
    `conduit_prefix_cache_queries_total{model_name="${MODEL_NAME}",worker="scripted:0"} 64`,
    `conduit_prefix_cache_hits_total{model_name="${MODEL_NAME}",worker="scripted:0"} 32`,
    `conduit_engine_step_duration_seconds_bucket{le="0.005",model_name="${MODEL_NAME}",worker="scripted:0"} 2`,
    `conduit_engine_scheduling_duration_seconds_bucket{le="0.00025",model_name="${MODEL_NAME}",worker="scripted:0"} 2`,
    `conduit_engine_tokens_per_step_bucket{le="4",model_name="${MODEL_NAME}",worker="scripted:0"} 1`,
    `conduit_engine_tokens_per_step_bucket{le="64",model_name="${MODEL_NAME}",worker="scripted:0"} 2`,
  ]) {
    assert.ok(text.includes(family), `metrics lack ${family}`);
  }
});
