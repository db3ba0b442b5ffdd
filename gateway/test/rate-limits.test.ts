// The limits' plain logic on an injected clock: exact token-bucket refills and waits, OpenAI's
// duration format, and an admission settled with the actual usage however the two arrive.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Admission, formatDuration, KeyQuota, RateLimiter, TokenBucket } from '../rate-limits.ts';

test("durations read as OpenAI's x-ratelimit-reset-* headers write them", () => {
  assert.equal(formatDuration(0), '0s');
  assert.equal(formatDuration(0.2), '1ms');
  assert.equal(formatDuration(20), '20ms');
  assert.equal(formatDuration(1000), '1s');
  assert.equal(formatDuration(1500), '1.5s');
  assert.equal(formatDuration(60_000), '1m0s');
  assert.equal(formatDuration(366_000), '6m6s');
  assert.equal(formatDuration(3_723_000), '1h2m3s');
});

test('a bucket refills evenly and exactly, never above its capacity, and waits are exact', () => {
  const bucket = new TokenBucket(3, 0);
  assert.equal(bucket.levelAt(0), 3);
  bucket.take(3, 0);
  assert.equal(bucket.msUntilAvailable(1, 0), 20_000);
  assert.equal(bucket.msUntilFull(0), 60_000);
  assert.equal(bucket.levelAt(19_999), 0.99995);
  assert.equal(bucket.msUntilAvailable(1, 19_999), 1);
  assert.equal(bucket.msUntilAvailable(1, 20_000), 0);
  assert.equal(bucket.levelAt(10 * 60_000), 3);
  // More than the capacity: a full bucket admits it, and the debt is waited out after.
  assert.equal(bucket.msUntilAvailable(10, 10 * 60_000), 0);
  bucket.take(10, 10 * 60_000);
  assert.equal(bucket.levelAt(10 * 60_000), -7);
  assert.equal(bucket.msUntilAvailable(1, 10 * 60_000), 160_000);
});

test('an admission is charged its estimate, then exactly its usage, whichever comes first', () => {
  let nowMs = 0;
  const limiter = new RateLimiter(null, () => nowMs);
  const quota = new KeyQuota('key `t`', { tokensPerMinute: 100, maxConcurrentRequests: 2 }, 0);
  const early = limiter.admit(quota, 30) as Admission;
  assert.equal(quota.tokens!.levelAt(nowMs), 70);
  // Usage before the end (a non-streamed response finishes before it is sent): two choices, one prompt.
  early.settle(5, 3);
  early.settle(5, 4);
  early.end();
  early.end();
  assert.equal(quota.tokens!.levelAt(nowMs), 88);
  assert.equal(quota.numInFlight, 0);

  const late = limiter.admit(quota, 50) as Admission;
  late.end();
  assert.equal(quota.tokens!.levelAt(nowMs), 88);
  late.settle(10, 2);
  assert.equal(quota.tokens!.levelAt(nowMs), 76);

  const held = [limiter.admit(quota, 1), limiter.admit(quota, 1)];
  const refused = limiter.admit(quota, 1);
  assert.ok('code' in refused && refused.code === 'rate_limit_requests');
  assert.equal(refused.retryAfterMs, 1000);
  for (const admission of held) (admission as Admission).end();
  assert.ok(limiter.admit(quota, 1) instanceof Admission);
});
