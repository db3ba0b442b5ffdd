// Metric arithmetic: exact on hand-built records, then end to end against a real local SSE
// server with scripted chunk timings.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { computeMetrics } from '../metrics.ts';
import { newRequestRecord, type RequestRecord } from '../request-record.ts';
import { runLoadtest } from '../run.ts';
import { startScriptedServer } from '../scripted-sse-server.ts';

function record(fields: Partial<RequestRecord> & Pick<RequestRecord, 'startMs' | 'endMs'>): RequestRecord {
  return newRequestRecord({ sessionId: 's', turnIndex: 0, scheduledMs: null, ...fields });
}

const close = (actual: number, expected: number) => assert.ok(Math.abs(actual - expected) < 1e-9, `expected ${expected}, got ${actual}`);

test('metrics from hand-computed records', () => {
  const usage = (promptTokens: number, cachedPromptTokens: number | null) => ({ promptTokens, completionTokens: null, cachedPromptTokens });
  const records = [
    // TTFT 100, e2e 160, ITL (160 - 100) / 3 = 20, TPOT 40, gaps 10 20 30
    record({ startMs: 0, endMs: 160, chunkTimesMs: [100, 110, 130, 160], numOutputTokens: 4, usage: usage(10, 5), scheduledMs: 0 }),
    // TTFT 200, e2e 300, ITL 100, TPOT 150, gap 50
    record({ startMs: 50, endMs: 350, chunkTimesMs: [250, 300], numOutputTokens: 2, usage: usage(20, 0), scheduledMs: 45 }),
    // TTFT 30, e2e 40, no ITL (one token), TPOT 40; its usage reports no cached tokens
    record({ startMs: 100, endMs: 140, chunkTimesMs: [130], numOutputTokens: 1, usage: usage(10, null) }),
    record({ startMs: 120, endMs: 125, errorType: 'http_503', errorMessage: 'busy' }),
  ];
  const metrics = computeMetrics(records, { kind: 'concurrency', clients: 4 }, { ttftMs: 150, itlMs: 50 });
  assert.equal(metrics.duration_s, 0.35);
  assert.equal(metrics.num_requests, 4);
  assert.equal(metrics.num_succeeded, 3);
  // ttft sorted [30, 100, 200]: p90 at rank 1.8 = 100 + 0.8 * 100
  assert.deepEqual([metrics.ttft_ms.mean, metrics.ttft_ms.p50], [110, 100]);
  close(metrics.ttft_ms.p90, 180);
  close(metrics.ttft_ms.p99, 198);
  // itl [20, 100]: p90 at rank 0.9 = 20 + 0.9 * 80
  assert.deepEqual([metrics.itl_ms.count, metrics.itl_ms.mean, metrics.itl_ms.p50], [2, 60, 60]);
  close(metrics.itl_ms.p90, 92);
  // tpot sorted [40, 40, 150]: p95 at rank 1.9 = 40 + 0.9 * 110
  close(metrics.tpot_ms.mean, 230 / 3);
  close(metrics.tpot_ms.p95, 139);
  assert.deepEqual([metrics.e2e_ms.p50, metrics.e2e_ms.max], [160, 300]);
  assert.deepEqual([metrics.chunk_gap_ms.count, metrics.chunk_gap_ms.p50], [4, 25]);
  close(metrics.request_throughput, 3 / 0.35);
  close(metrics.output_token_throughput, 7 / 0.35);
  close(metrics.input_token_throughput, 40 / 0.35);
  // Goodput: TTFT <= 150 and ITL <= 50 holds for the first and third requests.
  close(metrics.goodput!.request_throughput, 2 / 0.35);
  assert.equal(metrics.goodput!.fraction, 0.5);
  close(metrics.prefix_cache_hit_rate!, 5 / 30);
  assert.deepEqual(metrics.errors, { total: 1, by_type: { http_503: 1 }, examples: { http_503: 'busy' } });
  assert.deepEqual(metrics.timeline, { start_s: 0, bucket_s: 1, requests_completed: [3], output_tokens: [7] });
  assert.deepEqual([metrics.send_lag_ms.count, metrics.send_lag_ms.p50], [2, 2.5]);
  assert.equal(metrics.curves.ttft_ms[50], 100);
});

test("the timeline counts from the load point's first start, not from the run's origin: records over five seconds from 5 s", () => {
  const records = [
    // 4 tokens over 2 chunks (2 a chunk), both in second 0 of the timeline; done in second 0.
    record({ startMs: 5000, endMs: 5400, chunkTimesMs: [5200, 5400], numOutputTokens: 4 }),
    // 1 token a chunk: seconds 1, 1, 2; done in second 2.
    record({ startMs: 5500, endMs: 7300, chunkTimesMs: [6100, 6900, 7300], numOutputTokens: 3 }),
    // Failed: neither done nor streamed.
    record({ startMs: 7000, endMs: 7100, errorType: 'http_503', errorMessage: 'busy' }),
    // Seconds 3 and 4; done in second 4, the last (duration 4.99 s).
    record({ startMs: 6000, endMs: 9990, chunkTimesMs: [8050, 9990], numOutputTokens: 2 }),
  ];
  const { timeline, duration_s } = computeMetrics(records, { kind: 'concurrency', clients: 3 }, null);
  close(duration_s, 4.99);
  assert.deepEqual(timeline, { start_s: 5, bucket_s: 1, requests_completed: [1, 0, 1, 0, 1], output_tokens: [4, 2, 1, 1, 1] });
});

