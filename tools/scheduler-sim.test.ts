// The scheduler simulation's clock, checked on loads whose timeline can be worked out by hand.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { prefillLimitsFor } from '../engine/scheduler.ts';
import { simulateClosedLoop } from './scheduler-sim.ts';

const cost = { fixedMs: 10, msPerToken: 1 };
const load = { roundTripMs: 3, sharedPrefixTokens: 0, ownPromptTokens: 100, outputTokens: 4 };

test('one client: a prompt\'s step, then a decode step per token, and the next request after the round trip', async () => {
  const result = await simulateClosedLoop(prefillLimitsFor('interactivity', 8, 512), cost, { ...load, numClients: 1, numRequests: 2 });
  // Sent 3 ms before it reaches the worker; its step: 10 + 100 ms.
  assert.deepEqual(result.ttftsMs, [113, 113]);
  assert.deepEqual(result.itlsMs, [11, 11, 11, 11, 11, 11]);
  // 8 tokens in 2 × (3 + 110 + 3 × 11) ms.
  assert.equal(result.outputTokensPerS, (1000 * 8) / (2 * (3 + 110 + 33)));
});

test('two clients at once: one long prompt a step gives the first its token a prompt sooner than packing both', async () => {
  const interactivity = await simulateClosedLoop(prefillLimitsFor('interactivity', 8, 512), cost, { ...load, numClients: 2, numRequests: 2 });
  const throughput = await simulateClosedLoop(prefillLimitsFor('throughput', 8, 512), cost, { ...load, numClients: 2, numRequests: 2 });
  // One at a time: 3 + 110, then b whole beside a's decode (no other prompt waits, so no
  // chunks): 3 + 110 + (10 + 1 + 100); packed: both 3 + (10 + 200).
  assert.deepEqual(interactivity.ttftsMs, [113, 224]);
  assert.deepEqual(throughput.ttftsMs, [213, 213]);
});

test('a request that reaches the worker during a step waits for it, and its TTFT counts the wait', async () => {
  const result = await simulateClosedLoop(prefillLimitsFor('interactivity', 8, 512), cost, { ...load, numClients: 2, numRequests: 3 });
  // a: prompt 3-113, decodes end at 224, 236, 248 (its last). b: prompt whole in 113-224,
  // decodes at 236, 248, 259 (alone: 11). a's next request reaches the worker at 251, during
  // 248-259; then its prompt alone (259-369): TTFT 369 - 248.
  assert.deepEqual(result.ttftsMs, [113, 224, 121]);
});
