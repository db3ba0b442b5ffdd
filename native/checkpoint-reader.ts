// The two readers every family module uses: config.json field by field, and the checkpoint's
// tensors by name with their dtype, shape and byte range checked. Every failure names the file
// and the field or tensor.
import type { WeightDtype } from './api.ts';
import type { CheckpointTensor, SafetensorsDtype } from './safetensors.ts';
import { GGML_TYPES, type GgmlTypeName } from '../gguf.ts';

type Json = Record<string, unknown>;

/** Where one weight's bytes lie and how to read them (native/include/conduit.h, cd_tensor_ref). */
export interface TensorRef {
  fileIndex: number;
  /** Absolute offset of element (0, 0). */
  offsetBytes: number;
  /** The bytes the weight spans (0 marks an absent optional tensor). */
  sizeBytes: number;
  dtype: WeightDtype;
  encoding?: Encoding;
  /** Elements between rows and between a row's elements; absent: row-major. */
  rowStride?: number;
  colStride?: number;
  scalesFileIndex?: number;
  scalesOffsetBytes?: number;
  scalesSizeBytes?: number;
  /** Rows stored in llama.cpp's rotary order, per head of this many rows (GGUF's Llama q and k). */
  rotaryPermutedHeadDim?: number;
}

/** How elements are stored: plain dtype, gpt-oss's MXFP4, or one of ggml's block types (GGUF). */
export type Encoding = 'plain' | 'mxfp4' | GgmlEncoding;
export type GgmlEncoding = 'q8_0' | 'q4_0' | 'q4_k' | 'q5_k' | 'q6_k' | 'ggml_mxfp4';
const GGML_TYPE_OF: Readonly<Record<GgmlEncoding, GgmlTypeName>> = { q8_0: 'Q8_0', q4_0: 'Q4_0', q4_k: 'Q4_K', q5_k: 'Q5_K', q6_k: 'Q6_K', ggml_mxfp4: 'MXFP4' };

export function isBlockEncoding(ref: TensorRef): boolean {
  return ref.encoding !== undefined && ref.encoding !== 'plain';
}

/** A tensor of a checkpoint; GGUF's may be ggml blocks and q/k rows in rotary order. */
export type CatalogueTensor = CheckpointTensor & { encoding?: GgmlEncoding; rotaryPermutedHeadDim?: number };

const STORED_DTYPES: Partial<Readonly<Record<SafetensorsDtype, WeightDtype>>> = { F32: 'fp32', BF16: 'bf16', F16: 'fp16' };
const DTYPE_BYTES: Readonly<Record<WeightDtype, number>> = { fp32: 4, bf16: 2, fp16: 2 };

/** Reads a config.json record field by field; each failure names the file and the field. */
export class ConfigReader {
  constructor(
    /** "DIR/config.json", or "DIR/config.json text_config" for a nested record. */
    readonly file: string,
    readonly json: Json,
  ) {}

  fail(field: string, expected: string, got: unknown = this.json[field]): never {
    throw new Error(`${this.file}: ${field} must be ${expected}, got ${JSON.stringify(got)}`);
  }

  has(field: string): boolean {
    return this.json[field] !== undefined && this.json[field] !== null;
  }

  positiveInt(field: string, fallback?: number): number {
    if (!this.has(field) && fallback !== undefined) return fallback;
    const value = this.json[field];
    if (!Number.isSafeInteger(value) || (value as number) < 1) this.fail(field, 'a positive integer');
    return value as number;
  }

  nonNegativeInt(field: string, fallback: number): number {
    if (!this.has(field)) return fallback;
    const value = this.json[field];
    if (!Number.isSafeInteger(value) || (value as number) < 0) this.fail(field, 'a non-negative integer');
    return value as number;
  }

  positiveNumber(field: string, fallback?: number): number {
    if (!this.has(field) && fallback !== undefined) return fallback;
    const value = this.json[field];
    if (typeof value !== 'number' || !(value > 0) || !Number.isFinite(value)) this.fail(field, 'a positive number');
    return value;
  }

  /** A positive number, or null when absent (soft-capping, windows). */
  optionalPositiveNumber(field: string): number | null {
    return this.has(field) ? this.positiveNumber(field) : null;
  }

