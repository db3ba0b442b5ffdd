// Metric arithmetic against a real local SSE server whose chunk timings are scripted.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { runLoadtest } from '../run.ts';
import { startScriptedServer } from '../scripted-sse-server.ts';

const SLOP_MS = 15;

function near(actual: number, expected: number, what: string): void {
  assert.ok(Math.abs(actual - expected) <= SLOP_MS, `${what}: expected ${expected} ± ${SLOP_MS} ms, got ${actual}`);
}

test('TTFT, ITL, TPOT, e2e, chunk gaps and throughputs match the scripted timings', async () => {
  // First text 60 ms after the request, then three chunks 20 ms apart: e2e 120 ms.
  const server = await startScriptedServer({
    tokenizer: true,
    script: () => ({
      chunks: [
        { delayMs: 60, text: 'a' },
        { delayMs: 20, text: ' b' },
        { delayMs: 20, text: ' c' },
        { delayMs: 20, text: ' d' },
      ],
      usage: { promptTokens: 10, completionTokens: 4, cachedTokens: 4 },
    }),
  });
  try {
    const results = await runLoadtest({
      url: server.baseUrl,
      model: 'scripted',
      endpoint: 'chat',
      workload: { kind: 'scenario', scenario: { name: 'fixed', inputTokens: 8, outputTokens: 4 }, numRequests: 4 },
      load: { kind: 'concurrency', numClientsList: [1] },
      goodput: { ttftMs: 1000, e2eMs: 1 },
    });
    assert.equal(results.num_requests, 4);
    assert.equal(results.num_succeeded, 4);
    assert.equal(results.errors.total, 0);
    near(results.ttft_ms.mean, 60, 'TTFT');
    near(results.e2e_ms.p50, 120, 'e2e');
    near(results.itl_ms.mean, 20, 'ITL = (e2e - TTFT) / 3');
    near(results.tpot_ms.mean, 30, 'TPOT = e2e / 4');
    near(results.chunk_gap_ms.p50, 20, 'chunk gap');
    assert.equal(results.chunk_gap_ms.count, 12);
    assert.equal(results.output_tokens.mean, 4);
    assert.deepEqual(results.output_tokens_source, { usage: 4 });
    assert.equal(results.input_tokens.mean, 10);
    assert.equal(results.prefix_cache_hit_rate, 0.4);
    // One client, back to back: about 1000 / 120 requests and 4 times as many tokens per second.
    assert.ok(Math.abs(results.request_throughput - 1000 / 120) < 1.5, `request throughput ${results.request_throughput}`);
    assert.ok(Math.abs(results.output_token_throughput - 4 * results.request_throughput) < 1e-9);
    assert.equal(results.goodput?.fraction, 0, 'no request ends within 1 ms');
    // Prompts were built with /tokenize: exactly 8 words (tokens) of user text each.
    for (const { body } of server.received) {
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
