// ggml's block types dequantized in fp64, written from the block layouts of ggml-common.h and the
// formulas of ggml's docs (block_q8_0: d·q; block_q4_0: d·(q − 8); block_q4_K / block_q5_K:
// d·scale_j·q − dmin·min_j per 32 with 6-bit scales and mins; block_q6_K: d·scale_j·(q − 32) per
// 16 with int8 scales), plus random blocks to feed them. Separate from the runtime's C++ on purpose.
import type { BlockTypeName } from '../../tools/ggml-quantize.ts';
import { GGML_TYPES } from '../../gguf.ts';
import { f16BitsToNumber } from '../safetensors.ts';

function f16At(bytes: Uint8Array, at: number): number {
  return f16BitsToNumber(bytes[at] | (bytes[at + 1] << 8));
}

/** Sub-block j's 6-bit scale and min of a Q4_K / Q5_K block's 12 packed bytes. */
function scaleMin(packed: Uint8Array, at: number, j: number): [number, number] {
  const b = (i: number) => packed[at + i];
  if (j < 4) return [b(j) & 63, b(j + 4) & 63];
  return [(b(j + 4) & 15) | ((b(j - 4) >> 6) << 4), (b(j + 4) >> 4) | ((b(j) >> 6) << 4)];
}

function dequantizeBlock(type: BlockTypeName, bytes: Uint8Array, at: number, out: Float64Array, o: number): void {
  switch (type) {
    case 'Q8_0': {
      const d = f16At(bytes, at);
      for (let i = 0; i < 32; i++) out[o + i] = d * ((bytes[at + 2 + i] << 24) >> 24);
      return;
    }
    case 'Q4_0': {
      const d = f16At(bytes, at);
      for (let i = 0; i < 16; i++) {
        out[o + i] = d * ((bytes[at + 2 + i] & 15) - 8);
        out[o + i + 16] = d * ((bytes[at + 2 + i] >> 4) - 8);
      }
      return;
    }
    case 'Q4_K':
    case 'Q5_K': {
      const q5 = type === 'Q5_K';
      const d = f16At(bytes, at);
      const dmin = f16At(bytes, at + 2);
      const qh = at + 16;
      const qs = at + 16 + (q5 ? 32 : 0);
      for (let j = 0; j < 8; j++) {
        const [scale, min] = scaleMin(bytes, at + 4, j);
        for (let i = 0; i < 32; i++) {
          const byte = bytes[qs + 32 * (j >> 1) + i];
          let q = j % 2 === 0 ? byte & 15 : byte >> 4;
          if (q5) q += ((bytes[qh + i] >> j) & 1) * 16;
          out[o + 32 * j + i] = d * scale * q - dmin * min;
        }
      }
      return;
    }
    case 'Q6_K': {
      const d = f16At(bytes, at + 208);
      for (let e = 0; e < 256; e++) {
        const half = e >> 7;
        const quarter = (e & 127) >> 5;
        const l = e & 31;
        const lowByte = bytes[at + 64 * half + l + (quarter & 1) * 32];
        const low = quarter >= 2 ? lowByte >> 4 : lowByte & 15;
        const high = (bytes[at + 128 + 32 * half + l] >> (2 * quarter)) & 3;
        const scale = (bytes[at + 192 + (e >> 4)] << 24) >> 24;
        out[o + e] = d * scale * ((low | (high << 4)) - 32);
      }
    }
  }
}

export function dequantize(type: BlockTypeName, bytes: Uint8Array): Float64Array {
  const { blockElements, blockBytes } = GGML_TYPES[type];
  const numBlocks = bytes.length / blockBytes;
  const out = new Float64Array(numBlocks * blockElements);
  for (let b = 0; b < numBlocks; b++) dequantizeBlock(type, bytes, b * blockBytes, out, b * blockElements);
  return out;
}

/** Byte offsets of each block's fp16 scales, and the log2 range their values take. */
const SCALE_FIELDS: Readonly<Record<BlockTypeName, { offsets: number[]; log2Range: [number, number] }>> = {
  Q8_0: { offsets: [0], log2Range: [-12, -9] },
  Q4_0: { offsets: [0], log2Range: [-9, -6] },
  Q4_K: { offsets: [0, 2], log2Range: [-14, -11] },
  Q5_K: { offsets: [0, 2], log2Range: [-14, -12] },
  Q6_K: { offsets: [208], log2Range: [-14, -12] },
};

/**
 * numBlocks random blocks: every code, scale and min byte uniform, the fp16 scales normal
 * numbers of either sign in a range that keeps a random model's activations moderate.
 */
export function randomBlocks(type: BlockTypeName, numBlocks: number, random: () => number): Uint8Array {
  const { blockBytes } = GGML_TYPES[type];
  const bytes = new Uint8Array(numBlocks * blockBytes);
  for (let i = 0; i < bytes.length; i++) bytes[i] = Math.floor(random() * 256);
  const { offsets, log2Range } = SCALE_FIELDS[type];
  for (let b = 0; b < numBlocks; b++) {
    for (const offset of offsets) {
      const exponent = log2Range[0] + Math.floor(random() * (log2Range[1] - log2Range[0])) + 15;
      const mantissa = Math.floor(random() * 1024);
      // Q4_K / Q5_K's dmin is subtracted; either sign is valid, both are exercised.
      const bits = (random() < 0.5 ? 0x8000 : 0) | (exponent << 10) | mantissa;
      bytes[b * blockBytes + offset] = bits & 0xff;
      bytes[b * blockBytes + offset + 1] = bits >> 8;
    }
  }
  return bytes;
}