test('a timeline past 120 s widens its buckets to keep 120 at most, still from the first start', () => {
  // From 30 s to 300 s: 270 s in buckets of 3 s, 90 of them.
  const records = [
    record({ startMs: 30_000, endMs: 31_000, chunkTimesMs: [30_500], numOutputTokens: 1 }),
    record({ startMs: 40_000, endMs: 152_900, chunkTimesMs: [100_000, 152_900], numOutputTokens: 2 }),
    record({ startMs: 250_000, endMs: 300_000, chunkTimesMs: [299_999], numOutputTokens: 5 }),
  ];
  const { timeline } = computeMetrics(records, { kind: 'rate', requests_per_s: 1 }, null);
  assert.equal(timeline.start_s, 30);
  assert.equal(timeline.bucket_s, 3);
  assert.equal(timeline.requests_completed.length, 90);
  const nonZero = (values: number[]) => Object.fromEntries(values.flatMap((value, i) => (value === 0 ? [] : [[i, value]])));
  // Done at 1 s, 122.9 s and 270 s after the first start: buckets 0, 40 and the last.
  assert.deepEqual(nonZero(timeline.requests_completed), { 0: 1, 40: 1, 89: 1 });
  // Chunks at 0.5 s, 70 s, 122.9 s, 269.999 s: buckets 0, 23, 40, 89.
  assert.deepEqual(nonZero(timeline.output_tokens), { 0: 1, 23: 1, 40: 1, 89: 5 });
});

test('a server that reports no cached tokens has no hit rate, not zero', () => {
  const metrics = computeMetrics([record({ startMs: 0, endMs: 10, chunkTimesMs: [5], numOutputTokens: 1 })], { kind: 'trace' }, null);
  assert.equal(metrics.prefix_cache_hit_rate, null);
  assert.equal(metrics.goodput, null);
});

// Loopback delivery and event-loop turns between the server's write and the client's read;
// 45 ms was seen with four test suites at once on a loaded two-core machine.
const DELIVERY_SLOP_MS = 60;

