// Reads a GGUF file's header (ggml's docs/gguf.md, versions 2 and 3, little-endian): the
// metadata key-value pairs and the tensor infos, with each tensor's absolute byte range. Only the
// header is read; the tensor data stay in the file for the runtime to map. Top-level, like
// package-root.ts, because three parts read GGUF headers and none may import another's internals:
// native/ (the checkpoint), the gateway (the embedded tokenizer), the engine (EOS ids). Imports only
// Node built-ins: every folder may import it.
import { closeSync, existsSync, openSync, readSync, readdirSync, statSync } from 'node:fs';
import path from 'node:path';

const GGUF_MAGIC = 0x46554747; // "GGUF" as a little-endian uint32
const DEFAULT_ALIGNMENT_BYTES = 32;
/** Header reads start here and double until the header fits (a 150 K vocabulary is a few MiB). */
const FIRST_READ_BYTES = 1 << 20;
const MAX_HEADER_BYTES = 1 << 30;

/** The ggml_type values of the tensor types Conduit loads, with their block geometry. */
export const GGML_TYPES = {
  F32: { id: 0, blockElements: 1, blockBytes: 4 },
  F16: { id: 1, blockElements: 1, blockBytes: 2 },
  Q4_0: { id: 2, blockElements: 32, blockBytes: 18 },
  Q8_0: { id: 8, blockElements: 32, blockBytes: 34 },
  Q4_K: { id: 12, blockElements: 256, blockBytes: 144 },
  Q5_K: { id: 13, blockElements: 256, blockBytes: 176 },
  Q6_K: { id: 14, blockElements: 256, blockBytes: 210 },
  BF16: { id: 30, blockElements: 1, blockBytes: 2 },
  /** gpt-oss's experts: an E8M0 scale byte and 16 bytes of E2M1 pairs per 32 (ggml-common.h's block_mxfp4). */
  MXFP4: { id: 39, blockElements: 32, blockBytes: 17 },
} as const;
export type GgmlTypeName = keyof typeof GGML_TYPES;
const TYPE_NAMES = new Map<number, GgmlTypeName>(Object.entries(GGML_TYPES).map(([name, type]) => [type.id, name as GgmlTypeName]));

export type GgufScalar = number | bigint | boolean | string;
export type GgufValue = GgufScalar | GgufScalar[];

export interface GgufTensorInfo {
  name: string;
  /** Outermost first, as PyTorch orders them (GGUF stores them innermost first). */
  shape: number[];
  type: GgmlTypeName;
  /** Absolute byte range within the file. */
  dataBegin: number;
  dataEnd: number;
}

export interface GgufHeader {
  file: string;
  version: number;
  metadata: Map<string, GgufValue>;
  tensors: Map<string, GgufTensorInfo>;
}

class TruncatedHeader extends Error {}

/** Little-endian reads over a prefix of the file; running past it throws TruncatedHeader. */
class Cursor {
  position = 0;
  private readonly utf8 = new TextDecoder('utf-8', { fatal: true });

  constructor(private readonly bytes: Buffer) {}

  private take(numBytes: number): number {
    const at = this.position;
    if (at + numBytes > this.bytes.length) throw new TruncatedHeader();
    this.position += numBytes;
    return at;
  }

  u8(): number { return this.bytes.readUInt8(this.take(1)); }
  i8(): number { return this.bytes.readInt8(this.take(1)); }
  u16(): number { return this.bytes.readUInt16LE(this.take(2)); }
  i16(): number { return this.bytes.readInt16LE(this.take(2)); }
  u32(): number { return this.bytes.readUInt32LE(this.take(4)); }
  i32(): number { return this.bytes.readInt32LE(this.take(4)); }
  f32(): number { return this.bytes.readFloatLE(this.take(4)); }
  f64(): number { return this.bytes.readDoubleLE(this.take(8)); }
  i64(): bigint { return this.bytes.readBigInt64LE(this.take(8)); }
  u64(): bigint { return this.bytes.readBigUInt64LE(this.take(8)); }

  /** A uint64 count or offset, which must fit a JavaScript number. */
  size(what: string): number {
    const value = this.u64();
    if (value > BigInt(Number.MAX_SAFE_INTEGER)) throw new Error(`${what} ${value} is out of range`);
    return Number(value);
  }

