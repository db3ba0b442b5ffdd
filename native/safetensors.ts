// Reads the safetensors format: an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__"?: {string: string}},
// then the tensor bytes. Offsets in the JSON are relative to the data section; this module
// turns them into absolute file offsets so callers can mmap or pread without arithmetic.
// Validation is strict because the C++ runtime trusts what passes here.
import { closeSync, existsSync, fstatSync, openSync, readFileSync, readSync } from 'node:fs';
import path from 'node:path';

export type SafetensorsDtype =
  | 'BOOL'
  | 'U8'
  | 'I8'
  | 'F8_E5M2'
  | 'F8_E4M3'
  | 'I16'
  | 'U16'
  | 'F16'
  | 'BF16'
  | 'I32'
  | 'U32'
  | 'F32'
  | 'F64'
  | 'I64'
  | 'U64';

export const DTYPE_BYTES: Readonly<Record<SafetensorsDtype, number>> = {
  BOOL: 1,
  U8: 1,
  I8: 1,
  F8_E5M2: 1,
  F8_E4M3: 1,
  I16: 2,
  U16: 2,
  F16: 2,
  BF16: 2,
  I32: 4,
  U32: 4,
  F32: 4,
  F64: 8,
  I64: 8,
  U64: 8,
};

export interface TensorInfo {
  dtype: SafetensorsDtype;
  shape: number[];
  /** Absolute byte offset of the first element in the file. */
  dataBegin: number;
  /** Absolute byte offset one past the last element. */
  dataEnd: number;
}

export interface SafetensorsHeader {
  file: string;
  /** 8 + the JSON length: where the data section starts. */
  headerBytes: number;
  tensors: Map<string, TensorInfo>;
  metadata: Record<string, string>;
}

/** The reference implementation refuses headers above 100 MB; so do we. */
const MAX_HEADER_JSON_BYTES = 100_000_000;

export function readSafetensorsHeader(file: string): SafetensorsHeader {
  const fd = openOrThrow(file);
  try {
    const fileBytes = fstatSync(fd).size;
    if (fileBytes < 8) throw new Error(`${file}: file is ${fileBytes} bytes, too short for the 8-byte header length`);
    const lengthBytes = Buffer.alloc(8);
    readSync(fd, lengthBytes, 0, 8, 0);
    const jsonBytes = lengthBytes.readBigUInt64LE(0);
    if (jsonBytes > BigInt(MAX_HEADER_JSON_BYTES)) {
      throw new Error(`${file}: header length ${jsonBytes} exceeds ${MAX_HEADER_JSON_BYTES} bytes`);
    }
    const headerJsonBytes = Number(jsonBytes);
    if (8 + headerJsonBytes > fileBytes) {
      throw new Error(`${file}: header length ${headerJsonBytes} runs past the end of the ${fileBytes}-byte file`);
    }
    const json = Buffer.alloc(headerJsonBytes);
    readSync(fd, json, 0, headerJsonBytes, 8);
    let parsed: unknown;
    try {
      parsed = JSON.parse(json.toString('utf8'));
    } catch (err) {
      throw new Error(`${file}: header is not valid JSON: ${(err as Error).message}`);
    }
    return parseHeader(file, parsed, 8 + headerJsonBytes, fileBytes);
  } finally {
    closeSync(fd);
  }
}