test('TTFT, ITL, TPOT, e2e and chunk gaps match the scripted timings of a real SSE server', async () => {
  // First text 100 ms after the request, then three chunks 80 ms apart: wider than the slop,
  // so taking the wrong chunk for the first token or the end cannot pass.
  // The first generation is the run's warm-up (not counted), answered at once: client and
  // server share this thread, and a run's first request compiles code and opens the connection
  // the others reuse. On a loaded machine that made it 20-100 ms late where the next ones were
  // ~1 ms late.
  const server = await startScriptedServer({
    tokenizer: true,
    script: (_request, index) => ({
      chunks: [
        { delayMs: index === 0 ? 0 : 100, text: 'a' },
        { delayMs: index === 0 ? 0 : 80, text: ' b' },
        { delayMs: index === 0 ? 0 : 80, text: ' c' },
        { delayMs: index === 0 ? 0 : 80, text: ' d' },
      ],
      usage: { promptTokens: 10, completionTokens: 4, cachedTokens: 4 },
    }),
  });
  try {
    const results = await runLoadtest({
      url: server.baseUrl,
      model: 'scripted',
      endpoint: 'chat',
      workload: { kind: 'scenario', scenario: { name: 'fixed', inputTokens: 8, outputTokens: 4 }, numRequests: 5 },
      load: { kind: 'concurrency', numClientsList: [1] },
      warmupSessions: 1,
    });
    assert.equal(results.num_succeeded, 4);
    assert.equal(results.errors.total, 0);
    assert.equal(results.ttft_ms.count, 4);
    assert.equal(results.chunk_gap_ms.count, 12);
    assert.equal(results.output_tokens.mean, 4);
    assert.deepEqual(results.output_tokens_source, { usage: 4 });
    assert.equal(results.input_tokens.mean, 10);
    assert.equal(results.prefix_cache_hit_rate, 0.4);
    assert.ok(Math.abs(results.output_token_throughput - 4 * results.request_throughput) < 1e-9);

    // One client: requests ran one after another, in the server's order. The client's numbers
    // can never beat the script, nor what the server did (its timers may fire late on a busy
    // machine): on one clock, the client sends before the server receives and reads after the
    // server writes (summaries round to the microsecond). They exceed the server's only by
    // delivery: a client that stamps the wrong event is late on every request, while a loaded
    // machine that takes the core from this thread between the two sides makes one request
    // 70-120 ms late now and then (2 runs of 12 beside 3 busy loops), so one of the four may be.
    const generations = server.received.filter(({ path }) => path === '/v1/chat/completions').slice(1);
    const expected = generations.map(({ receivedMs, textWritesMs, endMs }) => ({
      ttftMs: textWritesMs[0] - receivedMs,
      e2eMs: endMs - receivedMs,
      itlMs: (endMs - textWritesMs[0]) / 3,
    }));
    const lateness = results.requests.map((request, i) => ({ ttftMs: request.ttft_ms! - expected[i].ttftMs, e2eMs: request.e2e_ms - expected[i].e2eMs }));
    results.requests.forEach((request, i) => {
      assert.ok(request.ttft_ms! >= 100 - 1, `TTFT ${request.ttft_ms} under the scripted 100 ms`);
      assert.ok(request.e2e_ms >= 340 - 1, `e2e ${request.e2e_ms} under the scripted 340 ms`);
      assert.ok(lateness[i].ttftMs >= -0.001, `TTFT ${request.ttft_ms} under the server's ${expected[i].ttftMs}`);
      assert.ok(lateness[i].e2eMs >= -0.001, `e2e ${request.e2e_ms} under the server's ${expected[i].e2eMs}`);
    });
    const numLate = lateness.filter(({ ttftMs, e2eMs }) => ttftMs > DELIVERY_SLOP_MS || e2eMs > DELIVERY_SLOP_MS).length;
    assert.ok(numLate <= 1, `later than the server by more than ${DELIVERY_SLOP_MS} ms (TTFT/e2e): ${lateness.map(({ ttftMs, e2eMs }) => `${ttftMs.toFixed(1)}/${e2eMs.toFixed(1)}`).join(', ')}`);
    const mean = (values: number[]) => values.reduce((a, b) => a + b, 0) / values.length;
    assert.ok(Math.abs(results.itl_ms.mean - mean(expected.map((e) => e.itlMs))) <= DELIVERY_SLOP_MS / 3 + 1, `ITL ${results.itl_ms.mean}`);
    // A request's ITL spans its first token to its end: a first token delivered late shortens it by
    // a third of that lateness (once, 77 ms beside another whole suite), never more.
    results.requests.forEach((request, i) => {
      const itlMs = (request.e2e_ms - request.ttft_ms!) / 3;
      assert.ok(itlMs + lateness[i].ttftMs / 3 >= 80 - 1, `ITL ${itlMs} (first token ${lateness[i].ttftMs.toFixed(1)} ms late) under the scripted 80 ms`);
    });
    // TPOT = e2e / 4, request by request; gaps follow the server's writes.
    const tpotFromSummaries = mean(results.requests.map((request) => request.e2e_ms / 4));
    assert.ok(Math.abs(results.tpot_ms.mean - tpotFromSummaries) < 0.001, 'request summaries round to the microsecond');
    const serverGaps = generations.flatMap(({ textWritesMs }) => textWritesMs.slice(1).map((t, i) => t - textWritesMs[i]));
    assert.ok(Math.abs(results.chunk_gap_ms.mean - mean(serverGaps)) <= DELIVERY_SLOP_MS / 3 + 1, `gap ${results.chunk_gap_ms.mean}`);
    assert.ok(results.chunk_gap_ms.p50 >= 80 - 1, `gap p50 ${results.chunk_gap_ms.p50} under the scripted 80 ms`);

    // Prompts were built with /tokenize: exactly 8 words (tokens) of user text each.
    for (const { body } of generations) {
      const messages = body.messages as { role: string; content: string }[];
      assert.equal(messages.at(-1)!.content.split(' ').length, 8);
      assert.equal(body.max_tokens, 4);
      assert.equal(body.ignore_eos, true);
      assert.deepEqual(body.stream_options, { include_usage: true });
    }
  } finally {
    await server.close();
  }
});

test('requestFields go into every request body, and cannot override the fields the transport sets', async () => {
  const server = await startScriptedServer({
    script: () => ({ chunks: [{ delayMs: 0, text: 'x' }], usage: { promptTokens: 4, completionTokens: 1 } }),
  });
  try {
    const results = await runLoadtest({
      url: server.baseUrl,
      model: 'scripted',
      endpoint: 'completions',
      workload: { kind: 'scenario', scenario: { name: 'fixed', inputTokens: 4, outputTokens: 1 }, numRequests: 3 },
      load: { kind: 'concurrency', numClientsList: [1] },
      requestFields: { chat_parser: '{"root":0}', stream: false, max_tokens: 99 },
    });
    assert.equal(results.num_succeeded, 3);
    const generations = server.received.filter(({ path }) => path === '/v1/completions');
    assert.equal(generations.length, 3);
    for (const { body } of generations) {
      assert.equal(body.chat_parser, '{"root":0}');
      assert.equal(body.stream, true);
      assert.equal(body.max_tokens, 1);
    }
  } finally {
    await server.close();
  }
});
