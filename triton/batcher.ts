// The scheduler in front of a model version's instances, with Triton's dynamic-batching
// semantics (core src/dynamic_batch_scheduler.cc): a batch forms only when an instance is free;
// it is scanned from the front of the queues, highest priority first; it closes at the best
// preferred size reached within the queue delay, at a shape mismatch, or at max_batch_size;
// expired requests are rejected or delayed per queue policy; a full queue answers UNAVAILABLE.
// Without dynamic_batching every request is its own batch, FIFO to any free instance.
import type { ModelInstance, TensorMap } from './backend.ts';
import { batchInputsOf } from './batch-input.ts';
import { ClassicError } from './errors.ts';
import type { ModelConfig } from './model-config.ts';
import type { CorrelationId } from './sequence-inputs.ts';
import { concatBatch, sliceBatch, type Tensor } from './tensor.ts';
import { traceNs, type TraceTimestamp } from './trace.ts';

export interface BatchRequest {
  inputs: TensorMap;
  /** Dim 0 of the inputs (1 when the model does not batch). */
  batchSize: number;
  /** 0 = the default level. */
  priority: number;
  /** The request's own queue timeout (Triton's `timeout` parameter), or 0 for the policy's. */
  timeoutUs: number;
  /** Set when the request is traced: queue and compute times are pushed here. */
  timestamps?: TraceTimestamp[];
  /** The request's sequence (Triton's sequence_id, sequence_start, sequence_end); only a sequence batcher reads it. */
  sequence?: SequenceFlags;
}

export interface SequenceFlags {
  id: CorrelationId;
  start: boolean;
  end: boolean;
}

/** What runs a version's requests on its instances: the dynamic batcher or the sequence batcher. */
export interface Scheduler {
  readonly pendingCount: number;
  enqueue(request: BatchRequest): Promise<BatchResult>;
  /** Resolves once nothing is queued or running. */
  drain(): Promise<void>;
  /** Stops its timers; called after drain, when the version closes. */
  close(): void;
}

/** Durations of one request, for statistics and metrics. */
export interface RequestTimings {
  queueNs: number;
  computeInputNs: number;
  computeInferNs: number;
  computeOutputNs: number;
}

export interface BatchResult {
  outputs: TensorMap;
  timings: RequestTimings;
}

export interface BatcherObserver {
  /** One execution of `batchSize` rows. */
  onExecution(batchSize: number, timings: Omit<RequestTimings, 'queueNs'>): void;
  onPendingChange(numPending: number): void;
}

interface QueuePolicy {
  rejectOnTimeout: boolean;
  defaultTimeoutUs: number;
  allowOverride: boolean;
  maxQueueSize: number;
}

interface Queued {
  request: BatchRequest;
  /** performance.now() at enqueue. */
  enqueuedMs: number;
  /** Queue deadline on the same clock, or Infinity. */
  deadlineMs: number;
  /** Shapes of the inputs that must match within a batch, joined. */
  shapeKey: string;
  /** Release order under preserve_ordering. */
  sequence: number;
  resolve(result: BatchResult): void;
  reject(err: Error): void;
}

interface Level {
  policy: QueuePolicy;
  queue: Queued[];
  /** DELAY policy: expired requests wait here, behind the level's unexpired ones. */
  delayed: Queued[];
}

function policyOf(raw: NonNullable<ModelConfig['dynamic_batching']>['default_queue_policy']): QueuePolicy {
  return {
    rejectOnTimeout: raw.timeout_action === 'REJECT',
    defaultTimeoutUs: raw.default_timeout_microseconds,
    allowOverride: raw.allow_timeout_override,
    maxQueueSize: raw.max_queue_size,
  };
}

