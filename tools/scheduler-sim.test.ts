// The scheduler simulation's clock, checked on loads whose timeline can be worked out by hand.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { prefillLimitsFor } from '../engine/scheduler.ts';
import { simulateClosedLoop } from './scheduler-sim.ts';

const cost = { fixedMs: 10, msPerToken: 1 };
const load = { roundTripMs: 3, sharedPrefixTokens: 0, ownPromptTokens: 100, outputTokens: 4 };

test('one client: a prompt\'s step, then a decode step per token, and the next request after the round trip', () => {
  const result = simulateClosedLoop(prefillLimitsFor('interactivity', 8, 512), cost, { ...load, numClients: 1, numRequests: 2 });
  // Sent 3 ms before it reaches the worker; its step: 10 + 100 ms.
  assert.deepEqual(result.ttftsMs, [113, 113]);
  assert.deepEqual(result.itlsMs, [11, 11, 11, 11, 11, 11]);
  // 8 tokens in 2 × (3 + 110 + 3 × 11) ms.
  assert.equal(result.outputTokensPerS, (1000 * 8) / (2 * (3 + 110 + 33)));
});

test('two clients at once: one long prompt a step gives the first its token a prompt sooner than packing both', () => {
  const interactivity = simulateClosedLoop(prefillLimitsFor('interactivity', 8, 512), cost, { ...load, numClients: 2, numRequests: 2 });
  const throughput = simulateClosedLoop(prefillLimitsFor('throughput', 8, 512), cost, { ...load, numClients: 2, numRequests: 2 });
  // One at a time: 3 + 110, then beside a's decodes in chunks of 96 (512 × 3/16):
  // 3 + 110 + (10 + 1 + 96) + (10 + 1 + 4); packed: both 3 + (10 + 200).
  assert.deepEqual(interactivity.ttftsMs, [113, 235]);
  assert.deepEqual(throughput.ttftsMs, [213, 213]);
});

test('a request that reaches the worker during a step waits for it, and its TTFT counts the wait', () => {
  const result = simulateClosedLoop(prefillLimitsFor('interactivity', 8, 512), cost, { ...load, numClients: 2, numRequests: 3 });
  // a: prompt 3-113, decodes end at 220, 235, 247 (its last). b: prompt in steps 113-220 and
  // 220-235, decodes at 247, 258 (alone: 11), 365. a's next request reaches the worker at 250,
  // during 247-258; then its prompt's first chunk goes beside b's last decode (258-365) and the
  // rest alone (365-379): TTFT 379 - 247.
  assert.deepEqual(result.ttftsMs, [113, 235, 132]);
});
