// Tensors as plain data: a datatype, a shape and a flat row-major array. Fixed-size types are
// typed arrays (BOOL as 0/1 bytes, FP16/BF16 as their raw 16-bit patterns, 64-bit integers as
// bigint arrays); BYTES is one Uint8Array per element. Conversions from and to the wire forms
// (JSON `data`, binary/raw little-endian buffers) live here and throw TensorError on bad input.
import { bytesPerElement, type DataType } from './datatype.ts';

export type FixedData =
  | Uint8Array | Int8Array | Uint16Array | Int16Array | Uint32Array | Int32Array
  | BigUint64Array | BigInt64Array | Float32Array | Float64Array;
export type TensorData = FixedData | Uint8Array[];

export interface Tensor {
  datatype: DataType;
  shape: number[];
  data: TensorData;
}

export class TensorError extends Error {
  override name = 'TensorError';
}

export function elementCount(shape: readonly number[]): number {
  let count = 1;
  for (const dim of shape) count *= dim;
  return count;
}

type FixedCtor = { new (length: number): FixedData; new (buffer: ArrayBuffer, byteOffset: number, length: number): FixedData };

function fixedCtor(type: Exclude<DataType, 'BYTES'>): FixedCtor {
  switch (type) {
    case 'BOOL': case 'UINT8': return Uint8Array as unknown as FixedCtor;
    case 'INT8': return Int8Array as unknown as FixedCtor;
    case 'UINT16': case 'FP16': case 'BF16': return Uint16Array as unknown as FixedCtor;
    case 'INT16': return Int16Array as unknown as FixedCtor;
    case 'UINT32': return Uint32Array as unknown as FixedCtor;
    case 'INT32': return Int32Array as unknown as FixedCtor;
    case 'UINT64': return BigUint64Array as unknown as FixedCtor;
    case 'INT64': return BigInt64Array as unknown as FixedCtor;
    case 'FP32': return Float32Array as unknown as FixedCtor;
    case 'FP64': return Float64Array as unknown as FixedCtor;
  }
}

export function allocate(datatype: DataType, numElements: number): TensorData {
  if (datatype === 'BYTES') return new Array<Uint8Array>(numElements).fill(new Uint8Array(0));
  return new (fixedCtor(datatype))(numElements);
}

/** Reads a little-endian buffer (the binary extension, raw_input_contents); BYTES elements are uint32 length + bytes. */
export function fromRaw(datatype: DataType, shape: number[], raw: Uint8Array, what: string): Tensor {
  const numElements = elementCount(shape);
  if (datatype === 'BYTES') {
    const data: Uint8Array[] = [];
    const view = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
    let offset = 0;
    while (offset < raw.byteLength) {
      if (offset + 4 > raw.byteLength) throw new TensorError(`${what}: BYTES element ${data.length} has a truncated length prefix`);
      const numBytes = view.getUint32(offset, true);
      offset += 4;
      if (offset + numBytes > raw.byteLength) throw new TensorError(`${what}: BYTES element ${data.length} is longer than its data`);
      data.push(raw.subarray(offset, offset + numBytes));
      offset += numBytes;
    }
    if (data.length !== numElements) {
      throw new TensorError(`${what}: expected ${numElements} BYTES elements for shape [${shape.join(',')}], got ${data.length}`);
    }
    return { datatype, shape, data };
  }
  const numBytes = numElements * bytesPerElement(datatype);
  if (raw.byteLength !== numBytes) {
    throw new TensorError(`${what}: expected ${numBytes} bytes of ${datatype} for shape [${shape.join(',')}], got ${raw.byteLength}`);
  }
  // Copied into an aligned buffer of its own: wire buffers are shared and unaligned.
  const copy = new Uint8Array(numBytes);
  copy.set(raw);
  return { datatype, shape, data: new (fixedCtor(datatype))(copy.buffer, 0, numElements) };
}

