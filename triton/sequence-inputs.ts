// What the sequence batcher hands a model beside the requests' own inputs (Triton's
// sequence_batch_scheduler.cc): the control tensors (START, END, READY, CORRID) of each batch row,
// and each sequence's implicit state, the initial state at its START.
import { readFileSync } from 'node:fs';
import { fromConfigDataType, type DataType } from './datatype.ts';
import { ClassicError } from './errors.ts';
import type { ControlKind, ModelConfig } from './model-config.ts';
import { fileInRepository, shownPath } from './repository-paths.ts';
import type { TensorMap } from './backend.ts';
import { allocate, concatBatch, elementCount, fromRaw, rawByteLength, type Tensor } from './tensor.ts';

/** A uint64 id (a JSON number, int64/uint64 parameters) or a string id: Triton's two kinds. */
export type CorrelationId = bigint | string;

/** What one batch row tells the model: READY false for a slot without a request this step. */
export interface ControlRow {
  ready: boolean;
  start: boolean;
  end: boolean;
  id: CorrelationId;
}

interface ControlSpec {
  name: string;
  kind: ControlKind;
  datatype: DataType;
  /** The false and true values (booleans as 0 and 1); unused for CORRID. */
  falseTrue: [number, number];
}

export interface StateSpec {
  inputName: string;
  outputName: string;
  datatype: DataType;
  /** One row of state at a sequence's START: [1, ...dims] when the model batches, else dims. */
  initial: Tensor;
}

const encoder = new TextEncoder();

export function controlSpecs(config: ModelConfig): ControlSpec[] {
  return (config.sequence_batching?.control_input ?? []).map(({ name, control: [control] }) => {
    if (control.kind === 'CONTROL_SEQUENCE_CORRID') return { name, kind: control.kind, datatype: fromConfigDataType(control.data_type!), falseTrue: [0, 0] };
    if (control.int32_false_true.length > 0) return { name, kind: control.kind, datatype: 'INT32', falseTrue: [control.int32_false_true[0], control.int32_false_true[1]] };
    if (control.fp32_false_true.length > 0) return { name, kind: control.kind, datatype: 'FP32', falseTrue: [control.fp32_false_true[0], control.fp32_false_true[1]] };
    return { name, kind: control.kind, datatype: 'BOOL', falseTrue: control.bool_false_true.map(Number) as [number, number] };
  });
}

/** The largest id each numeric CORRID type holds. */
const CORRID_MAX: Partial<Record<DataType, bigint>> = { UINT32: 2n ** 32n - 1n, INT32: 2n ** 31n - 1n, INT64: 2n ** 63n - 1n, UINT64: 2n ** 64n - 1n };

/** Why a request's id cannot fill the model's CORRID tensor, or null. */
export function corridMismatch(specs: readonly ControlSpec[], id: CorrelationId, modelName: string): string | null {
  const corrid = specs.find((spec) => spec.kind === 'CONTROL_SEQUENCE_CORRID');
  if (corrid === undefined || corrid.datatype === 'BYTES') return null;
  if (typeof id === 'string') {
    return `model '${modelName}' takes an unsigned integer sequence id (its CORRID control '${corrid.name}' is ${corrid.datatype}), got the string "${id}"`;
  }
  if (id > CORRID_MAX[corrid.datatype]!) return `sequence id ${id} does not fit model '${modelName}''s ${corrid.datatype} CORRID control '${corrid.name}'`;
  return null;
}

/** One control tensor for the batch rows: [rows, 1] when the model batches, else [1]. */
export function controlTensor(spec: ControlSpec, rows: readonly ControlRow[], batched: boolean): Tensor {
  const shape = batched ? [rows.length, 1] : [1];
  if (spec.kind === 'CONTROL_SEQUENCE_CORRID') {
    if (spec.datatype === 'BYTES') return { datatype: 'BYTES', shape, data: rows.map((row) => encoder.encode(row.ready ? String(row.id) : '')) };
    const data = allocate(spec.datatype, rows.length);
    rows.forEach((row, i) => {
      const id = row.ready ? row.id as bigint : 0n;
      if (data instanceof BigUint64Array || data instanceof BigInt64Array) data[i] = id;
      else (data as Int32Array)[i] = Number(id);
    });
    return { datatype: spec.datatype, shape, data };
  }
  const flag = (row: ControlRow) => {
    if (spec.kind === 'CONTROL_SEQUENCE_READY') return row.ready;
    return row.ready && (spec.kind === 'CONTROL_SEQUENCE_START' ? row.start : row.end);
  };
  const data = allocate(spec.datatype, rows.length) as Int32Array;
  rows.forEach((row, i) => { data[i] = spec.falseTrue[flag(row) ? 1 : 0]; });
  return { datatype: spec.datatype, shape, data };
}

