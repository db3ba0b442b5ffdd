// Triton's sequence batcher (core src/sequence_batch_scheduler.cc) for stateful models. Each
// sequence (a correlation id, from its START to its END) holds a slot on one instance until it
// ends or stays idle past max_sequence_idle_microseconds; sequences beyond the slots wait in a
// backlog, first come first served. Strategies:
// - direct: slot i is batch row i; each step runs every slot's next request, rows up to the
//   highest slot with one, READY false (and zeros) on the rows without;
// - oldest: a step batches the oldest next requests of different sequences, up to
//   max_batch_size, like the dynamic batcher (preferred sizes, queue delay).
// The batcher gives the model the control tensors and each sequence's implicit state.
import type { Logger } from '../engine/log.ts';
import type { ModelInstance, TensorMap } from './backend.ts';
import type { BatchRequest, BatchResult, BatcherObserver, Scheduler } from './batcher.ts';
import { ClassicError } from './errors.ts';
import type { ModelConfig } from './model-config.ts';
import {
  controlSpecs, controlTensor, corridMismatch, ownedCopy, stateSpecs, zerosLike, type ControlRow, type CorrelationId, type StateSpec,
} from './sequence-inputs.ts';
import { concatBatch, sliceBatch, type Tensor } from './tensor.ts';
import { traceNs } from './trace.ts';

interface Waiting {
  request: BatchRequest;
  start: boolean;
  end: boolean;
  enqueuedMs: number;
  /** The request's input names and shapes: rows batch together only when these match. */
  shapeKey: string;
  resolve(result: BatchResult): void;
  reject(err: Error): void;
}

interface Sequence {
  id: CorrelationId;
  key: string;
  /** Requests not yet run, in arrival order. */
  queue: Waiting[];
  slot: Slot | null;
  /** The state the next request gets (keyed by state input name); null before the first run. */
  state: TensorMap | null;
  /** When its last request arrived or finished (performance.now()). */
  lastMs: number;
  running: boolean;
}

interface Slot {
  lane: Lane;
  index: number;
  sequence: Sequence | null;
}

/** One instance and its slots. */
interface Lane {
  index: number;
  instance: ModelInstance;
  slots: Slot[];
  busy: boolean;
}

/** A taken row: the slot's sequence and its request, or null for a slot without one (direct). */
type Row = { sequence: Sequence; waiting: Waiting } | null;

const keyOf = (id: CorrelationId) => (typeof id === 'bigint' ? `u${id}` : `s${id}`);

export class SequenceBatcher implements Scheduler {
  private readonly lanes: Lane[];
  /** Sequences that take more requests (not ended), in a slot or the backlog. */
  private readonly open = new Map<string, Sequence>();
  private readonly backlog: Sequence[] = [];
  /** Sequences holding a slot or waiting in the backlog: the reaper's scope. */
  private readonly live = new Set<Sequence>();
  private readonly batched: boolean;
  private readonly maxBatchSize: number;
  private readonly idleMs: number;
  private readonly oldest: NonNullable<NonNullable<ModelConfig['sequence_batching']>['oldest']> | null;
  private readonly direct: NonNullable<NonNullable<ModelConfig['sequence_batching']>['direct']> | null;
  private readonly preferredSizes: number[];
  private readonly controls: ReturnType<typeof controlSpecs>;
  private readonly states: StateSpec[];
  private readonly clientOutputs: Set<string>;
  private readonly raggedInputs: Set<string>;
  private numPending = 0;
  private numRunning = 0;
  private idleWaiters: Array<() => void> = [];
  private delayTimer: NodeJS.Timeout | null = null;
  private delayTimerAtMs = Infinity;
  private reaper: NodeJS.Timeout | null = null;
  private reaperAtMs = Infinity;
  private closed = false;

  constructor(
    private readonly config: ModelConfig, instances: ModelInstance[], modelDir: string,
    private readonly observer: BatcherObserver, private readonly log: Logger,
  ) {
    const sequence = config.sequence_batching!;
    this.batched = config.max_batch_size > 0;
    this.maxBatchSize = Math.max(1, config.max_batch_size);
    this.idleMs = sequence.max_sequence_idle_microseconds / 1000;
    this.oldest = sequence.oldest ?? null;
    this.direct = this.oldest === null ? sequence.direct! : null;
    this.preferredSizes = [...(this.oldest?.preferred_batch_size ?? [])].sort((a, b) => a - b);
    // Triton: max_batch_size slots per instance (at least 1); oldest: max_candidate_sequences when set.
    const numSlots = this.oldest !== null && this.oldest.max_candidate_sequences > 0 ? this.oldest.max_candidate_sequences : this.maxBatchSize;
    this.lanes = instances.map((instance, index) => {
      const lane: Lane = { index, instance, slots: [], busy: false };
      lane.slots = Array.from({ length: numSlots }, (_, i) => ({ lane, index: i, sequence: null }));
      return lane;
    });
    this.controls = controlSpecs(config);
    this.states = stateSpecs(config, modelDir);
    this.clientOutputs = new Set(config.output.map((output) => output.name));
    this.raggedInputs = new Set(config.input.filter((input) => input.allow_ragged_batch).map((input) => input.name));
  }