export function rawByteLength(tensor: Tensor): number {
  if (tensor.datatype !== 'BYTES') return (tensor.data as FixedData).byteLength;
  let numBytes = 0;
  for (const element of tensor.data as Uint8Array[]) numBytes += 4 + element.byteLength;
  return numBytes;
}

/** Writes the tensor's little-endian bytes into out at offset; returns the offset after them. */
export function writeRaw(tensor: Tensor, out: Uint8Array, offset: number): number {
  if (tensor.datatype !== 'BYTES') {
    const data = tensor.data as FixedData;
    out.set(new Uint8Array(data.buffer, data.byteOffset, data.byteLength), offset);
    return offset + data.byteLength;
  }
  const view = new DataView(out.buffer, out.byteOffset, out.byteLength);
  for (const element of tensor.data as Uint8Array[]) {
    view.setUint32(offset, element.byteLength, true);
    out.set(element, offset + 4);
    offset += 4 + element.byteLength;
  }
  return offset;
}

export function toRaw(tensor: Tensor): Buffer {
  const out = Buffer.allocUnsafe(rawByteLength(tensor));
  writeRaw(tensor, out, 0);
  return out;
}

/**
 * Appends data's leaves to out, row-major. With an explicit stack: JSON nests as deep as a
 * client likes, and recursion would overflow the call stack (a 500) on an array 10^5 deep.
 */
function flatten(data: unknown, out: unknown[]): void {
  const stack: { items: unknown[]; next: number }[] = [];
  let current: unknown = data;
  for (;;) {
    if (Array.isArray(current)) {
      stack.push({ items: current, next: 0 });
    } else {
      out.push(current);
    }
    let top = stack.at(-1);
    while (top !== undefined && top.next === top.items.length) {
      stack.pop();
      top = stack.at(-1);
    }
    if (top === undefined) return;
    current = top.items[top.next++];
  }
}

/** An element for an error message: a scalar as JSON, a container by its kind (it may nest too deep to print). */
function describe(value: unknown): string {
  if (value === null || typeof value !== 'object') return JSON.stringify(value) ?? String(value);
  return Array.isArray(value) ? 'an array' : 'an object';
}

/** The largest finite float32. */
const FP32_MAX = 3.4028234663852886e38;

const INTEGER_RANGES: Partial<Record<DataType, [number, number]>> = {
  UINT8: [0, 0xff], UINT16: [0, 0xffff], UINT32: [0, 0xffffffff],
  INT8: [-0x80, 0x7f], INT16: [-0x8000, 0x7fff], INT32: [-0x80000000, 0x7fffffff],
};

/** Reads JSON `data`, flat or nested, row-major. FP16 and BF16 travel only in binary, as in Triton. */
export function fromJson(datatype: DataType, shape: number[], data: unknown, what: string): Tensor {
  if (datatype === 'FP16' || datatype === 'BF16') {
    throw new TensorError(`${what}: ${datatype} data must use the binary tensor extension, not JSON`);
  }
  const values: unknown[] = [];
  flatten(data, values);
  const numElements = elementCount(shape);
  if (values.length !== numElements) {
    throw new TensorError(`${what}: expected ${numElements} elements for shape [${shape.join(',')}], got ${values.length}`);
  }
  const bad = (index: number, expected: string) =>
    new TensorError(`${what}: element ${index} is ${describe(values[index])}; expected ${expected} for ${datatype}`);
  if (datatype === 'BYTES') {
    const encoder = new TextEncoder();
    return {
      datatype, shape,
      data: values.map((value, i) => {
        if (typeof value !== 'string') throw bad(i, 'a string');
        return encoder.encode(value);
      }),
    };
  }
  const out = allocate(datatype, numElements) as FixedData;
  if (datatype === 'BOOL') {
    for (let i = 0; i < numElements; i++) {
      if (typeof values[i] !== 'boolean') throw bad(i, 'true or false');
      out[i] = values[i] ? 1 : 0;
    }
  } else if (datatype === 'INT64' || datatype === 'UINT64') {
    const min = datatype === 'INT64' ? -(2n ** 63n) : 0n;
    const max = datatype === 'INT64' ? 2n ** 63n - 1n : 2n ** 64n - 1n;
    for (let i = 0; i < numElements; i++) {
      const value = values[i];
      if (typeof value !== 'number' || !Number.isInteger(value) || BigInt(value) < min || BigInt(value) > max) throw bad(i, 'an integer in range');
      (out as BigInt64Array)[i] = BigInt(value);
    }
  } else if (datatype === 'FP32' || datatype === 'FP64') {
    // JSON has no infinities: 1e400 parses as one, and a number past FP32's largest becomes one as FP32.
    const maxMagnitude = datatype === 'FP32' ? FP32_MAX : Number.MAX_VALUE;
    for (let i = 0; i < numElements; i++) {
      const value = values[i];
      if (typeof value !== 'number' || !(Math.abs(value) <= maxMagnitude)) throw bad(i, `a finite number within ±${maxMagnitude}`);
      out[i] = value;
    }
  } else {
    const [min, max] = INTEGER_RANGES[datatype]!;
    for (let i = 0; i < numElements; i++) {
      const value = values[i];
      if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) throw bad(i, `an integer in [${min}, ${max}]`);
      out[i] = value;
    }
  }
  return { datatype, shape, data: out };
}