  string(): string {
    const length = this.size('a string length');
    const at = this.take(length);
    return this.utf8.decode(this.bytes.subarray(at, at + length));
  }
}

function readScalar(cursor: Cursor, type: number, key: string): GgufScalar {
  switch (type) {
    case 0: return cursor.u8();
    case 1: return cursor.i8();
    case 2: return cursor.u16();
    case 3: return cursor.i16();
    case 4: return cursor.u32();
    case 5: return cursor.i32();
    case 6: return cursor.f32();
    case 7: {
      const byte = cursor.u8();
      if (byte > 1) throw new Error(`metadata ${key}: a bool must be 0 or 1, got ${byte}`);
      return byte === 1;
    }
    case 8: return cursor.string();
    case 10: return cursor.u64();
    case 11: return cursor.i64();
    case 12: return cursor.f64();
    default: throw new Error(`metadata ${key}: unknown value type ${type}`);
  }
}

function readValue(cursor: Cursor, key: string): GgufValue {
  const type = cursor.u32();
  if (type !== 9) return readScalar(cursor, type, key);
  const itemType = cursor.u32();
  if (itemType === 9) throw new Error(`metadata ${key}: arrays of arrays are not supported`);
  const count = cursor.size(`metadata ${key}: array length`);
  const items: GgufScalar[] = [];
  for (let i = 0; i < count; i++) items.push(readScalar(cursor, itemType, key));
  return items;
}

function parseHeader(file: string, bytes: Buffer, fileBytes: number): GgufHeader {
  const cursor = new Cursor(bytes);
  if (cursor.u32() !== GGUF_MAGIC) throw new Error(`${file}: not a GGUF file (no "GGUF" magic)`);
  const version = cursor.u32();
  if (version !== 2 && version !== 3) throw new Error(`${file}: GGUF version ${version} is not supported (2 and 3 are)`);
  const numTensors = cursor.size('tensor count');
  const numKeys = cursor.size('metadata count');
  const metadata = new Map<string, GgufValue>();
  for (let i = 0; i < numKeys; i++) {
    const key = cursor.string();
    metadata.set(key, readValue(cursor, key));
  }
  const alignment = metadata.get('general.alignment') ?? DEFAULT_ALIGNMENT_BYTES;
  if (typeof alignment !== 'number' || alignment < 1 || alignment % 8 !== 0) {
    throw new Error(`${file}: general.alignment must be a positive multiple of 8, got ${String(alignment)}`);
  }
  const infos: { name: string; shape: number[]; typeId: number; offset: number }[] = [];
  for (let i = 0; i < numTensors; i++) {
    const name = cursor.string();
    const numDims = cursor.u32();
    if (numDims < 1 || numDims > 4) throw new Error(`${file}: tensor ${JSON.stringify(name)} has ${numDims} dimensions`);
    const dims: number[] = [];
    for (let d = 0; d < numDims; d++) dims.push(cursor.size(`tensor ${name}: dimension`));
    infos.push({ name, shape: dims.reverse(), typeId: cursor.u32(), offset: cursor.size(`tensor ${name}: offset`) });
  }
  const dataStart = Math.ceil(cursor.position / alignment) * alignment;
  const tensors = new Map<string, GgufTensorInfo>();
  for (const info of infos) {
    const type = TYPE_NAMES.get(info.typeId);
    const where = `${file}: tensor ${JSON.stringify(info.name)}`;
    if (type === undefined) {
      throw new Error(`${where} has ggml type ${info.typeId}; supported: ${[...TYPE_NAMES.values()].join(', ')}`);
    }
    const { blockElements, blockBytes } = GGML_TYPES[type];
    if (info.shape[info.shape.length - 1] % blockElements !== 0) {
      throw new Error(`${where}: rows of ${info.shape[info.shape.length - 1]} elements are not whole ${type} blocks of ${blockElements}`);
    }
    if (info.offset % alignment !== 0) throw new Error(`${where}: offset ${info.offset} is not a multiple of ${alignment}`);
    const numElements = info.shape.reduce((product, dim) => product * dim, 1);
    const dataBegin = dataStart + info.offset;
    const dataEnd = dataBegin + (numElements / blockElements) * blockBytes;
    if (dataEnd > fileBytes) throw new Error(`${where}: its data end at byte ${dataEnd}, past the end of the file (${fileBytes} bytes)`);
    if (tensors.has(info.name)) throw new Error(`${where} appears twice`);
    tensors.set(info.name, { name: info.name, shape: info.shape, type, dataBegin, dataEnd });
  }
  return { file, version, metadata, tensors };
}