  get pendingCount(): number {
    return this.numPending;
  }

  /** Slots free now, over all instances (for tests and statistics). */
  get numFreeSlots(): number {
    return this.lanes.reduce((sum, lane) => sum + lane.slots.filter((slot) => slot.sequence === null).length, 0);
  }

  enqueue(request: BatchRequest): Promise<BatchResult> {
    const model = this.config.name;
    const flags = request.sequence;
    if (this.closed) return Promise.reject(new ClassicError('UNAVAILABLE', `model '${model}' is unloading`));
    if (flags === undefined || flags.id === 0n || flags.id === '') {
      return Promise.reject(new ClassicError('INVALID_ARG', `inference request to model '${model}' must specify a non-zero or non-empty correlation ID`));
    }
    if (request.batchSize > 1) {
      return Promise.reject(new ClassicError('INVALID_ARG', `inference request to model '${model}' must specify batch-size 1 due to requirements of sequence batcher`));
    }
    const mismatch = corridMismatch(this.controls, flags.id, model);
    if (mismatch !== null) return Promise.reject(new ClassicError('INVALID_ARG', mismatch));
    const key = keyOf(flags.id);
    let sequence = this.open.get(key);
    if (sequence === undefined && !flags.start) {
      return Promise.reject(new ClassicError('INVALID_ARG', `inference request for sequence ${flags.id} to model '${model}' must specify the START flag on the first request of the sequence`));
    }
    const nowMs = performance.now();
    if (sequence !== undefined && flags.start) {
      // Triton continues in the same slot: the START resets the state when it runs.
      this.log.warn({ model, sequenceId: String(flags.id) }, `sequence ${flags.id} for model '${model}' has a conflict. The previous sequence did not end before this sequence start. Previous sequence will be terminated early.`);
    }
    if (sequence === undefined) {
      sequence = { id: flags.id, key, queue: [], slot: null, state: null, lastMs: nowMs, running: false };
      this.open.set(key, sequence);
      this.live.add(sequence);
      const slot = this.freeSlot();
      if (slot === null) this.backlog.push(sequence);
      else this.assign(slot, sequence);
    }
    request.timestamps?.push({ name: 'QUEUE_START', ns: traceNs(nowMs) });
    sequence.lastMs = nowMs;
    // After END the id is free: a new START makes a new sequence, even while this one finishes.
    if (flags.end) this.open.delete(key);
    const target = sequence;
    return new Promise<BatchResult>((resolve, reject) => {
      target.queue.push({ request, start: flags.start, end: flags.end, enqueuedMs: nowMs, shapeKey: this.shapeKeyOf(request.inputs), resolve, reject });
      this.setPending(this.numPending + 1);
      this.schedule();
      this.armReaper();
    });
  }

