// Aggregates request records into the reported metrics, defined as genai-perf defines them:
//   TTFT  = request start -> first chunk carrying generated text
//   ITL   = (e2e - TTFT) / (output tokens - 1), per request with at least two output tokens
//   TPOT  = e2e / output tokens, per request: time per output token as the user waits for it
//   chunk gaps = time between consecutive text-carrying chunks, over all requests
//   throughputs = totals / (last response end - first request start)
// Only successful requests contribute latencies; failures are counted by type.

import { e2eMs, type RequestRecord, ttftMs } from './request-record.ts';
import { type Summary, percentileCurve, summarize } from './stats.ts';

export interface GoodputTargets {
  ttftMs?: number;
  itlMs?: number;
  e2eMs?: number;
}

export type OfferedLoad =
  | { kind: 'rate'; requests_per_s: number }
  | { kind: 'concurrency'; clients: number }
  | { kind: 'trace' }
  /** The pooled metrics of a sweep over several load points. */
  | { kind: 'sweep'; num_points: number };

export interface ErrorCounts {
  total: number;
  by_type: Record<string, number>;
  /** The first message seen for each type. */
  examples: Record<string, string>;
}

export interface Timeline {
  /** Seconds from the run's start (before its first load point) to the first bucket's start. */
  start_s: number;
  bucket_s: number;
  requests_completed: number[];
  output_tokens: number[];
}

export interface LoadPointMetrics {
  offered_load: OfferedLoad;
  duration_s: number;
  num_requests: number;
  num_succeeded: number;
  ttft_ms: Summary;
  itl_ms: Summary;
  tpot_ms: Summary;
  e2e_ms: Summary;
  chunk_gap_ms: Summary;
  input_tokens: Summary;
  output_tokens: Summary;
  /** Open loop: how late requests left against their schedule; large values mean a saturated client. */
  send_lag_ms: Summary;
  request_throughput: number;
  output_token_throughput: number;
  input_token_throughput: number;
  goodput: { targets: GoodputTargets; request_throughput: number; fraction: number } | null;
  /** Token-weighted: cached prompt tokens / prompt tokens, over requests whose usage reports both. */
  prefix_cache_hit_rate: number | null;
  output_tokens_source: Record<string, number>;
  errors: ErrorCounts;
  timeline: Timeline;
  /** 101 percentiles (p0..p100) of each latency, to redraw distributions. */
  curves: { ttft_ms: number[]; itl_ms: number[]; tpot_ms: number[]; e2e_ms: number[]; chunk_gap_ms: number[] };
}

