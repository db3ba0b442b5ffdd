import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { bf16BitsToNumber, f16BitsToNumber, readSafetensorsHeader, readTensorF64 } from '../native/safetensors.ts';
import { roundF32BitsToBf16Bits, roundF32BitsToF16Bits, writeSafetensors, type TensorSpec } from './safetensors-writer.ts';

function withTempDir(fn: (dir: string) => void): void {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'safetensors-writer-test-'));
  try {
    fn(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * The slow, obviously correct rounding: list every non-negative finite value of the 16-bit
 * format in order, plus the first power of two past the largest (which stands for infinity,
 * bit pattern 0x7f80 / 0x7c00: the next pattern up), pick the nearest, and on a tie the one
 * whose bit pattern is even.
 */
function slowRounder(widen: (bits: number) => number, infinityBits: number): (x: number) => number {
  const bitsAscending: number[] = [];
  for (let bits = 0; bits < infinityBits; bits++) bitsAscending.push(bits);
  const values = bitsAscending.map(widen);
  values.push(2 * widen(infinityBits - 1) - widen(infinityBits - 2)); // the value one ulp past the max
  bitsAscending.push(infinityBits);
  return (x: number) => {
    const sign = x < 0 || Object.is(x, -0) ? 0x8000 : 0;
    const magnitude = Math.abs(x);
    if (magnitude >= values[values.length - 1]) return sign | infinityBits;
    let lo = 0; // largest index with values[lo] <= magnitude
    let hi = values.length - 1;
    while (hi - lo > 1) {
      const mid = (lo + hi) >> 1;
      if (values[mid] <= magnitude) lo = mid;
      else hi = mid;
    }
    const below = magnitude - values[lo];
    const above = values[hi] - magnitude;
    if (below < above) return sign | bitsAscending[lo];
    if (above < below) return sign | bitsAscending[hi];
    return sign | (bitsAscending[lo] % 2 === 0 ? bitsAscending[lo] : bitsAscending[hi]);
  };
}

const slowBf16 = slowRounder(bf16BitsToNumber, 0x7f80);
const slowF16 = slowRounder(f16BitsToNumber, 0x7c00);

/** Random fp32 bit patterns (NaN excluded), plus the edge cases rounding gets wrong. */
function testBitPatterns(): Uint32Array {
  const edges = [
    0x00000000, 0x80000000, 0x3f800000, 0x3f808000, 0x3f818000, 0x3f80c000, 0x3f807fff, 0x7f7fffff, 0x7f7f8000,
    0x7f7f7fff, 0x477fe000, 0x477fefff, 0x477ff000, 0x477fffff, 0x47800000, 0x38800000, 0x387fe000, 0x33800000,
    0x33000000, 0x33000001, 0x32ffffff, 0x33c00000, 0x00000001, 0x007fffff, 0x7f800000, 0xff800000, 0xc77ff000,
  ];
  const patterns = new Uint32Array(200_000 + edges.length);
  patterns.set(edges);
  let state = 12345;
  const view = new Float32Array(patterns.buffer);
  for (let i = edges.length; i < patterns.length; i++) {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    // Bias half the samples toward the fp16 range so subnormal and overflow paths get hit.
    patterns[i] = i % 2 === 0 ? state : (state & 0x87ffffff) | 0x30000000;
    if (Number.isNaN(view[i])) patterns[i] = 0x3f800000;
  }
  return patterns;
}

test('bf16 rounding matches the slow nearest-even rounding', () => {
  const patterns = testBitPatterns();
  const values = new Float32Array(patterns.buffer);
  for (let i = 0; i < patterns.length; i++) {
    const expected = slowBf16(values[i]);
    const actual = roundF32BitsToBf16Bits(patterns[i]);
    if (actual !== expected) assert.fail(`bf16(0x${patterns[i].toString(16)}) = 0x${actual.toString(16)}, want 0x${expected.toString(16)}`);
  }
});

test('fp16 rounding matches the slow nearest-even rounding, subnormals and overflow included', () => {
  const patterns = testBitPatterns();
  const values = new Float32Array(patterns.buffer);
  for (let i = 0; i < patterns.length; i++) {
    const expected = slowF16(values[i]);
    const actual = roundF32BitsToF16Bits(patterns[i]);
    if (actual !== expected) assert.fail(`f16(0x${patterns[i].toString(16)}) = 0x${actual.toString(16)}, want 0x${expected.toString(16)}`);
  }
});

test('NaN stays NaN in both 16-bit formats', () => {
  for (const bits of [0x7fc00000, 0x7f800001, 0xffc00000, 0x7f802000]) {
    assert.ok(Number.isNaN(bf16BitsToNumber(roundF32BitsToBf16Bits(bits))), bits.toString(16));
    assert.ok(Number.isNaN(f16BitsToNumber(roundF32BitsToF16Bits(bits))), bits.toString(16));
  }
});

function sampleValues(numValues: number): Float32Array {
  const values = new Float32Array(numValues);
  for (let i = 0; i < numValues; i++) values[i] = Math.sin(i * 12.9898) * 10 ** ((i % 9) - 4);
  return values;
}

test('F32 round-trips bitwise; BF16 and F16 round-trip as their nearest-even values', () => {
  withTempDir((dir) => {
    const file = path.join(dir, 'round-trip.safetensors');
    const values = sampleValues(3 * 5 * 7);
    const specs: TensorSpec[] = [
      { name: 'f32', dtype: 'F32', shape: [3, 5, 7] },
      { name: 'bf16', dtype: 'BF16', shape: [105] },
      { name: 'f16', dtype: 'F16', shape: [7, 15] },
      { name: 'empty', dtype: 'F32', shape: [0, 4] },
    ];
    const dataBytes = writeSafetensors(file, specs, (spec) => (spec.name === 'empty' ? new Float32Array(0) : values), {
      format: 'pt',
    });
    assert.equal(dataBytes, 105 * 4 + 105 * 2 + 105 * 2);

    const header = readSafetensorsHeader(file);
    assert.equal(header.headerBytes % 8, 0);
    assert.deepEqual(header.metadata, { format: 'pt' });
    assert.deepEqual([...header.tensors.keys()], ['f32', 'bf16', 'f16', 'empty']);
    assert.deepEqual(header.tensors.get('f16')?.shape, [7, 15]);

    const f32 = readTensorF64(file, header, 'f32');
    assert.deepEqual(new Float32Array(f32), values);
    const bytes = readFileSync(file);
    const f32Begin = header.tensors.get('f32')!.dataBegin;
    assert.ok(bytes.subarray(f32Begin, f32Begin + 420).equals(Buffer.from(values.buffer)));

    const bf16 = readTensorF64(file, header, 'bf16');
    const f16 = readTensorF64(file, header, 'f16');
    for (let i = 0; i < values.length; i++) {
      assert.equal(bf16[i], bf16BitsToNumber(slowBf16(values[i])));
      assert.equal(f16[i], f16BitsToNumber(slowF16(values[i])));
    }
    assert.equal(readTensorF64(file, header, 'empty').length, 0);
  });
});

test('a tensor whose data does not match its shape is an error naming it', () => {
  withTempDir((dir) => {
    const file = path.join(dir, 'bad.safetensors');
    assert.throws(
      () => writeSafetensors(file, [{ name: 'w', dtype: 'F32', shape: [2, 2] }], () => new Float32Array(3)),
      /tensor w has 3 values but shape \[2, 2\] needs 4/,
    );
  });
});
