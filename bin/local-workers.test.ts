import assert from 'node:assert/strict';
import { test } from 'node:test';
import { RestartBackoff } from './local-workers.ts';

test('restart delays double while a worker keeps dying young, up to the cap', () => {
  const backoff = new RestartBackoff(500, 30_000, 60_000);
  assert.deepEqual([1, 2, 3, 4, 5, 6, 7, 8].map(() => backoff.nextDelayMs(1_000)), [500, 1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000]);
});

test('a worker that ran well before it died starts the backoff over', () => {
  const backoff = new RestartBackoff(500, 30_000, 60_000);
  for (let i = 0; i < 6; i++) backoff.nextDelayMs(100);
  assert.equal(backoff.nextDelayMs(60_000), 500, 'healthy for a minute: the first delay again');
  assert.equal(backoff.nextDelayMs(100), 1_000, 'then doubling from there');
  assert.equal(backoff.nextDelayMs(59_999), 2_000, 'just short of healthy still counts as a quick death');
});