/** Reads the header of a GGUF file; the tensor data are not read. */
export function readGgufHeader(file: string): GgufHeader {
  const fd = openSync(file, 'r');
  try {
    const fileBytes = statSync(file).size;
    for (let readBytes = FIRST_READ_BYTES; ; readBytes *= 2) {
      const bytes = Buffer.alloc(Math.min(readBytes, fileBytes));
      for (let at = 0; at < bytes.length; ) {
        const count = readSync(fd, bytes, at, bytes.length - at, at);
        if (count === 0) break;
        at += count;
      }
      try {
        return parseHeader(file, bytes, fileBytes);
      } catch (err) {
        if (!(err instanceof TruncatedHeader)) throw err;
        if (bytes.length === fileBytes || readBytes >= MAX_HEADER_BYTES) throw new Error(`${file}: the GGUF header ends past the end of the file`);
      }
    }
  } finally {
    closeSync(fd);
  }
}

/**
 * The GGUF file a model path names: the path itself when it is a file ending in .gguf, or the
 * only .gguf file of a directory without config.json. Null for a Hugging Face checkpoint.
 */
export function ggufFileOf(modelPath: string): string | null {
  const stat = statSync(modelPath, { throwIfNoEntry: false });
  if (stat === undefined) return null;
  if (stat.isFile()) return modelPath.toLowerCase().endsWith('.gguf') ? modelPath : null;
  if (!stat.isDirectory() || existsSync(path.join(modelPath, 'config.json'))) return null;
  const files = readdirSync(modelPath).filter((name) => name.toLowerCase().endsWith('.gguf')).sort();
  if (files.length > 1) throw new Error(`${modelPath}: holds ${files.length} GGUF files (${files.join(', ')}); name one`);
  return files.length === 1 ? path.join(modelPath, files[0]) : null;
}

/** Typed metadata access; each failure names the file and the key. */
export class GgufMetadata {
  constructor(readonly header: GgufHeader) {}

  has(key: string): boolean {
    return this.header.metadata.has(key);
  }

  fail(key: string, expected: string): never {
    const value = this.header.metadata.get(key);
    throw new Error(`${this.header.file}: metadata ${key} must be ${expected}, got ${value === undefined ? 'nothing' : JSON.stringify(value, (_, v) => (typeof v === 'bigint' ? String(v) : v))}`);
  }

  number(key: string, fallback?: number): number {
    const value = this.header.metadata.get(key);
    if (value === undefined && fallback !== undefined) return fallback;
    if (typeof value === 'bigint' && value <= BigInt(Number.MAX_SAFE_INTEGER) && value >= 0n) return Number(value);
    if (typeof value !== 'number' || !Number.isFinite(value)) this.fail(key, 'a number');
    return value;
  }

  string(key: string, fallback?: string): string {
    const value = this.header.metadata.get(key);
    if (value === undefined && fallback !== undefined) return fallback;
    if (typeof value !== 'string') this.fail(key, 'a string');
    return value;
  }

  bool(key: string, fallback: boolean): boolean {
    const value = this.header.metadata.get(key);
    if (value === undefined) return fallback;
    if (typeof value !== 'boolean') this.fail(key, 'true or false');
    return value;
  }

  strings(key: string): string[] | null {
    const value = this.header.metadata.get(key);
    if (value === undefined) return null;
    if (!Array.isArray(value) || !value.every((item) => typeof item === 'string')) this.fail(key, 'an array of strings');
    return value as string[];
  }

  numbers(key: string): number[] | null {
    const value = this.header.metadata.get(key);
    if (value === undefined) return null;
    if (!Array.isArray(value) || !value.every((item) => typeof item === 'number')) this.fail(key, 'an array of numbers');
    return value as number[];
  }
}