export function computeMetrics(
  records: readonly RequestRecord[],
  offeredLoad: OfferedLoad,
  goodputTargets: GoodputTargets | null,
): LoadPointMetrics {
  const ttfts: number[] = [];
  const itls: number[] = [];
  const tpots: number[] = [];
  const e2es: number[] = [];
  const chunkGaps: number[] = [];
  const inputTokens: number[] = [];
  const outputTokens: number[] = [];
  const sendLags: number[] = [];
  const outputSources: Record<string, number> = {};
  const errors: ErrorCounts = { total: 0, by_type: {}, examples: {} };
  let firstStartMs = Infinity;
  let lastEndMs = -Infinity;
  let numGood = 0;
  let numCachedTokens = 0;
  let numCacheReportedPromptTokens = 0;
  let sawCacheReport = false;
  for (const record of records) {
    firstStartMs = Math.min(firstStartMs, record.startMs);
    lastEndMs = Math.max(lastEndMs, record.endMs);
    if (record.scheduledMs !== null) sendLags.push(record.startMs - record.scheduledMs);
    if (record.errorType !== null) {
      errors.total++;
      errors.by_type[record.errorType] = (errors.by_type[record.errorType] ?? 0) + 1;
      errors.examples[record.errorType] ??= record.errorMessage ?? '';
      continue;
    }
    const e2e = e2eMs(record);
    const ttft = ttftMs(record);
    const numOutput = record.numOutputTokens ?? record.chunkTimesMs.length;
    e2es.push(e2e);
    outputTokens.push(numOutput);
    if (record.outputTokensSource) outputSources[record.outputTokensSource] = (outputSources[record.outputTokensSource] ?? 0) + 1;
    if (record.usage?.promptTokens != null) {
      inputTokens.push(record.usage.promptTokens);
      if (record.usage.cachedPromptTokens != null) {
        sawCacheReport = true;
        numCachedTokens += record.usage.cachedPromptTokens;
        numCacheReportedPromptTokens += record.usage.promptTokens;
      }
    }
    if (numOutput > 0) tpots.push(e2e / numOutput);
    let itl: number | null = null;
    if (ttft !== null) {
      ttfts.push(ttft);
      if (numOutput > 1) {
        itl = (e2e - ttft) / (numOutput - 1);
        itls.push(itl);
      }
    }
    const times = record.chunkTimesMs;
    for (let i = 1; i < times.length; i++) chunkGaps.push(times[i] - times[i - 1]);
    if (goodputTargets && meetsTargets(goodputTargets, ttft, itl, e2e)) numGood++;
  }
  const durationS = records.length === 0 ? 0 : (lastEndMs - firstStartMs) / 1000;
  const perSecond = (count: number) => (durationS > 0 ? count / durationS : 0);
  return {
    offered_load: offeredLoad,
    duration_s: durationS,
    num_requests: records.length,
    num_succeeded: e2es.length,
    ttft_ms: summarize(ttfts),
    itl_ms: summarize(itls),
    tpot_ms: summarize(tpots),
    e2e_ms: summarize(e2es),
    chunk_gap_ms: summarize(chunkGaps),
    input_tokens: summarize(inputTokens),
    output_tokens: summarize(outputTokens),
    send_lag_ms: summarize(sendLags),
    request_throughput: perSecond(e2es.length),
    output_token_throughput: perSecond(sum(outputTokens)),
    input_token_throughput: perSecond(sum(inputTokens)),
    goodput: goodputTargets
      ? { targets: goodputTargets, request_throughput: perSecond(numGood), fraction: records.length ? numGood / records.length : 0 }
      : null,
    prefix_cache_hit_rate: sawCacheReport && numCacheReportedPromptTokens > 0 ? numCachedTokens / numCacheReportedPromptTokens : null,
    output_tokens_source: outputSources,
    errors,
    timeline: buildTimeline(records, firstStartMs, durationS),
    curves: {
      ttft_ms: percentileCurve(ttfts),
      itl_ms: percentileCurve(itls),
      tpot_ms: percentileCurve(tpots),
      e2e_ms: percentileCurve(e2es),
      chunk_gap_ms: percentileCurve(chunkGaps),
    },
  };
}

/** A request missing a measurement its target needs does not count as good. */
function meetsTargets(targets: GoodputTargets, ttft: number | null, itl: number | null, e2e: number): boolean {
  if (targets.ttftMs !== undefined && (ttft === null || ttft > targets.ttftMs)) return false;
  if (targets.itlMs !== undefined && itl !== null && itl > targets.itlMs) return false;
  if (targets.e2eMs !== undefined && e2e > targets.e2eMs) return false;
  return true;
}

function sum(values: readonly number[]): number {
  let total = 0;
  for (const value of values) total += value;
  return total;
}

const MAX_TIMELINE_BUCKETS = 120;

/**
 * Requests completed and output tokens streamed per time bucket from originMs (the first
 * request's start, on the run's clock); a request's tokens are spread evenly over its chunks.
 */
function buildTimeline(records: readonly RequestRecord[], originMs: number, durationS: number): Timeline {
  const bucketS = Math.max(1, Math.ceil(durationS / MAX_TIMELINE_BUCKETS));
  const numBuckets = Math.max(1, Math.ceil(durationS / bucketS));
  const requestsCompleted = new Array<number>(numBuckets).fill(0);
  const outputTokens = new Array<number>(numBuckets).fill(0);
  const bucketOf = (timeMs: number) => Math.min(numBuckets - 1, Math.floor((timeMs - originMs) / 1000 / bucketS));
  for (const record of records) {
    if (record.errorType !== null) continue;
    requestsCompleted[bucketOf(record.endMs)]++;
    const times = record.chunkTimesMs;
    if (times.length === 0) continue;
    const tokensPerChunk = (record.numOutputTokens ?? times.length) / times.length;
    for (const time of times) outputTokens[bucketOf(time)] += tokensPerChunk;
  }
  return { start_s: Number.isFinite(originMs) ? originMs / 1000 : 0, bucket_s: bucketS, requests_completed: requestsCompleted, output_tokens: outputTokens };
}