function openOrThrow(file: string): number {
  try {
    return openSync(file, 'r');
  } catch (err) {
    throw new Error(`${file}: cannot open: ${(err as Error).message}`);
  }
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function parseHeader(file: string, parsed: unknown, headerBytes: number, fileBytes: number): SafetensorsHeader {
  if (!isPlainObject(parsed)) throw new Error(`${file}: header must be a JSON object`);
  const metadata = parseMetadata(file, parsed.__metadata__);
  const dataBytes = fileBytes - headerBytes;
  const tensors = new Map<string, TensorInfo>();
  for (const [name, entry] of Object.entries(parsed)) {
    if (name === '__metadata__') continue;
    const info = parseTensorEntry(file, name, entry, dataBytes);
    tensors.set(name, { ...info, dataBegin: info.dataBegin + headerBytes, dataEnd: info.dataEnd + headerBytes });
  }
  rejectOverlaps(file, tensors);
  return { file, headerBytes, tensors, metadata };
}

function parseMetadata(file: string, raw: unknown): Record<string, string> {
  if (raw === undefined) return {};
  if (!isPlainObject(raw)) throw new Error(`${file}: __metadata__ must be an object of strings`);
  for (const [key, value] of Object.entries(raw)) {
    if (typeof value !== 'string') throw new Error(`${file}: __metadata__.${key} must be a string`);
  }
  return raw as Record<string, string>;
}

/** Returns offsets relative to the data section; the caller makes them absolute. */
function parseTensorEntry(file: string, name: string, entry: unknown, dataBytes: number): TensorInfo {
  const where = `${file}: tensor ${JSON.stringify(name)}`;
  if (!isPlainObject(entry)) throw new Error(`${where}: entry must be an object`);
  const { dtype, shape, data_offsets: offsets } = entry;
  if (typeof dtype !== 'string' || !Object.hasOwn(DTYPE_BYTES, dtype)) {
    throw new Error(`${where}: dtype ${JSON.stringify(dtype)} is not a safetensors dtype`);
  }
  if (!Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
    throw new Error(`${where}: shape ${JSON.stringify(shape)} must be an array of non-negative integers`);
  }
  if (
    !Array.isArray(offsets) ||
    offsets.length !== 2 ||
    !offsets.every((o) => Number.isSafeInteger(o) && o >= 0) ||
    offsets[0] > offsets[1]
  ) {
    throw new Error(`${where}: data_offsets ${JSON.stringify(offsets)} must be [begin, end] with 0 <= begin <= end`);
  }
  const [begin, end] = offsets as [number, number];
  const numElements = shape.reduce((product: number, d: number) => product * d, 1);
  const expectedBytes = numElements * DTYPE_BYTES[dtype as SafetensorsDtype];
  if (end - begin !== expectedBytes) {
    throw new Error(
      `${where}: data_offsets span ${end - begin} bytes but shape [${shape.join(', ')}] of ${dtype} needs ${expectedBytes}`,
    );
  }
  if (end > dataBytes) {
    throw new Error(`${where}: data ends at byte ${end} of the data section but the file holds only ${dataBytes} (truncated file?)`);
  }
  return { dtype: dtype as SafetensorsDtype, shape: shape as number[], dataBegin: begin, dataEnd: end };
}

function rejectOverlaps(file: string, tensors: Map<string, TensorInfo>): void {
  const byBegin = [...tensors].filter(([, t]) => t.dataEnd > t.dataBegin).sort(([, a], [, b]) => a.dataBegin - b.dataBegin);
  for (let i = 1; i < byBegin.length; i++) {
    const [prevName, prev] = byBegin[i - 1];
    const [name, info] = byBegin[i];
    if (info.dataBegin < prev.dataEnd) {
      throw new Error(`${file}: tensor ${JSON.stringify(name)} overlaps tensor ${JSON.stringify(prevName)}`);
    }
  }
}

/** Reads one tensor widened to fp64. F32, BF16 and F16 widen exactly; no value is re-rounded. */
export function readTensorF64(file: string, header: SafetensorsHeader, name: string): Float64Array {
  const info = header.tensors.get(name);
  if (info === undefined) throw new Error(`${file}: no tensor ${JSON.stringify(name)}`);
  const bytes = readTensorBytes(file, info);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const numElements = bytes.byteLength / DTYPE_BYTES[info.dtype];
  const out = new Float64Array(numElements);
  switch (info.dtype) {
    case 'F64':
      for (let i = 0; i < numElements; i++) out[i] = view.getFloat64(i * 8, true);
      break;
    case 'F32':
      for (let i = 0; i < numElements; i++) out[i] = view.getFloat32(i * 4, true);
      break;
    case 'BF16':
      for (let i = 0; i < numElements; i++) out[i] = bf16BitsToNumber(view.getUint16(i * 2, true));
      break;
    case 'F16':
      for (let i = 0; i < numElements; i++) out[i] = f16BitsToNumber(view.getUint16(i * 2, true));
      break;
    default:
      throw new Error(`${file}: tensor ${JSON.stringify(name)} has dtype ${info.dtype}; only F64, F32, BF16 and F16 widen to fp64`);
  }
  return out;
}

/** A tensor's bytes as stored (U8 tensors, such as MXFP4 blocks and scales, are read this way). */
export function readTensorBytes(file: string, info: TensorInfo): Buffer {
  const numBytes = info.dataEnd - info.dataBegin;
  const bytes = Buffer.alloc(numBytes);
  const fd = openOrThrow(file);
  try {
    let numRead = 0;
    while (numRead < numBytes) {
      const n = readSync(fd, bytes, numRead, numBytes - numRead, info.dataBegin + numRead);
      if (n === 0) throw new Error(`${file}: file ends ${numBytes - numRead} bytes before the tensor data does (truncated?)`);
      numRead += n;
    }
  } finally {
    closeSync(fd);
  }
  return bytes;
}

const widenScratch = new DataView(new ArrayBuffer(4));

/** bf16 is the upper 16 bits of an fp32. */
export function bf16BitsToNumber(bits: number): number {
  widenScratch.setUint32(0, bits << 16);
  return widenScratch.getFloat32(0);
}

/** IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. */
export function f16BitsToNumber(bits: number): number {
  const sign = bits & 0x8000 ? -1 : 1;
  const exponent = (bits >> 10) & 0x1f;
  const mantissa = bits & 0x3ff;
  if (exponent === 0) return sign * mantissa * 2 ** -24;
  if (exponent === 0x1f) return mantissa === 0 ? sign * Infinity : NaN;
  return sign * (1 + mantissa / 1024) * 2 ** (exponent - 15);
}

export interface CheckpointTensor extends TensorInfo {
  /** The shard that holds it. */
  file: string;
}

export interface CheckpointTensors {
  /** Every shard's header, by absolute path, in the order they were read. */
  headers: Map<string, SafetensorsHeader>;
  tensors: Map<string, CheckpointTensor>;
}

export const SINGLE_FILE_NAME = 'model.safetensors';
export const INDEX_FILE_NAME = 'model.safetensors.index.json';

/**
 * Lists the tensors of a Hugging Face checkpoint directory: model.safetensors, or the shards
 * named by model.safetensors.index.json's weight_map.
 */
export function readCheckpointTensors(dir: string): CheckpointTensors {
  const indexFile = path.join(dir, INDEX_FILE_NAME);
  if (existsSync(indexFile)) return readShardedTensors(dir, indexFile);
  const singleFile = path.join(dir, SINGLE_FILE_NAME);
  if (!existsSync(singleFile)) throw new Error(`${dir}: neither ${SINGLE_FILE_NAME} nor ${INDEX_FILE_NAME} exists`);
  const header = readSafetensorsHeader(singleFile);
  const tensors = new Map<string, CheckpointTensor>();
  for (const [name, info] of header.tensors) tensors.set(name, { ...info, file: singleFile });
  return { headers: new Map([[singleFile, header]]), tensors };
}

function readShardedTensors(dir: string, indexFile: string): CheckpointTensors {
  const weightMap = readWeightMap(indexFile);
  const headers = new Map<string, SafetensorsHeader>();
  const tensors = new Map<string, CheckpointTensor>();
  for (const [name, shardName] of Object.entries(weightMap)) {
    const shardFile = path.join(dir, shardName);
    let header = headers.get(shardFile);
    if (header === undefined) {
      if (!existsSync(shardFile)) throw new Error(`${indexFile}: shard ${shardName} (holding ${JSON.stringify(name)}) does not exist`);
      header = readSafetensorsHeader(shardFile);
      headers.set(shardFile, header);
    }
    const info = header.tensors.get(name);
    if (info === undefined) throw new Error(`${indexFile}: weight_map puts ${JSON.stringify(name)} in ${shardName}, which lacks it`);
    tensors.set(name, { ...info, file: shardFile });
  }
  return { headers, tensors };
}

function readWeightMap(indexFile: string): Record<string, string> {
  let parsed: unknown;
  try {
    parsed = JSON.parse(readFileSync(indexFile, 'utf8'));
  } catch (err) {
    throw new Error(`${indexFile}: cannot read as JSON: ${(err as Error).message}`);
  }
  const weightMap = isPlainObject(parsed) ? parsed.weight_map : undefined;
  if (!isPlainObject(weightMap)) throw new Error(`${indexFile}: weight_map must be an object of tensor name to shard file`);
  for (const [name, shardName] of Object.entries(weightMap)) {
    if (typeof shardName !== 'string' || shardName.includes('/') || shardName.includes('\\') || shardName.startsWith('.')) {
      throw new Error(`${indexFile}: weight_map.${name} must be a file name in the checkpoint directory`);
    }
  }
  return weightMap as Record<string, string>;
}