  bool(field: string, fallback: boolean): boolean {
    if (!this.has(field)) return fallback;
    const value = this.json[field];
    if (typeof value !== 'boolean') this.fail(field, 'true or false');
    return value;
  }

  string(field: string, fallback: string): string {
    if (!this.has(field)) return fallback;
    const value = this.json[field];
    if (typeof value !== 'string') this.fail(field, 'a string');
    return value;
  }

  /** A nested record (rope_scaling, text_config), or null when absent. */
  record(field: string): Json | null {
    if (!this.has(field)) return null;
    const value = this.json[field];
    if (typeof value !== 'object' || Array.isArray(value)) this.fail(field, 'an object');
    return value as Json;
  }

  nested(field: string): ConfigReader {
    const record = this.record(field);
    if (record === null) this.fail(field, 'an object');
    return new ConfigReader(`${this.file} ${field}`, record!);
  }

  /** An array of integers (mlp_only_layers), or the fallback when absent. */
  intList(field: string, fallback: number[]): number[] {
    if (!this.has(field)) return fallback;
    const value = this.json[field];
    if (!Array.isArray(value) || !value.every((x) => Number.isSafeInteger(x) && x >= 0)) this.fail(field, 'a list of non-negative integers');
    return value as number[];
  }

  stringList(field: string): string[] | null {
    if (!this.has(field)) return null;
    const value = this.json[field];
    if (!Array.isArray(value) || !value.every((x) => typeof x === 'string')) this.fail(field, 'a list of strings');
    return value as string[];
  }
}

/** Looks tensors up by name and checks dtype and shape; refs index into the ordered file list. */
export class TensorCatalogue {
  readonly filePaths: string[] = [];
  private readonly fileIndices = new Map<string, number>();

  constructor(
    private readonly tensors: Map<string, CatalogueTensor>,
    /** Named in "missing tensor" errors: the index file or the single safetensors file. */
    private readonly listing: string,
  ) {}

  has(name: string): boolean {
    return this.tensors.has(name);
  }

  /** The first of the names the checkpoint holds (a tensor saved under two conventions). */
  firstPresent(names: readonly string[]): string | undefined {
    return names.find((name) => this.tensors.has(name));
  }

  require(name: string, shape: readonly number[]): TensorRef {
    const tensor = this.lookup(name, shape);
    const dtype = STORED_DTYPES[tensor.dtype];
    if (dtype === undefined) {
      throw new Error(`${tensor.file}: tensor ${JSON.stringify(name)} has dtype ${tensor.dtype}; expected F32, BF16 or F16`);
    }
    const ref: TensorRef = { fileIndex: this.fileIndexOf(tensor.file), offsetBytes: tensor.dataBegin, sizeBytes: tensor.dataEnd - tensor.dataBegin, dtype };
    if (tensor.encoding !== undefined) ref.encoding = tensor.encoding;
    if (tensor.rotaryPermutedHeadDim !== undefined) ref.rotaryPermutedHeadDim = tensor.rotaryPermutedHeadDim;
    return ref;
  }

  optional(name: string, shape: readonly number[]): TensorRef | null {
    return this.tensors.has(name) ? this.require(name, shape) : null;
  }

  /**
   * An MXFP4 matrix stack as gpt-oss ships it: `${name}_blocks` U8 [...lead, rows, k / 32, 16]
   * and `${name}_scales` U8 [...lead, rows, k / 32].
   */
  requireMxfp4(name: string, lead: readonly number[], rows: number, k: number): TensorRef {
    if (k % 32 !== 0) throw new Error(`${this.listing}: ${name}: MXFP4 rows of ${k} elements are not whole 32-element blocks`);
    const blocks = this.lookup(`${name}_blocks`, [...lead, rows, k / 32, 16], 'U8');
    const scales = this.lookup(`${name}_scales`, [...lead, rows, k / 32], 'U8');
    return {
      fileIndex: this.fileIndexOf(blocks.file),
      offsetBytes: blocks.dataBegin,
      sizeBytes: blocks.dataEnd - blocks.dataBegin,
      dtype: 'bf16',
      encoding: 'mxfp4',
      scalesFileIndex: this.fileIndexOf(scales.file),
      scalesOffsetBytes: scales.dataBegin,
      scalesSizeBytes: scales.dataEnd - scales.dataBegin,
    };
  }

