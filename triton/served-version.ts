// One loaded version of a model: its instances behind a batcher, or an ensemble's DAG, with
// request validation and statistics. Requests in flight hold the version they started on, so a
// reload or unload lets them finish there.
import { readLabels } from './classification.ts';
import type { InstanceSpec, ModelInstance, TensorMap } from './backend.ts';
import { Batcher, type Scheduler, type SequenceFlags } from './batcher.ts';
import { silentLogger, type Logger } from '../engine/log.ts';
import { SequenceBatcher } from './sequence-batcher.ts';
import { runEnsemble, type StepRunner } from './ensemble.ts';
import { ClassicError } from './errors.ts';
import type { ModelConfig } from './model-config.ts';
import { createOnnxInstance } from './onnx-backend.ts';
import { createScriptInstance } from './script-backend.ts';
import type { ResponseCache } from './response-cache.ts';
import { StatsRecorder, type FailureReason } from './stats.ts';
import { traceNs, type TraceTimestamp } from './trace.ts';
import { validateRequest } from './validate.ts';
import { warmUp } from './warmup.ts';

export interface InferRequest {
  inputs: TensorMap;
  /** Output names to return; null for all. */
  requestedOutputs: string[] | null;
  /** 0 = the model's default priority level; 1 is highest. */
  priority: number;
  /** Queue timeout in µs (Triton's `timeout` parameter); 0 for the model's policy. */
  timeoutUs: number;
  /** Set when the request is traced: the version and its batcher push what they see. */
  timestamps?: TraceTimestamp[];
  /** Triton's sequence_id / sequence_start / sequence_end; a model without sequence_batching ignores them. */
  sequence?: SequenceFlags;
}

export interface ServedVersion {
  readonly config: ModelConfig;
  readonly version: number;
  readonly stats: StatsRecorder;
  /** Each output's labels (its label_filename), for the classification extension. */
  readonly labels: ReadonlyMap<string, readonly string[]>;
  infer(request: InferRequest): Promise<TensorMap>;
  /** Resolves when nothing is queued or running. */
  drain(): Promise<void>;
  close(): Promise<void>;
}

function failureReason(err: unknown): FailureReason {
  if (!(err instanceof ClassicError)) return 'OTHER';
  if (err.status === 'UNAVAILABLE') return 'REJECTED';
  if (err.status === 'INTERNAL') return 'BACKEND';
  return 'OTHER';
}

function pickOutputs(outputs: TensorMap, requested: readonly string[] | null): TensorMap {
  if (requested === null) return outputs;
  const picked: TensorMap = {};
  for (const name of requested) picked[name] = outputs[name];
  return picked;
}

class BatchedVersion implements ServedVersion {
  readonly stats: StatsRecorder;
  private readonly batcher: Scheduler;

  constructor(
    readonly config: ModelConfig, readonly version: number, private readonly instances: ModelInstance[],
    /** Set when the model enables response_cache and the server has a cache. */
    private readonly cache: ResponseCache | null,
    readonly labels: ReadonlyMap<string, readonly string[]>,
    modelDir: string, log: Logger,
  ) {
    this.stats = new StatsRecorder(config.name, version);
    const observer = {
      onExecution: (batchSize: number, t: { computeInputNs: number; computeInferNs: number; computeOutputNs: number }) => this.stats.recordExecution(batchSize, t.computeInputNs, t.computeInferNs, t.computeOutputNs),
      onPendingChange: (numPending: number) => { this.stats.numPending = numPending; },
    };
    this.batcher = config.sequence_batching !== undefined
      ? new SequenceBatcher(config, instances, modelDir, observer, log)
      : new Batcher(config, instances, observer);
  }