export class Batcher implements Scheduler {
  private readonly freeInstances: ModelInstance[];
  private readonly levels: Level[];
  private readonly defaultLevel: number;
  private readonly maxBatchSize: number;
  private readonly preferredSizes: number[];
  private readonly maxPreferredSize: number;
  private readonly maxQueueDelayMs: number;
  private readonly batching: boolean;
  private readonly preserveOrdering: boolean;
  /** Inputs whose shapes (beyond dim 0) must be equal within a batch: variable dims, not ragged. */
  private readonly equalShapeInputs: string[];
  private timer: NodeJS.Timeout | null = null;
  private timerAtMs = Infinity;
  private numPending = 0;
  /** Queued requests with a finite deadline: when none, nothing can expire and no scan is needed. */
  private numWithDeadline = 0;
  private nextSequence = 0;
  private nextRelease = 0;
  private readonly finishedOutOfOrder = new Map<number, () => void>();
  private numRunning = 0;
  private idleWaiters: Array<() => void> = [];

  private readonly hasBatchInputs: boolean;

  constructor(private readonly config: ModelConfig, instances: ModelInstance[], private readonly observer: BatcherObserver) {
    this.hasBatchInputs = config.batch_input.length > 0;
    this.freeInstances = [...instances];
    const dynamic = config.dynamic_batching;
    this.batching = dynamic !== undefined;
    this.maxBatchSize = Math.max(1, config.max_batch_size);
    this.preferredSizes = dynamic ? [...dynamic.preferred_batch_size].sort((a, b) => a - b) : [];
    this.maxPreferredSize = this.preferredSizes.at(-1) ?? this.maxBatchSize;
    this.maxQueueDelayMs = dynamic ? dynamic.max_queue_delay_microseconds / 1000 : 0;
    this.preserveOrdering = dynamic?.preserve_ordering ?? false;
    const numLevels = Math.max(1, dynamic?.priority_levels ?? 0);
    this.defaultLevel = Math.max(1, dynamic?.default_priority_level ?? 0);
    this.levels = Array.from({ length: numLevels }, (_, i) => {
      const own = dynamic?.priority_queue_policy[String(i + 1)];
      return { policy: policyOf(own ?? dynamic?.default_queue_policy ?? { timeout_action: 'REJECT', default_timeout_microseconds: 0, allow_timeout_override: false, max_queue_size: 0 }), queue: [], delayed: [] };
    });
    this.equalShapeInputs = config.input.filter((input) => input.dims.includes(-1) && !input.allow_ragged_batch).map((input) => input.name);
  }

  get pendingCount(): number {
    return this.numPending;
  }

  enqueue(request: BatchRequest): Promise<BatchResult> {
    if (request.priority < 0 || request.priority > this.levels.length && this.levels.length > 1) {
      return Promise.reject(new ClassicError('INVALID_ARG', `priority ${request.priority} is not in [0, ${this.levels.length}]`));
    }
    // Out-of-range priorities on a model without levels take the default, as Triton does.
    const levelIndex = (request.priority === 0 || this.levels.length === 1 ? this.defaultLevel : request.priority) - 1;
    const level = this.levels[levelIndex];
    const { policy } = level;
    if (policy.maxQueueSize > 0 && level.queue.length + level.delayed.length >= policy.maxQueueSize) {
      return Promise.reject(new ClassicError('UNAVAILABLE', 'Exceeds maximum queue size'));
    }
    let timeoutUs = policy.defaultTimeoutUs;
    if (request.timeoutUs > 0 && policy.allowOverride && (timeoutUs === 0 || request.timeoutUs < timeoutUs)) timeoutUs = request.timeoutUs;
    const nowMs = performance.now();
    request.timestamps?.push({ name: 'QUEUE_START', ns: traceNs(nowMs) });
    return new Promise<BatchResult>((resolve, reject) => {
      const queued: Queued = {
        request,
        enqueuedMs: nowMs,
        deadlineMs: timeoutUs > 0 ? nowMs + timeoutUs / 1000 : Infinity,
        shapeKey: this.equalShapeInputs.map((name) => request.inputs[name]?.shape.slice(1).join('x') ?? '-').join('|'),
        sequence: this.nextSequence++,
        resolve,
        reject,
      };
      level.queue.push(queued);
      if (queued.deadlineMs !== Infinity) this.numWithDeadline++;
      this.setPending(this.numPending + 1);
      this.schedule();
    });
  }

