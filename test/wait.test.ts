// The test waits themselves: a poll must let the event loop run between its checks, or what it
// waits for (a timer, a socket's data, a log line written from setImmediate) can never happen.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { pollUntil, within } from './wait.ts';

test('pollUntil lets timers and I/O run between checks that do not wait themselves', async () => {
  let fired = false;
  setTimeout(() => (fired = true), 20);
  let numChecks = 0;
  // A check that resolves at once (a flag, an array filled by a stream): awaiting it alone only
  // drains microtasks, so the timer above would never fire and the poll would spin to its bound.
  await pollUntil(async () => (numChecks++, fired), 'the timer', 2_000);
  assert.ok(numChecks < 1_000, `${numChecks} checks in about 20 ms: the poll spun`);
});

test('pollUntil and within name what did not happen', async () => {
  await assert.rejects(pollUntil(async () => false, 'the impossible', 50), /^Error: the impossible: not within 50 ms$/);
  await assert.rejects(within(new Promise(() => {}), 'a promise that never settles', 20), /^Error: a promise that never settles: not within 20 ms$/);
});