  private lookup(name: string, shape: readonly number[], dtype?: SafetensorsDtype): CatalogueTensor {
    const tensor = this.tensors.get(name);
    if (tensor === undefined) throw new Error(`${this.listing}: missing tensor ${JSON.stringify(name)}`);
    if (dtype !== undefined && tensor.dtype !== dtype) {
      throw new Error(`${tensor.file}: tensor ${JSON.stringify(name)} has dtype ${tensor.dtype}; expected ${dtype}`);
    }
    if (tensor.shape.length !== shape.length || tensor.shape.some((d, i) => d !== shape[i])) {
      throw new Error(
        `${tensor.file}: tensor ${JSON.stringify(name)} has shape [${tensor.shape.join(', ')}]; config.json implies [${shape.join(', ')}]`,
      );
    }
    return tensor;
  }

  private fileIndexOf(file: string): number {
    let fileIndex = this.fileIndices.get(file);
    if (fileIndex === undefined) {
      fileIndex = this.filePaths.length;
      this.filePaths.push(file);
      this.fileIndices.set(file, fileIndex);
    }
    return fileIndex;
  }
}

/** Rows [first, first + count) of a row-major [rows, k] tensor (a fused qkv_proj's q, k or v). */
export function rowRange(ref: TensorRef, k: number, first: number, count: number): TensorRef {
  if (ref.encoding === 'mxfp4') throw new Error('rowRange: MXFP4 tensors are sliced by slice()');
  // A GGUF's rows are whole ggml blocks (its reader checks), so rows begin on block boundaries.
  const block = isBlockEncoding(ref) ? GGML_TYPES[GGML_TYPE_OF[ref.encoding as GgmlEncoding]] : null;
  const rowBytes = block === null ? k * DTYPE_BYTES[ref.dtype] : (k / block.blockElements) * block.blockBytes;
  return { ...ref, offsetBytes: ref.offsetBytes + first * rowBytes, sizeBytes: count * rowBytes };
}

/**
 * Matrix `index` of a stack of equal [rows, k] matrices (an expert of a fused experts tensor), for
 * plain and MXFP4 storage alike.
 */
export function slice(ref: TensorRef, index: number, count: number): TensorRef {
  const sizeBytes = ref.sizeBytes / count;
  const sliced: TensorRef = { ...ref, offsetBytes: ref.offsetBytes + index * sizeBytes, sizeBytes };
  if (ref.encoding === 'mxfp4') {
    const scalesSizeBytes = ref.scalesSizeBytes! / count;
    sliced.scalesOffsetBytes = ref.scalesOffsetBytes! + index * scalesSizeBytes;
    sliced.scalesSizeBytes = scalesSizeBytes;
  }
  return sliced;
}

/**
 * Rows parity, parity + 2, ... of a [rows, k] matrix whose rows interleave two weights (gpt-oss's
 * gate_up_proj: gate rows even, up rows odd); k = 1 for a vector.
 */
export function interleavedRows(ref: TensorRef, k: number, parity: 0 | 1): TensorRef {
  if (ref.encoding === 'mxfp4') {
    return { ...ref, offsetBytes: ref.offsetBytes + (parity * k) / 2, rowStride: 2 * k, scalesOffsetBytes: ref.scalesOffsetBytes! + (parity * k) / 32 };
  }
  return { ...ref, offsetBytes: ref.offsetBytes + parity * k * DTYPE_BYTES[ref.dtype], rowStride: 2 * k };
}

/**
 * A weight stored transposed, [k, n] (gpt-oss's dequantized experts keep [in, out]): its rows are
 * the stored columns first, first + step, ...
 */
export function transposedColumns(ref: TensorRef, n: number, first: number, step: 1 | 2): TensorRef {
  return { ...ref, offsetBytes: ref.offsetBytes + first * DTYPE_BYTES[ref.dtype], rowStride: step, colStride: n };
}
