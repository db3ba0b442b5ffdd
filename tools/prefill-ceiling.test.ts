// The prefill flop count and the burst's TTFT bound, checked against hand-worked values.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { burstTtftBoundMs, prefillFlopsPerToken } from './prefill-ceiling.ts';

test('flops per prompt token: the layers\' matmuls, causal attention and the LM head once per prompt', () => {
  // hidden 8, 2 heads (head dim 4), 1 KV head (kv width 4), FFN 16, vocab 10, 1 layer, 3 tokens:
  // matmuls 2 × (2·8·8 + 2·8·4 + 3·8·16) = 2 × 576; attention 4·8·(3 + 1)/2 = 64; LM head 2·10·8 / 3.
  const shape = { hiddenSize: 8, numLayers: 1, numHeads: 2, numKvHeads: 1, intermediateSize: 16, vocabSize: 10 };
  assert.equal(prefillFlopsPerToken(shape, 3), 1152 + 64 + 160 / 3);
  // The 125 M benchmark model's 256-token prompt: ~156 MFLOP per token.
  const bench = { hiddenSize: 768, numLayers: 12, numHeads: 12, numKvHeads: 4, intermediateSize: 2048, vocabSize: 32000 };
  assert.ok(Math.abs(prefillFlopsPerToken(bench, 256) / 1e6 - 155.9) < 0.05);
});

test('burst bound: the k-th of a burst waits for k prompts, later requests for one; quantiles interpolate as the loadtest\'s', () => {
  // 1,000 tokens/s, 100-token prompts: 100 ms a prompt. 4 clients, 4 requests: 100..400 ms.
  assert.equal(burstTtftBoundMs(4, 4, 100, 1000, 1), 400);
  assert.equal(burstTtftBoundMs(4, 4, 100, 1000, 0.5), 250);
  // 4 clients, 6 requests: [100, 100, 100, 200, 300, 400]; p99 at rank 4.95.
  assert.ok(Math.abs(burstTtftBoundMs(4, 6, 100, 1000, 0.99) - 395) < 1e-9);
});