/** The states of the config, with their initial rows (zeros, or `<model>/initial_state/<data_file>`). */
export function stateSpecs(config: ModelConfig, modelDir: string): StateSpec[] {
  const batched = config.max_batch_size > 0;
  return (config.sequence_batching?.state ?? []).map((state) => {
    const datatype = fromConfigDataType(state.data_type);
    const initialState = state.initial_state[0];
    // Without initial_state a variable dim starts empty (the model grows it).
    const dims = initialState?.dims ?? state.dims.map((dim) => Math.max(0, dim));
    const shape = batched ? [1, ...dims] : dims;
    let initial: Tensor = { datatype, shape, data: allocate(datatype, elementCount(shape)) };
    if (initialState?.data_file !== undefined) {
      const parts = ['initial_state', initialState.data_file];
      const shown = shownPath(modelDir, ...parts);
      let bytes: Buffer;
      try {
        bytes = readFileSync(fileInRepository(modelDir, ...parts));
      } catch (err) {
        if (err instanceof ClassicError) throw err;
        throw new ClassicError('INVALID_ARG', `${shown}: cannot read the initial state of '${state.input_name}': ${(err as NodeJS.ErrnoException).code ?? 'error'}`);
      }
      const expected = datatype === 'BYTES' ? bytes.byteLength : rawByteLength(initial);
      if (bytes.byteLength < expected) {
        throw new ClassicError('INVALID_ARG', `initial_state setting expects ${expected} bytes, but the data provided from ${initialState.data_file} only has ${bytes.byteLength} bytes`);
      }
      initial = fromRaw(datatype, shape, bytes.subarray(0, expected), `initial state '${state.input_name}'`);
    }
    return { inputName: state.input_name, outputName: state.output_name, datatype, initial };
  });
}

/** A copy of a state row, so a sequence does not hold its whole batch's output alive. */
export function ownedCopy(tensor: Tensor): Tensor {
  const data = tensor.datatype === 'BYTES' ? [...(tensor.data as Uint8Array[])] : (tensor.data as Uint8Array).slice();
  return { datatype: tensor.datatype, shape: [...tensor.shape], data };
}

/** Zeros shaped like a row: the inputs of a slot that has no request this step. */
export function zerosLike(row: Tensor): Tensor {
  return { datatype: row.datatype, shape: row.shape, data: allocate(row.datatype, row.data.length) };
}

/** Names the scheduler feeds the model that requests never carry (control and state inputs). */
export function sequenceInputNames(config: ModelConfig): string[] {
  const sequence = config.sequence_batching;
  if (sequence === undefined) return [];
  return [...sequence.control_input.map((input) => input.name), ...sequence.state.map((state) => state.input_name)];
}

/** State outputs the model produces that the config's outputs do not list, with their types. */
export function stateOnlyOutputs(config: ModelConfig): Array<{ name: string; datatype: DataType }> {
  return (config.sequence_batching?.state ?? [])
    .filter((state) => !config.output.some((output) => output.name === state.output_name))
    .map((state) => ({ name: state.output_name, datatype: fromConfigDataType(state.data_type) }));
}

/**
 * What a warmup sample of a stateful model gets beside its inputs: each row a whole sequence of
 * one request (START and END, READY, id 1) from the initial state.
 */
export function warmupSequenceInputs(config: ModelConfig, modelDir: string, numRows: number): TensorMap {
  if (config.sequence_batching === undefined) return {};
  const batched = config.max_batch_size > 0;
  const rows: ControlRow[] = Array.from({ length: numRows }, () => ({ ready: true, start: true, end: true, id: 1n }));
  const inputs: TensorMap = {};
  for (const spec of controlSpecs(config)) inputs[spec.name] = controlTensor(spec, rows, batched);
  for (const state of stateSpecs(config, modelDir)) inputs[state.inputName] = batched ? concatBatch(rows.map(() => state.initial)) : state.initial;
  return inputs;
}
