// Triton's per-model Prometheus metrics (server docs/user_guide/metrics.md) for the model
// repository, read from each loaded version's statistics at scrape time: nothing is counted
// twice and nothing runs per request. Labels `model` and `version`, as Triton's.
import { Counter, Gauge, type Registry } from 'prom-client';
import { FAILURE_REASONS, type ModelRepository, type ServedVersion } from '../../triton/index.ts';

type Read = (served: ServedVersion) => number;

export function registerTritonMetrics(registry: Registry, repository: ModelRepository): void {
  const labelsOf = (served: ServedVersion) => ({ model: served.config.name, version: String(served.version) });
  const counter = (name: string, help: string, read: Read) => new Counter({
    name, help, labelNames: ['model', 'version'], registers: [registry],
    collect() {
      this.reset();
      for (const served of repository.loadedVersions()) this.inc(labelsOf(served), read(served));
    },
  });
  const stats = (served: ServedVersion) => served.stats.stats;
  const us = (ns: number) => Math.round(ns / 1000);

  counter('nv_inference_request_success', 'Number of successful inference requests, all batch sizes', (s) => stats(s).inference_stats.success.count);
  new Counter({
    name: 'nv_inference_request_failure',
    help: 'Number of failed inference requests, all batch sizes',
    labelNames: ['model', 'version', 'reason'],
    registers: [registry],
    collect() {
      this.reset();
      for (const served of repository.loadedVersions()) {
        for (const reason of FAILURE_REASONS) this.inc({ ...labelsOf(served), reason }, served.stats.failuresByReason[reason]);
      }
    },
  });
  counter('nv_inference_count', 'Number of inferences performed (does not include cached requests)', (s) => stats(s).inference_count);
  counter('nv_inference_exec_count', 'Number of model executions performed (does not include cached requests)', (s) => stats(s).execution_count);
  counter('nv_inference_request_duration_us', 'Cumulative inference request duration in microseconds', (s) => us(stats(s).inference_stats.success.ns));
  counter('nv_inference_queue_duration_us', 'Cumulative inference queuing duration in microseconds', (s) => us(stats(s).inference_stats.queue.ns));
  counter('nv_inference_compute_input_duration_us', 'Cumulative compute input duration in microseconds', (s) => us(stats(s).inference_stats.compute_input.ns));
  counter('nv_inference_compute_infer_duration_us', 'Cumulative compute inference duration in microseconds', (s) => us(stats(s).inference_stats.compute_infer.ns));
  counter('nv_inference_compute_output_duration_us', 'Cumulative inference compute output duration in microseconds', (s) => us(stats(s).inference_stats.compute_output.ns));
  // The response cache, per model (Triton's names; durations are the lookups, and for misses the insertions too).
  counter('nv_cache_num_hits_per_model', 'Number of cache hits per model', (s) => stats(s).inference_stats.cache_hit.count);
  counter('nv_cache_num_misses_per_model', 'Number of cache misses per model', (s) => stats(s).inference_stats.cache_miss.count);
  counter('nv_cache_hit_duration_per_model', 'Total cache hit duration per model, in microseconds', (s) => us(stats(s).inference_stats.cache_hit.ns));
  counter('nv_cache_miss_duration_per_model', 'Total cache miss (insertion) duration per model, in microseconds', (s) => us(stats(s).inference_stats.cache_miss.ns));
  new Gauge({
    name: 'nv_inference_pending_request_count',
    help: 'Instantaneous number of pending requests awaiting execution per-model.',
    labelNames: ['model', 'version'],
    registers: [registry],
    collect() {
      this.reset();
      for (const served of repository.loadedVersions()) this.set(labelsOf(served), served.stats.numPending);
    },
  });
}
