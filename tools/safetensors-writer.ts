// Writes safetensors files tensor by tensor: the header is known from the specs alone, so each
// tensor's data is produced, encoded and written before the next one exists. That keeps a
// 125M-parameter checkpoint within one tensor's worth of memory.
import { closeSync, ftruncateSync, openSync, writeSync } from 'node:fs';

/** U8 tensors (MXFP4 blocks and scales) are written as the bytes given. */
export type WriteDtype = 'F32' | 'BF16' | 'F16' | 'U8';

export interface TensorSpec {
  name: string;
  dtype: WriteDtype;
  shape: number[];
}

const WRITE_DTYPE_BYTES: Readonly<Record<WriteDtype, number>> = { F32: 4, BF16: 2, F16: 2, U8: 1 };

export function numElements(shape: readonly number[]): number {
  return shape.reduce((product, d) => product * d, 1);
}

export function tensorBytes(spec: TensorSpec): number {
  return numElements(spec.shape) * WRITE_DTYPE_BYTES[spec.dtype];
}

/**
 * Writes `specs` in order; `dataFor(spec)` supplies each tensor's values as fp32, which are
 * rounded to the spec's dtype to nearest, ties to even (a U8 tensor's bytes as they are).
 * Returns the data section's size.
 */
export function writeSafetensors(
  file: string,
  specs: readonly TensorSpec[],
  dataFor: (spec: TensorSpec) => Float32Array | Uint8Array,
  metadata: Record<string, string> = {},
): number {
  const header = encodeHeader(specs, metadata);
  const fd = openSync(file, 'w');
  try {
    writeAll(fd, header);
    for (const spec of specs) {
      const data = dataFor(spec);
      const expected = numElements(spec.shape);
      if (data.length !== expected) {
        throw new Error(`${file}: tensor ${spec.name} has ${data.length} values but shape [${spec.shape.join(', ')}] needs ${expected}`);
      }
      if ((spec.dtype === 'U8') !== data instanceof Uint8Array) throw new Error(`${file}: tensor ${spec.name} is ${spec.dtype}; its data must be ${spec.dtype === 'U8' ? 'bytes' : 'fp32 values'}`);
      writeAll(fd, data instanceof Uint8Array ? data : encodeTensor(data, spec.dtype as Exclude<WriteDtype, 'U8'>));
    }
  } finally {
    closeSync(fd);
  }
  return specs.reduce((sum, spec) => sum + tensorBytes(spec), 0);
}

/**
 * The header, then a data section of zeros left as a hole (ftruncate): a file of any declared
 * size that costs no disk, for tests of how big a checkpoint is rather than what it computes.
 * Returns the data section's size.
 */
export function writeSparseSafetensors(file: string, specs: readonly TensorSpec[], metadata: Record<string, string> = {}): number {
  const header = encodeHeader(specs, metadata);
  const dataBytes = specs.reduce((sum, spec) => sum + tensorBytes(spec), 0);
  const fd = openSync(file, 'w');
  try {
    writeAll(fd, header);
    ftruncateSync(fd, header.length + dataBytes);
  } finally {
    closeSync(fd);
  }
  return dataBytes;
}

/** Length prefix plus JSON, padded with spaces so the data section starts 8-byte aligned, as the reference writer does. */
function encodeHeader(specs: readonly TensorSpec[], metadata: Record<string, string>): Buffer {
  const entries: Record<string, unknown> = {};
  if (Object.keys(metadata).length > 0) entries.__metadata__ = metadata;
  let offset = 0;
  for (const spec of specs) {
    if (Object.hasOwn(entries, spec.name)) throw new Error(`duplicate tensor name ${spec.name}`);
    const end = offset + tensorBytes(spec);
    entries[spec.name] = { dtype: spec.dtype, shape: spec.shape, data_offsets: [offset, end] };
    offset = end;
  }
  const json = Buffer.from(JSON.stringify(entries), 'utf8');
  const paddedLength = Math.ceil(json.length / 8) * 8;
  const out = Buffer.alloc(8 + paddedLength, 0x20);
  out.writeBigUInt64LE(BigInt(paddedLength), 0);
  json.copy(out, 8);
  return out;
}

function encodeTensor(data: Float32Array, dtype: Exclude<WriteDtype, 'U8'>): Uint8Array {
  if (dtype === 'F32') return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  const bits = new Uint32Array(data.buffer, data.byteOffset, data.length);
  const round = dtype === 'BF16' ? roundF32BitsToBf16Bits : roundF32BitsToF16Bits;
  const out = new Uint16Array(data.length);
  for (let i = 0; i < bits.length; i++) out[i] = round(bits[i]);
  return new Uint8Array(out.buffer);
}

function writeAll(fd: number, bytes: Uint8Array): void {
  let numWritten = 0;
  while (numWritten < bytes.byteLength) numWritten += writeSync(fd, bytes, numWritten, bytes.byteLength - numWritten);
}

/** fp32 bits → bf16 bits, round to nearest even; NaN stays a (quiet) NaN of the same sign. */
export function roundF32BitsToBf16Bits(bits: number): number {
  if ((bits & 0x7f800000) === 0x7f800000 && (bits & 0x7fffff) !== 0) return (bits >>> 16) | 0x40;
  // Adding 0x7fff plus the kept lsb carries exactly when the dropped half is above the midpoint,
  // or at it with an odd kept half; a carry out of the mantissa correctly bumps the exponent.
  return ((bits + 0x7fff + ((bits >>> 16) & 1)) >>> 16) & 0xffff;
}

/** fp32 bits → IEEE binary16 bits, round to nearest even, with subnormals, overflow to inf, NaN kept. */
export function roundF32BitsToF16Bits(bits: number): number {
  const sign = (bits >>> 16) & 0x8000;
  const exponent = (bits >>> 23) & 0xff;
  const mantissa = bits & 0x7fffff;
  if (exponent === 0xff) return sign | 0x7c00 | (mantissa !== 0 ? 0x200 | (mantissa >>> 13) : 0);
  const halfExponent = exponent - 127 + 15;
  if (halfExponent >= 0x1f) return sign | 0x7c00;
  if (halfExponent >= 1) return sign | roundShift((halfExponent << 23) | mantissa, 13);
  // Below the normal range the result is a subnormal m · 2^-24 with m = significand >> (14 - halfExponent);
  // anything under half the smallest subnormal rounds to zero.
  const shift = 14 - halfExponent;
  if (shift > 24) return sign;
  return sign | roundShift(mantissa | 0x800000, shift);
}

/** value >> shift, rounded to nearest even. A carry into the exponent field is the right answer. */
function roundShift(value: number, shift: number): number {
  const kept = value >>> shift;
  const dropped = value & ((1 << shift) - 1);
  const half = 1 << (shift - 1);
  return dropped > half || (dropped === half && (kept & 1) === 1) ? kept + 1 : kept;
}
