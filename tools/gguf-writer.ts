// Writes a GGUF file (version 3, little-endian: ggml's docs/gguf.md): the header, the metadata
// key-value pairs, the tensor infos, then each tensor's data at an offset aligned to 32 bytes.
// Tensors are read one at a time as they are written, so memory stays near the largest one.
import { closeSync, openSync, writeSync } from 'node:fs';
import { GGML_TYPES, type GgmlTypeName } from '../gguf.ts';

const GGUF_MAGIC = 0x46554747; // "GGUF" read as a little-endian uint32
const GGUF_VERSION = 3;
const ALIGNMENT_BYTES = 32;

/** gguf_metadata_value_type */
const ValueType = { uint32: 4, int32: 5, float32: 6, bool: 7, string: 8, array: 9 } as const;

export type GgufValue =
  | { type: 'uint32' | 'int32' | 'float32'; value: number }
  | { type: 'bool'; value: boolean }
  | { type: 'string'; value: string }
  | { type: 'string[]'; value: readonly string[] }
  | { type: 'int32[]'; value: readonly number[] }
  | { type: 'float32[]'; value: readonly number[] };

export type { GgmlTypeName } from '../gguf.ts';

export interface GgufTensor {
  name: string;
  /** As PyTorch and safetensors order them, outermost first (GGUF stores them innermost first). */
  shape: readonly number[];
  type: GgmlTypeName;
  /** The tensor's bytes in row-major order (rows of whole blocks); called once, when the tensor is written. */
  data(): Uint8Array;
}

/** Appends little-endian values to a growing buffer. */
class ByteWriter {
  private buffer = Buffer.alloc(1 << 16);
  length = 0;

  private reserve(numBytes: number): void {
    if (this.length + numBytes <= this.buffer.length) return;
    const grown = Buffer.alloc(Math.max(this.buffer.length * 2, this.length + numBytes));
    this.buffer.copy(grown, 0, 0, this.length);
    this.buffer = grown;
  }

  u32(value: number): void {
    this.reserve(4);
    this.length = this.buffer.writeUInt32LE(value, this.length);
  }

  i32(value: number): void {
    this.reserve(4);
    this.length = this.buffer.writeInt32LE(value, this.length);
  }

  u64(value: number | bigint): void {
    this.reserve(8);
    this.length = this.buffer.writeBigUInt64LE(BigInt(value), this.length);
  }

  f32(value: number): void {
    this.reserve(4);
    this.length = this.buffer.writeFloatLE(value, this.length);
  }

  u8(value: number): void {
    this.reserve(1);
    this.length = this.buffer.writeUInt8(value, this.length);
  }

  string(value: string): void {
    const bytes = Buffer.from(value, 'utf8');
    this.u64(bytes.length);
    this.reserve(bytes.length);
    this.length += bytes.copy(this.buffer, this.length);
  }

  padTo(alignment: number): void {
    const padding = (alignment - (this.length % alignment)) % alignment;
    this.reserve(padding);
    this.buffer.fill(0, this.length, this.length + padding);
    this.length += padding;
  }

  bytes(): Buffer {
    return this.buffer.subarray(0, this.length);
  }
}

function writeValue(out: ByteWriter, value: GgufValue): void {
  switch (value.type) {
    case 'uint32':
      out.u32(ValueType.uint32);
      return out.u32(value.value);
    case 'int32':
      out.u32(ValueType.int32);
      return out.i32(value.value);
    case 'float32':
      out.u32(ValueType.float32);
      return out.f32(value.value);
    case 'bool':
      out.u32(ValueType.bool);
      return out.u8(value.value ? 1 : 0);
    case 'string':
      out.u32(ValueType.string);
      return out.string(value.value);
    case 'string[]':
      out.u32(ValueType.array);
      out.u32(ValueType.string);
      out.u64(value.value.length);
      for (const item of value.value) out.string(item);
      return;
    case 'int32[]':
      out.u32(ValueType.array);
      out.u32(ValueType.int32);
      out.u64(value.value.length);
      for (const item of value.value) out.i32(item);
      return;
    case 'float32[]':
      out.u32(ValueType.array);
      out.u32(ValueType.float32);
      out.u64(value.value.length);
      for (const item of value.value) out.f32(item);
      return;
  }
}

function writeAll(fd: number, bytes: Uint8Array): void {
  for (let written = 0; written < bytes.length; ) written += writeSync(fd, bytes, written);
}

function numBytesOf(tensor: GgufTensor): number {
  const { blockElements, blockBytes } = GGML_TYPES[tensor.type];
  return (tensor.shape.reduce((product, dim) => product * dim, 1) / blockElements) * blockBytes;
}

/** Writes metadata (in the given order) and tensors to file. */
export function writeGguf(file: string, metadata: ReadonlyArray<readonly [string, GgufValue]>, tensors: readonly GgufTensor[]): void {
  const header = new ByteWriter();
  header.u32(GGUF_MAGIC);
  header.u32(GGUF_VERSION);
  header.u64(tensors.length);
  header.u64(metadata.length);
  for (const [key, value] of metadata) {
    header.string(key);
    writeValue(header, value);
  }
  let offset = 0;
  const offsets: number[] = [];
  for (const tensor of tensors) {
    header.string(tensor.name);
    header.u32(tensor.shape.length);
    for (let dim = tensor.shape.length - 1; dim >= 0; dim--) header.u64(tensor.shape[dim]);
    header.u32(GGML_TYPES[tensor.type].id);
    header.u64(offset);
    offsets.push(offset);
    offset += numBytesOf(tensor);
    offset += (ALIGNMENT_BYTES - (offset % ALIGNMENT_BYTES)) % ALIGNMENT_BYTES;
  }
  header.padTo(ALIGNMENT_BYTES);
  const fd = openSync(file, 'w');
  try {
    writeAll(fd, header.bytes());
    const dataStart = header.length;
    let position = dataStart;
    for (const [index, tensor] of tensors.entries()) {
      const bytes = tensor.data();
      if (bytes.length !== numBytesOf(tensor)) {
        throw new Error(`${tensor.name}: ${bytes.length} bytes of data for shape [${tensor.shape.join(', ')}] of ${tensor.type}, which needs ${numBytesOf(tensor)}`);
      }
      const padding = dataStart + offsets[index] - position;
      if (padding > 0) writeAll(fd, new Uint8Array(padding));
      writeAll(fd, bytes);
      position += padding + bytes.length;
    }
  } finally {
    closeSync(fd);
  }
}