  /** Resolves once nothing is queued or running (a reload drains the old version). */
  drain(): Promise<void> {
    if (this.numPending === 0 && this.numRunning === 0) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  close(): void {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
  }

  private setPending(numPending: number) {
    this.numPending = numPending;
    this.observer.onPendingChange(numPending);
  }

  /** Requests in scan order: by level, each level's queue then its delayed requests. */
  private *scanOrder(): Generator<[Queued[], number]> {
    for (const level of this.levels) {
      for (let i = 0; i < level.queue.length; i++) yield [level.queue, i];
      for (let i = 0; i < level.delayed.length; i++) yield [level.delayed, i];
    }
  }

  private expire(nowMs: number) {
    if (this.numWithDeadline === 0) return;
    for (const level of this.levels) {
      const kept: Queued[] = [];
      for (const queued of level.queue) {
        if (queued.deadlineMs > nowMs) {
          kept.push(queued);
          continue;
        }
        this.numWithDeadline--;
        // A delayed request has had its deadline: it now waits like one without.
        queued.deadlineMs = Infinity;
        if (level.policy.rejectOnTimeout) this.finish(queued, () => queued.reject(new ClassicError('UNAVAILABLE', 'Request timeout expired')), true);
        else level.delayed.push(queued);
      }
      level.queue = kept;
    }
  }

  private schedule() {
    const nowMs = performance.now();
    this.expire(nowMs);
    while (this.freeInstances.length > 0 && this.numPending > 0) {
      const taken = this.formBatch(nowMs);
      if (taken === null) break;
      this.run(this.freeInstances.pop()!, taken);
    }
    this.armTimer(nowMs);
  }

  /** The next batch, taken out of the queues; null to wait for more requests or the queue delay. */
  private formBatch(nowMs: number): Queued[] | null {
    const candidates: Array<[Queued[], number]> = [];
    let totalSize = 0;
    let bestMark = 0;
    let mustSend = false;
    let oldestMs = Infinity;
    let shapeKey: string | null = null;
    for (const [queue, index] of this.scanOrder()) {
      const queued = queue[index];
      if (!this.batching && candidates.length === 1) { mustSend = true; break; }
      if (totalSize + queued.request.batchSize > this.maxBatchSize) { mustSend = true; break; }
      if (shapeKey !== null && queued.shapeKey !== shapeKey) { mustSend = true; break; }
      if (totalSize >= this.maxPreferredSize) { mustSend = true; break; }
      shapeKey = queued.shapeKey;
      candidates.push([queue, index]);
      totalSize += queued.request.batchSize;
      oldestMs = Math.min(oldestMs, queued.enqueuedMs);
      if (this.preferredSizes.includes(totalSize)) bestMark = candidates.length;
    }
    if (candidates.length === 0) return null;
    const delayExceeded = nowMs - oldestMs >= this.maxQueueDelayMs;
    let numTaken: number;
    if (!this.batching || totalSize >= this.maxPreferredSize) numTaken = candidates.length;
    else if (bestMark > 0 && !delayExceeded) numTaken = bestMark;
    else if (mustSend || this.maxQueueDelayMs === 0 || delayExceeded) numTaken = candidates.length;
    else return null;
    const taken = candidates.slice(0, numTaken).map(([queue, index]) => queue[index]);
    const takenSet = new Set(taken);
    for (const level of this.levels) {
      level.queue = level.queue.filter((queued) => !takenSet.has(queued));
      level.delayed = level.delayed.filter((queued) => !takenSet.has(queued));
    }
    for (const queued of taken) if (queued.deadlineMs !== Infinity) this.numWithDeadline--;
    this.setPending(this.numPending - taken.length);
    return taken;
  }

  private armTimer(nowMs: number) {
    let wakeMs = Infinity;
    // The oldest request of a level is the first of its queue or of its delayed list (FIFO).
    if (this.batching && this.maxQueueDelayMs > 0 && this.freeInstances.length > 0) {
      for (const level of this.levels) {
        for (const list of [level.queue, level.delayed]) {
          if (list.length > 0) wakeMs = Math.min(wakeMs, list[0].enqueuedMs + this.maxQueueDelayMs);
        }
      }
    }
    if (this.numWithDeadline > 0) {
      for (const level of this.levels) for (const queued of level.queue) wakeMs = Math.min(wakeMs, queued.deadlineMs);
    }
    if (wakeMs === Infinity || wakeMs === this.timerAtMs) return;
    if (this.timer !== null) clearTimeout(this.timer);
    this.timerAtMs = wakeMs;
    this.timer = setTimeout(() => {
      this.timer = null;
      this.timerAtMs = Infinity;
      this.schedule();
    }, Math.max(0, wakeMs - nowMs));
  }

  private async run(instance: ModelInstance, batch: Queued[]) {
    this.numRunning++;
    const startMs = performance.now();
    const batchSize = batch.reduce((sum, queued) => sum + queued.request.batchSize, 0);
    try {
      const inputs: TensorMap = {};
      for (const name of Object.keys(batch[0].request.inputs)) {
        inputs[name] = concatBatch(batch.map((queued) => queued.request.inputs[name]));
      }
      if (this.hasBatchInputs) Object.assign(inputs, batchInputsOf(this.config, batch.map((queued) => queued.request.inputs)));
      const inferStartMs = performance.now();
      const outputs = await instance.execute(inputs);
      const inferEndMs = performance.now();
      let row = 0;
      const results = batch.map((queued) => {
        const own: TensorMap = {};
        for (const [name, tensor] of Object.entries(outputs)) {
          own[name] = batch.length === 1 ? tensor : this.rowsOf(tensor, row, queued.request.batchSize, name);
        }
        row += queued.request.batchSize;
        return own;
      });
      const endMs = performance.now();
      const timings = {
        computeInputNs: Math.round((inferStartMs - startMs) * 1e6),
        computeInferNs: Math.round((inferEndMs - inferStartMs) * 1e6),
        computeOutputNs: Math.round((endMs - inferEndMs) * 1e6),
      };
      this.observer.onExecution(batchSize, timings);
      for (const queued of batch) {
        queued.request.timestamps?.push(
          { name: 'COMPUTE_START', ns: traceNs(startMs) },
          { name: 'COMPUTE_INPUT_END', ns: traceNs(inferStartMs) },
          { name: 'COMPUTE_OUTPUT_START', ns: traceNs(inferEndMs) },
          { name: 'COMPUTE_END', ns: traceNs(endMs) },
        );
      }
      batch.forEach((queued, i) => {
        const result = { outputs: results[i], timings: { ...timings, queueNs: Math.round((startMs - queued.enqueuedMs) * 1e6) } };
        this.finish(queued, () => queued.resolve(result), false);
      });
    } catch (err) {
      const error = err instanceof ClassicError ? err : new ClassicError('INTERNAL', (err as Error).message);
      for (const queued of batch) this.finish(queued, () => queued.reject(error), false);
    } finally {
      this.numRunning--;
      this.freeInstances.push(instance);
      this.schedule();
      this.notifyIdle();
    }
  }

  private rowsOf(tensor: Tensor, row: number, numRows: number, name: string): Tensor {
    if (tensor.shape.length === 0 || tensor.shape[0] < row + numRows) {
      throw new ClassicError('INTERNAL', `output '${name}' has shape [${tensor.shape.join(',')}], not one row per batch element`);
    }
    return sliceBatch(tensor, row, numRows);
  }

  /** Settles a request, in request order under preserve_ordering. */
  private finish(queued: Queued, settle: () => void, fromQueue: boolean) {
    if (fromQueue) this.setPending(this.numPending - 1);
    if (!this.preserveOrdering) { settle(); return; }
    this.finishedOutOfOrder.set(queued.sequence, settle);
    for (let next = this.finishedOutOfOrder.get(this.nextRelease); next !== undefined; next = this.finishedOutOfOrder.get(this.nextRelease)) {
      this.finishedOutOfOrder.delete(this.nextRelease++);
      next();
    }
  }

  private notifyIdle() {
    if (this.numPending !== 0 || this.numRunning !== 0) return;
    const waiters = this.idleWaiters;
    this.idleWaiters = [];
    for (const resolve of waiters) resolve();
  }
}
