// Triton's trace extension (trace mode `triton`): settings global and per model, sampling every
// trace_rate-th request while trace_count lasts, and the trace file. A traced request collects
// its timestamps as it goes (triton/trace.ts); once it ends, its trace is buffered and
// written as a JSON array: every log_frequency traces to `<trace_file>.<n>` (n from 0), or, with
// log_frequency 0, all of them to `<trace_file>` when the server closes. As in Triton, the trace
// file is a start-up setting: a client cannot point the server at a file of its choosing.
import { writeFileSync } from 'node:fs';
import { ClassicError, toJson, type Tensor, type TensorMap, type TraceTimestamp } from '../../triton/index.ts';

export type TraceLevel = 'TIMESTAMPS' | 'TENSORS';

interface Settings {
  /** Empty: OFF. */
  level: TraceLevel[];
  rate: number;
  /** Traces still to take; -1 for no limit. */
  count: number;
  logFrequency: number;
}

type SettingName = 'trace_level' | 'trace_rate' | 'trace_count' | 'log_frequency';
const FIELD_OF: Record<SettingName, keyof Settings> = { trace_level: 'level', trace_rate: 'rate', trace_count: 'count', log_frequency: 'logFrequency' };

/** One scope's settings: the global ones, or a model's, whose unset fields follow the global. */
interface Scope {
  own: Partial<Settings>;
  /** Requests seen since the scope's settings last changed. */
  numSampled: number;
}

/** A request being traced. */
export interface ActiveTrace {
  readonly id: number;
  readonly modelName: string;
  readonly withTensors: boolean;
  readonly timestamps: TraceTimestamp[];
  readonly tensors: Array<{ activity: 'TENSOR_QUEUE_INPUT' | 'TENSOR_BACKEND_OUTPUT'; name: string; tensor: Tensor }>;
}

/** A setting's new value as the wire gives it: a string or strings, or null (or no values) to clear. */
export type SettingValue = string | string[] | null;

const UINT32_MAX = 0xffffffff;

const invalid = (message: string) => new ClassicError('INVALID_ARG', message);

function single(name: string, value: string[]): string {
  if (value.length !== 1) throw invalid(`expect only 1 value for '${name}'`);
  return value[0];
}

function parseInteger(name: string, text: string, min: number, max: number): number {
  if (!/^-?\d+$/.test(text)) throw invalid(`Unable to parse '${name}', got: ${text}`);
  const number = Number(text);
  if (number < min || number > max) throw invalid(`Unable to parse '${name}', value is out of range [ ${min}, ${max} ], got: ${text}`);
  return number;
}

function parseLevel(values: string[]): TraceLevel[] {
  if (values.includes('OFF')) {
    if (values.length !== 1) throw invalid("Expect only one trace level 'OFF' is specified");
    return [];
  }
  const levels: TraceLevel[] = [];
  for (const value of values) {
    if (value !== 'TIMESTAMPS' && value !== 'TENSORS') throw invalid(`invalid trace level '${value}': expect OFF, TIMESTAMPS or TENSORS`);
    if (!levels.includes(value)) levels.push(value);
  }
  return levels;
}

function tensorRecord(id: number, activity: string, name: string, tensor: Tensor) {
  const data = toJson(tensor) as unknown[];
  return { id, activity, tensor: { name, data: data.join(','), shape: tensor.shape.join(','), dtype: tensor.datatype } };
}

export interface TraceOptions {
  /** The trace file; null when the server has none, and then tracing cannot be turned on. */
  traceFile: string | null;
}

export class TraceManager {
  private readonly global: Scope = { own: { level: [], rate: 1000, count: -1, logFrequency: 0 }, numSampled: 0 };
  private readonly models = new Map<string, Scope>();
  private nextId = 1;
  private nextFileIndex = 0;
  private buffered: unknown[] = [];
  /** Traces in `buffered` (tensor records are extra lines of their trace). */
  private numBufferedTraces = 0;

  constructor(private readonly options: TraceOptions) {}

  private effective(modelName: string | null): Settings {
    const own = modelName === null ? {} : this.models.get(modelName)?.own ?? {};
    return { ...(this.global.own as Settings), ...own };
  }

  /** Triton's setting map: every value a string (trace_level a list of them). */
  settings(modelName: string | null): Record<string, string | string[]> {
    const settings = this.effective(modelName);
    return {
      trace_level: settings.level.length === 0 ? ['OFF'] : settings.level,
      trace_rate: String(settings.rate),
      trace_count: String(settings.count),
      log_frequency: String(settings.logFrequency),
      trace_file: this.options.traceFile ?? '',
      trace_mode: 'triton',
    };
  }