/** The flat JSON `data` of a tensor; BYTES elements as UTF-8 strings, 64-bit integers as numbers. */
export function toJson(tensor: Tensor): Array<number | boolean | string> {
  const { datatype, data } = tensor;
  if (datatype === 'FP16' || datatype === 'BF16') {
    throw new TensorError(`${datatype} output must be requested with binary_data: true`);
  }
  if (datatype === 'BYTES') {
    const decoder = new TextDecoder();
    return (data as Uint8Array[]).map((element) => decoder.decode(element));
  }
  if (datatype === 'BOOL') return Array.from(data as Uint8Array, (value) => value !== 0);
  if (datatype === 'INT64' || datatype === 'UINT64') return Array.from(data as BigInt64Array, (value) => Number(value));
  return Array.from(data as Float32Array);
}

/**
 * Joins tensors of one datatype along dim 0. Tensors whose other dims differ (a ragged input)
 * join flat, into one dim of all their elements, as Triton hands ragged batches to a backend.
 */
export function concatBatch(tensors: readonly Tensor[]): Tensor {
  if (tensors.length === 1) return tensors[0];
  const first = tensors[0];
  const rowShape = first.shape.slice(1).join(',');
  let batchSize = 0;
  let numElements = 0;
  let ragged = false;
  for (const tensor of tensors) {
    batchSize += tensor.shape[0];
    numElements += tensor.data.length;
    if (tensor.shape.slice(1).join(',') !== rowShape) ragged = true;
  }
  const shape = ragged ? [numElements] : [batchSize, ...first.shape.slice(1)];
  if (first.datatype === 'BYTES') {
    return { datatype: first.datatype, shape, data: tensors.flatMap((tensor) => tensor.data as Uint8Array[]) };
  }
  const out = allocate(first.datatype, numElements) as FixedData;
  let offset = 0;
  for (const tensor of tensors) {
    (out as Uint8Array).set(tensor.data as Uint8Array, offset);
    offset += tensor.data.length;
  }
  return { datatype: first.datatype, shape, data: out };
}

/** Rows [start, start + numRows) of dim 0, sharing the data (no copy). */
export function sliceBatch(tensor: Tensor, start: number, numRows: number): Tensor {
  const rowElements = elementCount(tensor.shape.slice(1));
  const from = start * rowElements;
  const to = from + numRows * rowElements;
  const data = tensor.datatype === 'BYTES'
    ? (tensor.data as Uint8Array[]).slice(from, to)
    : (tensor.data as FixedData).subarray(from, to);
  return { datatype: tensor.datatype, shape: [numRows, ...tensor.shape.slice(1)], data };
}
