// Per model version statistics in the shape of Triton's statistics extension (durations as
// {count, ns}); the metrics server and /v2/models/stats read them.

export interface Duration { count: number; ns: number }

export type FailureReason = 'REJECTED' | 'CANCELED' | 'BACKEND' | 'OTHER';
export const FAILURE_REASONS: readonly FailureReason[] = ['REJECTED', 'CANCELED', 'BACKEND', 'OTHER'];

export interface ModelStatistics {
  name: string;
  version: string;
  /** ms since the epoch of the last inference, 0 if none. */
  last_inference: number;
  inference_count: number;
  execution_count: number;
  inference_stats: {
    success: Duration; fail: Duration; queue: Duration;
    compute_input: Duration; compute_infer: Duration; compute_output: Duration;
    cache_hit: Duration; cache_miss: Duration;
  };
  batch_stats: Array<{ batch_size: number; compute_input: Duration; compute_infer: Duration; compute_output: Duration }>;
}

const zero = (): Duration => ({ count: 0, ns: 0 });

export class StatsRecorder {
  readonly stats: ModelStatistics;
  readonly failuresByReason: Record<FailureReason, number> = { REJECTED: 0, CANCELED: 0, BACKEND: 0, OTHER: 0 };
  numPending = 0;
  private readonly batchStats = new Map<number, ModelStatistics['batch_stats'][number]>();

  constructor(name: string, version: number) {
    this.stats = {
      name, version: String(version), last_inference: 0, inference_count: 0, execution_count: 0,
      inference_stats: {
        success: zero(), fail: zero(), queue: zero(), compute_input: zero(), compute_infer: zero(), compute_output: zero(),
        cache_hit: zero(), cache_miss: zero(),
      },
      batch_stats: [],
    };
  }

  recordSuccess(requestNs: number, queueNs: number, computeInputNs: number, computeInferNs: number, computeOutputNs: number) {
    const s = this.stats.inference_stats;
    s.success.count++; s.success.ns += requestNs;
    s.queue.count++; s.queue.ns += queueNs;
    s.compute_input.count++; s.compute_input.ns += computeInputNs;
    s.compute_infer.count++; s.compute_infer.ns += computeInferNs;
    s.compute_output.count++; s.compute_output.ns += computeOutputNs;
    this.stats.last_inference = Date.now();
  }

  /** A request answered from the response cache: a success that neither queued nor executed. */
  recordCacheHit(requestNs: number, lookupNs: number) {
    const s = this.stats.inference_stats;
    s.success.count++; s.success.ns += requestNs;
    s.cache_hit.count++; s.cache_hit.ns += lookupNs;
    this.stats.last_inference = Date.now();
  }

  /** A cache lookup that missed: `ns` covers the lookup and the insertion of the new result. */
  recordCacheMiss(ns: number) {
    this.stats.inference_stats.cache_miss.count++;
    this.stats.inference_stats.cache_miss.ns += ns;
  }

  recordFailure(requestNs: number, reason: FailureReason) {
    this.stats.inference_stats.fail.count++;
    this.stats.inference_stats.fail.ns += requestNs;
    this.failuresByReason[reason]++;
  }

  recordExecution(batchSize: number, computeInputNs: number, computeInferNs: number, computeOutputNs: number) {
    this.stats.inference_count += batchSize;
    this.stats.execution_count++;
    let entry = this.batchStats.get(batchSize);
    if (entry === undefined) {
      entry = { batch_size: batchSize, compute_input: zero(), compute_infer: zero(), compute_output: zero() };
      this.batchStats.set(batchSize, entry);
      this.stats.batch_stats.push(entry);
      this.stats.batch_stats.sort((a, b) => a.batch_size - b.batch_size);
    }
    entry.compute_input.count++; entry.compute_input.ns += computeInputNs;
    entry.compute_infer.count++; entry.compute_infer.ns += computeInferNs;
    entry.compute_output.count++; entry.compute_output.ns += computeOutputNs;
  }
}
