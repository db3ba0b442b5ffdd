// Summary statistics over per-request samples. Percentiles use numpy's default "linear"
// definition (what genai-perf reports): for sorted x of length n, the q-th percentile sits
// at rank h = (n - 1) * q / 100 and interpolates x[floor(h)] .. x[floor(h) + 1].

export interface Summary {
  count: number;
  mean: number;
  min: number;
  max: number;
  p50: number;
  p90: number;
  p95: number;
  p99: number;
}

export function percentileOfSorted(sortedValues: ArrayLike<number>, q: number): number {
  const n = sortedValues.length;
  if (n === 0) return NaN;
  const rank = ((n - 1) * q) / 100;
  const lower = Math.floor(rank);
  const upper = Math.min(lower + 1, n - 1);
  const weight = rank - lower;
  return sortedValues[lower] + (sortedValues[upper] - sortedValues[lower]) * weight;
}

function sortedCopy(values: ArrayLike<number>): Float64Array {
  return Float64Array.from(values).sort();
}

/** The middle value, the mean of the middle two for an even count (the 50th percentile). */
export function median(values: ArrayLike<number>): number {
  return percentileOfSorted(sortedCopy(values), 50);
}

/** Summary of the values; an empty input gives count 0 and null-valued statistics in JSON. */
export function summarize(values: ArrayLike<number>): Summary {
  const sorted = sortedCopy(values);
  let sum = 0;
  for (let i = 0; i < sorted.length; i++) sum += sorted[i];
  const n = sorted.length;
  return {
    count: n,
    mean: n === 0 ? NaN : sum / n,
    min: n === 0 ? NaN : sorted[0],
    max: n === 0 ? NaN : sorted[n - 1],
    p50: percentileOfSorted(sorted, 50),
    p90: percentileOfSorted(sorted, 90),
    p95: percentileOfSorted(sorted, 95),
    p99: percentileOfSorted(sorted, 99),
  };
}

/** The 0th..100th percentiles (101 points): enough to redraw a CDF without the raw samples. */
export function percentileCurve(values: ArrayLike<number>): number[] {
  const sorted = sortedCopy(values);
  if (sorted.length === 0) return [];
  const curve = new Array<number>(101);
  for (let q = 0; q <= 100; q++) curve[q] = percentileOfSorted(sorted, q);
  return curve;
}
