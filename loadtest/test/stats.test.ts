import { test } from 'node:test';
import assert from 'node:assert/strict';
import { median, percentileCurve, percentileOfSorted, summarize } from '../stats.ts';

test('percentiles follow numpy linear interpolation exactly', () => {
  // numpy.percentile([1, 2, 3, 4], [50, 90, 95, 99]) = [2.5, 3.7, 3.85, 3.97]
  const values = [4, 1, 3, 2];
  const summary = summarize(values);
  assert.equal(summary.p50, 2.5);
  assert.ok(Math.abs(summary.p90 - 3.7) < 1e-12);
  assert.ok(Math.abs(summary.p95 - 3.85) < 1e-12);
  assert.ok(Math.abs(summary.p99 - 3.97) < 1e-12);
  assert.equal(summary.mean, 2.5);
  assert.equal(summary.min, 1);
  assert.equal(summary.max, 4);
  // numpy.percentile([10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 1000], 90) = 100.0, p99 = 910.0
  const skewed = Float64Array.from([10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 1000]);
  assert.equal(percentileOfSorted(skewed, 90), 100);
  assert.ok(Math.abs(percentileOfSorted(skewed, 99) - 910) < 1e-9);
});

test('a single sample is every percentile; no samples give NaN (null in JSON)', () => {
  const one = summarize([7]);
  assert.deepEqual([one.p50, one.p90, one.p99, one.mean], [7, 7, 7, 7]);
  const none = summarize([]);
  assert.equal(none.count, 0);
  assert.ok(Number.isNaN(none.p50));
  assert.equal(JSON.parse(JSON.stringify(none)).p99, null);
});

test('the percentile curve runs p0..p100', () => {
  const curve = percentileCurve([0, 100]);
  assert.equal(curve.length, 101);
  assert.equal(curve[0], 0);
  assert.equal(curve[37], 37);
  assert.equal(curve[100], 100);
  assert.deepEqual(percentileCurve([]), []);
});

test('median: the middle value, the mean of the middle two for an even count; the input is left as it was', () => {
  const values = [4, 1, 2, 3];
  assert.equal(median([3, 1, 2]), 2);
  assert.equal(median(values), 2.5);
  assert.deepEqual(values, [4, 1, 2, 3]);
});