  /** Applies every change or none; a model's null (or empty) value clears it back to the global one. */
  update(modelName: string | null, changes: Record<string, SettingValue>): void {
    const next: Partial<Settings> = {};
    const cleared: Array<keyof Settings> = [];
    for (const [name, raw] of Object.entries(changes)) {
      if (name === 'trace_file') throw new ClassicError('UNSUPPORTED', 'trace file location can not be updated through network protocol');
      if (name === 'trace_mode') throw new ClassicError('UNSUPPORTED', "trace_mode is a start-up setting; Conduit traces in mode 'triton' only");
      if (!Object.hasOwn(FIELD_OF, name)) throw invalid(`unknown trace setting '${name}'`);
      const field = FIELD_OF[name as SettingName];
      const values = raw === null ? [] : typeof raw === 'string' ? [raw] : raw;
      if (values.length === 0) {
        if (modelName === null) throw invalid(`the global '${name}' cannot be cleared, only a model's`);
        cleared.push(field);
        continue;
      }
      if (field === 'level') next.level = parseLevel(values);
      else if (field === 'count') next.count = parseInteger(name, single(name, values), -1, 0x7fffffff);
      else if (field === 'rate') next.rate = parseInteger(name, single(name, values), 0, UINT32_MAX);
      else next.logFrequency = parseInteger(name, single(name, values), 0, UINT32_MAX);
    }
    const merged = { ...this.effective(modelName), ...next };
    if (merged.level.length > 0 && this.options.traceFile === null) {
      throw invalid('tracing needs a trace file, and the server has none: set model_repository.trace_file in its config');
    }
    if (merged.rate === 0 && merged.level.length > 0) throw invalid("'trace_rate' must be at least 1 while tracing is on");
    const scope = modelName === null ? this.global : this.models.get(modelName) ?? { own: {}, numSampled: 0 };
    scope.own = { ...scope.own, ...next };
    for (const field of cleared) delete scope.own[field];
    scope.numSampled = 0;
    if (modelName !== null) {
      if (Object.keys(scope.own).length === 0) this.models.delete(modelName);
      else this.models.set(modelName, scope);
    }
    this.flushIfDue(this.effective(modelName).logFrequency);
  }

  /** A trace for this request, or null when it is not one of the sampled ones. */
  sample(modelName: string): ActiveTrace | null {
    // On every request: read the two scopes without building the merged settings.
    const modelScope = this.models.get(modelName);
    const global = this.global.own as Settings;
    const level = modelScope?.own.level ?? global.level;
    if (level.length === 0) return null;
    // The count left lives where the count was set.
    const countOwner = modelScope?.own.count !== undefined ? modelScope : this.global;
    if (countOwner.own.count === 0) return null;
    const scope = modelScope ?? this.global;
    if (++scope.numSampled % (modelScope?.own.rate ?? global.rate) !== 0) return null;
    if (countOwner.own.count! > 0) countOwner.own.count!--;
    return { id: this.nextId++, modelName, withTensors: level.includes('TENSORS'), timestamps: [], tensors: [] };
  }

  /** Records a traced request's tensors (TENSORS level). */
  recordTensors(trace: ActiveTrace, activity: 'TENSOR_QUEUE_INPUT' | 'TENSOR_BACKEND_OUTPUT', tensors: TensorMap): void {
    if (!trace.withTensors) return;
    for (const [name, tensor] of Object.entries(tensors)) trace.tensors.push({ activity, name, tensor });
  }

  /** A traced request ended (answered or failed): its trace joins the file's next write. */
  finish(trace: ActiveTrace, modelVersion: number, requestId: string): void {
    this.buffered.push({ id: trace.id, model_name: trace.modelName, model_version: modelVersion, request_id: requestId, timestamps: trace.timestamps });
    this.numBufferedTraces++;
    for (const { activity, name, tensor } of trace.tensors) this.buffered.push(tensorRecord(trace.id, activity, name, tensor));
    this.flushIfDue(this.effective(trace.modelName).logFrequency);
  }

  /** Writes the buffered traces once there are `logFrequency` of them (0: only at close). */
  private flushIfDue(logFrequency: number) {
    if (logFrequency === 0 || this.options.traceFile === null) return;
    if (this.numBufferedTraces < logFrequency) return;
    this.write(`${this.options.traceFile}.${this.nextFileIndex++}`);
  }

  private write(file: string) {
    const records = this.buffered;
    this.buffered = [];
    this.numBufferedTraces = 0;
    writeFileSync(file, `${JSON.stringify(records)}\n`);
  }

  /** Writes what is buffered: to `<trace_file>` with log_frequency 0, else to the next `<trace_file>.<n>`. */
  close(): void {
    if (this.buffered.length === 0 || this.options.traceFile === null) return;
    const { logFrequency } = this.effective(null);
    this.write(logFrequency === 0 ? this.options.traceFile : `${this.options.traceFile}.${this.nextFileIndex++}`);
  }
}
