// Rows of fp values into ggml's block types (ggml-common.h layouts) for the GGUF files the tests
// and benchmarks write. The quantizers are plain round-to-nearest ones (ggml's own search for
// K-quant scales, make_qkx2_quants, is finer): the blocks are valid for any reader, their
// exact rounding is not llama-quantize's.
import { GGML_TYPES, type GgmlTypeName } from '../gguf.ts';
import { f16BitsToNumber } from '../native/safetensors.ts';
import { roundF32BitsToF16Bits } from './safetensors-writer.ts';

/** The block types quantizeRows makes (MXFP4 arrives as blocks already: gpt-oss ships it). */
export type BlockTypeName = Exclude<GgmlTypeName, 'F32' | 'F16' | 'BF16' | 'MXFP4'>;

function f16(value: number): { bits: number; value: number } {
  const f32 = new Float32Array([value]);
  const bits = roundF32BitsToF16Bits(new Uint32Array(f32.buffer)[0]);
  return { bits, value: f16BitsToNumber(bits) };
}

const clamp = (value: number, low: number, high: number) => Math.min(high, Math.max(low, value));

function quantizeQ8_0(x: ArrayLike<number>, at: number, out: DataView, o: number): void {
  let amax = 0;
  for (let i = 0; i < 32; i++) amax = Math.max(amax, Math.abs(x[at + i]));
  const d = f16(amax / 127);
  out.setUint16(o, d.bits, true);
  for (let i = 0; i < 32; i++) out.setInt8(o + 2 + i, d.value === 0 ? 0 : clamp(Math.round(x[at + i] / d.value), -127, 127));
}

function quantizeQ4_0(x: ArrayLike<number>, at: number, out: DataView, o: number): void {
  // The value of largest magnitude maps to -8 (ggml's choice: the code range is [-8, 7]).
  let max = 0;
  for (let i = 0; i < 32; i++) if (Math.abs(x[at + i]) > Math.abs(max)) max = x[at + i];
  const d = f16(max / -8);
  out.setUint16(o, d.bits, true);
  const code = (i: number) => (d.value === 0 ? 8 : clamp(Math.round(x[at + i] / d.value) + 8, 0, 15));
  for (let i = 0; i < 16; i++) out.setUint8(o + 2 + i, code(i) | (code(i + 16) << 4));
}

/** Q4_K / Q5_K scales and mins: 8 six-bit pairs in 12 bytes (ggml's get_scale_min_k4 inverted). */
function packScaleMins(scales: number[], mins: number[], out: DataView, o: number): void {
  for (let j = 0; j < 4; j++) {
    out.setUint8(o + j, (scales[j] & 63) | ((scales[j + 4] >> 4) << 6));
    out.setUint8(o + j + 4, (mins[j] & 63) | ((mins[j + 4] >> 4) << 6));
    out.setUint8(o + j + 8, (scales[j + 4] & 15) | ((mins[j + 4] & 15) << 4));
  }
}

/** Q4_K (levels 15) or Q5_K (31): per 32 an affine scale and min, both 6-bit multiples of fp16 d and dmin. */
function quantizeK(x: ArrayLike<number>, at: number, out: DataView, o: number, levels: 15 | 31): void {
  const subScales: number[] = [];
  const subMins: number[] = [];
  for (let j = 0; j < 8; j++) {
    let low = 0;
    let high = 0;
    for (let i = 0; i < 32; i++) {
      low = Math.min(low, x[at + 32 * j + i]);
      high = Math.max(high, x[at + 32 * j + i]);
    }
    subScales.push((high - low) / levels);
    subMins.push(-low);
  }
  const d = f16(Math.max(...subScales) / 63);
  const dmin = f16(Math.max(...subMins) / 63);
  const scales = subScales.map((s) => (d.value === 0 ? 0 : clamp(Math.round(s / d.value), 0, 63)));
  const mins = subMins.map((m) => (dmin.value === 0 ? 0 : clamp(Math.round(m / dmin.value), 0, 63)));
  out.setUint16(o, d.bits, true);
  out.setUint16(o + 2, dmin.bits, true);
  packScaleMins(scales, mins, out, o + 4);
  const q5 = levels === 31;
  const qs = o + 16 + (q5 ? 32 : 0);
  for (let j = 0; j < 8; j++) {
    const scale = d.value * scales[j];
    const min = dmin.value * mins[j];
    for (let i = 0; i < 32; i++) {
      const q = scale === 0 ? 0 : clamp(Math.round((x[at + 32 * j + i] + min) / scale), 0, levels);
      // Sub-block j: byte 32·(j >> 1) + i, low nibble for even j, high for odd; Q5_K's fifth bit is bit j of qh[i].
      const byte = qs + 32 * (j >> 1) + i;
      out.setUint8(byte, out.getUint8(byte) | ((q & 15) << (j & 1 ? 4 : 0)));
      if (q5 && q > 15) out.setUint8(o + 16 + i, out.getUint8(o + 16 + i) | (1 << j));
    }
  }
}

/** Q6_K: per 16 an int8 scale times fp16 d, codes -32..31. */
function quantizeQ6_K(x: ArrayLike<number>, at: number, out: DataView, o: number): void {
  const subScales: number[] = [];
  for (let j = 0; j < 16; j++) {
    let amax = 0;
    for (let i = 0; i < 16; i++) amax = Math.max(amax, Math.abs(x[at + 16 * j + i]));
    subScales.push(amax / 32);
  }
  const d = f16(Math.max(...subScales) / 127);
  const scales = subScales.map((s) => (d.value === 0 ? 0 : clamp(Math.round(s / d.value), -128, 127)));
  for (let j = 0; j < 16; j++) out.setInt8(o + 192 + j, scales[j]);
  out.setUint16(o + 208, d.bits, true);
  for (let e = 0; e < 256; e++) {
    const scale = d.value * scales[e >> 4];
    const q = (scale === 0 ? 0 : clamp(Math.round(x[at + e] / scale), -32, 31)) + 32;
    // Element e: half h = e / 128, quarter t = (e % 128) / 32, l = e % 32 (ggml's dequantize_row_q6_K).
    const h = e >> 7;
    const t = (e & 127) >> 5;
    const l = e & 31;
    const lowByte = o + 64 * h + l + (t & 1) * 32;
    out.setUint8(lowByte, out.getUint8(lowByte) | ((q & 15) << (t >= 2 ? 4 : 0)));
    const highByte = o + 128 + 32 * h + l;
    out.setUint8(highByte, out.getUint8(highByte) | ((q >> 4) << (2 * t)));
  }
}

/** A row-major [rows, k] matrix as blocks of type (k a multiple of the block size). */
export function quantizeRows(values: ArrayLike<number>, type: BlockTypeName): Uint8Array {
  const { blockElements, blockBytes } = GGML_TYPES[type];
  const numBlocks = values.length / blockElements;
  const bytes = new Uint8Array(numBlocks * blockBytes);
  const view = new DataView(bytes.buffer);
  for (let b = 0; b < numBlocks; b++) {
    const at = b * blockElements;
    const o = b * blockBytes;
    if (type === 'Q8_0') quantizeQ8_0(values, at, view, o);
    else if (type === 'Q4_0') quantizeQ4_0(values, at, view, o);
    else if (type === 'Q4_K') quantizeK(values, at, view, o, 15);
    else if (type === 'Q5_K') quantizeK(values, at, view, o, 31);
    else quantizeQ6_K(values, at, view, o);
  }
  return bytes;
}