  drain(): Promise<void> {
    if (this.numPending === 0 && this.numRunning === 0) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  close(): void {
    this.closed = true;
    if (this.delayTimer !== null) clearTimeout(this.delayTimer);
    if (this.reaper !== null) clearTimeout(this.reaper);
    this.delayTimer = this.reaper = null;
  }

  private shapeKeyOf(inputs: TensorMap): string {
    return Object.keys(inputs).sort().map((name) => (this.raggedInputs.has(name) ? name : `${name}:${inputs[name].shape.join('x')}`)).join('|');
  }

  private setPending(numPending: number) {
    this.numPending = numPending;
    this.observer.onPendingChange(numPending);
  }

  /** The lowest free slot index, over instances (Triton's ready-slot order). */
  private freeSlot(): Slot | null {
    let best: Slot | null = null;
    for (const lane of this.lanes) {
      const slot = lane.slots.find((candidate) => candidate.sequence === null);
      if (slot !== undefined && (best === null || slot.index < best.index)) best = slot;
    }
    return best;
  }

  private assign(slot: Slot, sequence: Sequence) {
    slot.sequence = sequence;
    sequence.slot = slot;
  }

  /** Frees a sequence's slot (it ended or went idle) for the first sequence of the backlog. */
  private release(sequence: Sequence) {
    this.live.delete(sequence);
    if (this.open.get(sequence.key) === sequence) this.open.delete(sequence.key);
    const slot = sequence.slot;
    if (slot === null) {
      this.backlog.splice(this.backlog.indexOf(sequence), 1);
      return;
    }
    sequence.slot = null;
    slot.sequence = null;
    const next = this.backlog.shift();
    if (next !== undefined) this.assign(slot, next);
  }

  private schedule() {
    if (this.closed) return;
    const nowMs = performance.now();
    let wakeMs = Infinity;
    for (const lane of this.lanes) {
      if (lane.busy) continue;
      const formed = this.oldest !== null ? this.formOldest(lane, nowMs) : this.formDirect(lane, nowMs);
      if (typeof formed === 'number') wakeMs = Math.min(wakeMs, formed);
      else if (formed !== null) void this.run(lane, formed);
    }
    this.armDelay(wakeMs, nowMs);
  }

  /** Rows of a direct step: slot i is row i. A number: wait until then (the queue delay). */
  private formDirect(lane: Lane, nowMs: number): Row[] | number | null {
    let shapeKey: string | null = null;
    let oldestMs = Infinity;
    const heads = lane.slots.map((slot): Row => {
      const sequence = slot.sequence;
      const waiting = sequence?.queue[0];
      if (sequence === null || waiting === undefined) return null;
      shapeKey ??= waiting.shapeKey;
      if (waiting.shapeKey !== shapeKey) return null;
      oldestMs = Math.min(oldestMs, waiting.enqueuedMs);
      return { sequence, waiting };
    });
    const numReady = heads.filter((row) => row !== null).length;
    if (numReady === 0) return null;
    const { max_queue_delay_microseconds: delayUs, minimum_slot_utilization: minUtilization } = this.direct!;
    if (delayUs > 0 && numReady < lane.slots.length && numReady / lane.slots.length < Math.max(minUtilization, Number.MIN_VALUE)) {
      const dueMs = oldestMs + delayUs / 1000;
      if (nowMs < dueMs) return dueMs;
    }
    let last = heads.length - 1;
    while (heads[last] === null) last--;
    return heads.slice(0, last + 1);
  }

  /** Rows of an oldest step: the oldest next requests of different sequences. */
  private formOldest(lane: Lane, nowMs: number): Row[] | number | null {
    const candidates: Array<{ sequence: Sequence; waiting: Waiting }> = [];
    for (const slot of lane.slots) {
      const waiting = slot.sequence?.queue[0];
      if (waiting !== undefined) candidates.push({ sequence: slot.sequence!, waiting });
    }
    if (candidates.length === 0) return null;
    candidates.sort((a, b) => a.waiting.enqueuedMs - b.waiting.enqueuedMs);
    const shapeKey = candidates[0].waiting.shapeKey;
    const rows = candidates.filter((row) => row.waiting.shapeKey === shapeKey).slice(0, this.maxBatchSize);
    const maxPreferred = this.preferredSizes.at(-1)!;
    if (rows.length >= maxPreferred) return rows.slice(0, maxPreferred);
    const dueMs = rows[0].waiting.enqueuedMs + this.oldest!.max_queue_delay_microseconds / 1000;
    const preferred = this.preferredSizes.filter((size) => size <= rows.length).at(-1);
    if (preferred !== undefined && nowMs < dueMs) return rows.slice(0, preferred);
    // More can join only while a slot has no request queued and nothing (a shape) ends the batch.
    const moreCanCome = rows.length < this.maxBatchSize && rows.length < lane.slots.length && candidates.length === rows.length;
    if (nowMs < dueMs && moreCanCome) return dueMs;
    return rows;
  }

  private armDelay(wakeMs: number, nowMs: number) {
    if (wakeMs === Infinity || wakeMs === this.delayTimerAtMs) return;
    if (this.delayTimer !== null) clearTimeout(this.delayTimer);
    this.delayTimerAtMs = wakeMs;
    this.delayTimer = setTimeout(() => {
      this.delayTimer = null;
      this.delayTimerAtMs = Infinity;
      this.schedule();
    }, Math.max(0, wakeMs - nowMs));
  }

  /** Wakes when the first idle sequence passes max_sequence_idle_microseconds. */
  private armReaper() {
    if (this.closed) return;
    let dueMs = Infinity;
    for (const sequence of this.live) if (sequence.queue.length === 0 && !sequence.running) dueMs = Math.min(dueMs, sequence.lastMs + this.idleMs);
    if (dueMs === this.reaperAtMs) return;
    if (this.reaper !== null) clearTimeout(this.reaper);
    this.reaper = null;
    this.reaperAtMs = dueMs;
    if (dueMs === Infinity) return;
    this.reaper = setTimeout(() => {
      this.reaper = null;
      this.reaperAtMs = Infinity;
      this.reap();
    }, Math.max(0, dueMs - performance.now()));
    // An idle sequence alone must not keep the process alive.
    this.reaper.unref();
  }

  private reap() {
    const nowMs = performance.now();
    for (const sequence of [...this.live]) {
      if (sequence.queue.length > 0 || sequence.running || nowMs - sequence.lastMs < this.idleMs) continue;
      this.log.info({ model: this.config.name, sequenceId: String(sequence.id) }, `sequence ${sequence.id} of model '${this.config.name}' was idle longer than ${this.idleMs} ms: its slot is released`);
      this.release(sequence);
    }
    this.schedule();
    this.armReaper();
  }

  private async run(lane: Lane, rows: Row[]) {
    lane.busy = true;
    this.numRunning++;
    const taken = rows.filter((row) => row !== null);
    for (const { sequence } of taken) {
      sequence.queue.shift();
      sequence.running = true;
    }
    this.setPending(this.numPending - taken.length);
    const startMs = performance.now();
    try {
      const inputs = this.batchInputs(rows, taken[0].waiting.request.inputs);
      const inferStartMs = performance.now();
      const outputs = await lane.instance.execute(inputs);
      const inferEndMs = performance.now();
      const results = rows.map((row, i) => (row === null ? null : this.rowOutputs(outputs, i, rows.length, row.sequence)));
      const endMs = performance.now();
      const timings = {
        computeInputNs: Math.round((inferStartMs - startMs) * 1e6),
        computeInferNs: Math.round((inferEndMs - inferStartMs) * 1e6),
        computeOutputNs: Math.round((endMs - inferEndMs) * 1e6),
      };
      this.observer.onExecution(this.batched ? rows.length : 1, timings);
      rows.forEach((row, i) => {
        if (row === null) return;
        row.waiting.request.timestamps?.push(
          { name: 'COMPUTE_START', ns: traceNs(startMs) }, { name: 'COMPUTE_INPUT_END', ns: traceNs(inferStartMs) },
          { name: 'COMPUTE_OUTPUT_START', ns: traceNs(inferEndMs) }, { name: 'COMPUTE_END', ns: traceNs(endMs) },
        );
        row.waiting.resolve({ outputs: results[i]!, timings: { ...timings, queueNs: Math.round((startMs - row.waiting.enqueuedMs) * 1e6) } });
      });
    } catch (err) {
      const error = err instanceof ClassicError ? err : new ClassicError('INTERNAL', (err as Error).message);
      for (const { waiting } of taken) waiting.reject(error);
    } finally {
      const endMs = performance.now();
      for (const { sequence, waiting } of taken) {
        sequence.running = false;
        sequence.lastMs = endMs;
        if (waiting.end) this.release(sequence);
      }
      this.numRunning--;
      lane.busy = false;
      this.schedule();
      this.armReaper();
      if (this.numPending === 0 && this.numRunning === 0) for (const resolve of this.idleWaiters.splice(0)) resolve();
    }
  }

  /** The batch: the requests' inputs (zeros on empty rows), the control tensors and the states. */
  private batchInputs(rows: readonly Row[], template: TensorMap): TensorMap {
    const inputs: TensorMap = {};
    const join = (tensors: Tensor[]) => (this.batched ? concatBatch(tensors) : tensors[0]);
    for (const name of Object.keys(template)) inputs[name] = join(rows.map((row) => row?.waiting.request.inputs[name] ?? zerosLike(template[name])));
    const controlRows: ControlRow[] = rows.map((row) => (row === null
      ? { ready: false, start: false, end: false, id: 0n }
      : { ready: true, start: row.waiting.start, end: row.waiting.end, id: row.sequence.id }));
    for (const spec of this.controls) inputs[spec.name] = controlTensor(spec, controlRows, this.batched);
    for (const state of this.states) {
      const stateRows = rows.map((row) => {
        if (row === null) return state.initial;
        // START (also one that restarts a running sequence) begins from the initial state.
        if (row.waiting.start || row.sequence.state === null) return state.initial;
        return row.sequence.state[state.inputName] ?? state.initial;
      });
      inputs[state.inputName] = join(stateRows);
    }
    return inputs;
  }

  /** Row i's outputs for its client (the config's outputs); its state outputs become the sequence's state. */
  private rowOutputs(outputs: TensorMap, row: number, numRows: number, sequence: Sequence): TensorMap {
    const own: TensorMap = {};
    const slice = (name: string): Tensor => {
      const tensor = outputs[name];
      if (tensor === undefined) throw new ClassicError('INTERNAL', `model '${this.config.name}' did not produce output '${name}'`);
      if (!this.batched) return tensor;
      if (tensor.shape.length === 0 || tensor.shape[0] !== numRows) {
        throw new ClassicError('INTERNAL', `output '${name}' has shape [${tensor.shape.join(',')}], not one row per batch row (${numRows})`);
      }
      return sliceBatch(tensor, row, 1);
    };
    const state: TensorMap = {};
    for (const spec of this.states) state[spec.inputName] = ownedCopy(slice(spec.outputName));
    sequence.state = state;
    for (const name of Object.keys(outputs)) if (this.clientOutputs.has(name)) own[name] = slice(name);
    return own;
  }
}