  async infer(request: InferRequest): Promise<TensorMap> {
    const startMs = performance.now();
    request.timestamps?.push({ name: 'REQUEST_START', ns: traceNs(startMs) });
    try {
      const batchSize = validateRequest(this.config, request.inputs, request.requestedOutputs);
      let cacheKey: string | null = null;
      let lookupNs = 0;
      if (this.cache !== null) {
        cacheKey = this.cache.keyOf(this.config.name, this.version, request.inputs, request.requestedOutputs);
        const cached = this.cache.lookup(cacheKey);
        const nowMs = performance.now();
        lookupNs = Math.round((nowMs - startMs) * 1e6);
        if (cached !== undefined) {
          this.stats.recordCacheHit(lookupNs, lookupNs);
          return cached;
        }
      }
      const { outputs, timings } = await this.batcher.enqueue({
        inputs: request.inputs, batchSize, priority: request.priority, timeoutUs: request.timeoutUs, timestamps: request.timestamps, sequence: request.sequence,
      });
      for (const output of this.config.output) {
        if (outputs[output.name] === undefined) throw new ClassicError('INTERNAL', `model '${this.config.name}' did not produce output '${output.name}'`);
      }
      const picked = pickOutputs(outputs, request.requestedOutputs);
      if (cacheKey !== null) {
        const insertStartMs = performance.now();
        this.cache!.insert(cacheKey, picked, this);
        this.stats.recordCacheMiss(lookupNs + Math.round((performance.now() - insertStartMs) * 1e6));
      }
      this.stats.recordSuccess(Math.round((performance.now() - startMs) * 1e6), timings.queueNs, timings.computeInputNs, timings.computeInferNs, timings.computeOutputNs);
      return picked;
    } catch (err) {
      this.stats.recordFailure(Math.round((performance.now() - startMs) * 1e6), failureReason(err));
      throw err;
    } finally {
      request.timestamps?.push({ name: 'REQUEST_END', ns: traceNs(performance.now()) });
    }
  }

  drain(): Promise<void> {
    return this.batcher.drain();
  }

  async close(): Promise<void> {
    await this.batcher.drain();
    this.batcher.close();
    this.cache?.evictOwner(this);
    await Promise.all(this.instances.map((instance) => instance.close()));
  }
}

class EnsembleVersion implements ServedVersion {
  readonly stats: StatsRecorder;
  private numRunning = 0;
  private idleWaiters: Array<() => void> = [];

  constructor(
    readonly config: ModelConfig, readonly version: number, private readonly runStep: StepRunner, readonly labels: ReadonlyMap<string, readonly string[]>,
  ) {
    this.stats = new StatsRecorder(config.name, version);
  }

  async infer(request: InferRequest): Promise<TensorMap> {
    const startMs = performance.now();
    // An ensemble's trace has its own start and end; its steps are requests to their own models.
    request.timestamps?.push({ name: 'REQUEST_START', ns: traceNs(startMs) });
    this.numRunning++;
    try {
      const batchSize = validateRequest(this.config, request.inputs, request.requestedOutputs);
      const outputs = await runEnsemble(this.config, request, this.runStep);
      const requestNs = Math.round((performance.now() - startMs) * 1e6);
      // An ensemble's execution is its whole DAG, once per request; its steps count on their own models.
      this.stats.recordExecution(batchSize, 0, requestNs, 0);
      this.stats.recordSuccess(requestNs, 0, 0, requestNs, 0);
      return pickOutputs(outputs, request.requestedOutputs);
    } catch (err) {
      this.stats.recordFailure(Math.round((performance.now() - startMs) * 1e6), failureReason(err));
      throw err;
    } finally {
      request.timestamps?.push({ name: 'REQUEST_END', ns: traceNs(performance.now()) });
      if (--this.numRunning === 0) {
        for (const resolve of this.idleWaiters.splice(0)) resolve();
      }
    }
  }

  drain(): Promise<void> {
    if (this.numRunning === 0) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  close(): Promise<void> {
    return this.drain();
  }
}

/**
 * `cache`: the server's response cache, or null when it has none. An abort (the repository
 * closing) stops the load before its next instance; the ones made are closed.
 */
export async function loadVersion(
  spec: Omit<InstanceSpec, 'instanceIndex'>, runStep: StepRunner, cache: ResponseCache | null, signal?: AbortSignal, log: Logger = silentLogger,
): Promise<ServedVersion> {
  const { config } = spec;
  const labels = readLabels(config, spec.modelDir);
  if (config.backend === 'ensemble') return new EnsembleVersion(config, spec.version, runStep, labels);
  const create = config.backend === 'onnxruntime' ? createOnnxInstance : createScriptInstance;
  const numInstances = config.instance_group.reduce((sum, group) => sum + group.count, 0);
  const instances: ModelInstance[] = [];
  try {
    const checkAborted = () => {
      if (signal?.aborted) throw new ClassicError('UNAVAILABLE', `model '${config.name}': the load was stopped (the server is shutting down)`);
    };
    for (let i = 0; i < numInstances; i++) {
      checkAborted();
      instances.push(await create({ ...spec, instanceIndex: i }));
    }
    checkAborted();
    // Not serving (not READY) until every instance has run the samples.
    await warmUp(config, spec.modelDir, instances);
    return new BatchedVersion(config, spec.version, instances, config.response_cache?.enable === true ? cache : null, labels, spec.modelDir, log);
  } catch (err) {
    await Promise.all(instances.map((instance) => instance.close()));
    throw err;
  }
}
