// The amx path's numerics on any AVX-512 BF16 CPU, AMX or not (amx_model_test.cc, built with the
// addon): the SDM's VDPBF16PS modelled bit for bit against the CPU's; its single chain shown to
// round unlike TDPBF16PS; the tile kernel on modelled tiles and the runtime's one-row path (real
// vdpbf16ps) both equal to the tiles' order per output, over ragged k, partial panels, 1 to 70
// rows, accumulation and underflowing inputs; int8 tiles (TDPBSSD/TDPBUSD) equal to the avx512
// int8 path bit for bit; and, where the CPU has AMX, the real tiles too.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { kernelSupported } from '../index.ts';
import { freshSeed, kernelSkip } from './helpers.ts';

const MODEL_BINARY = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', 'build', 'Release', 'amx_model_test');
const TIMEOUT_MS = 120_000;

test('amx: tiles (modelled, and real where present) and the one-row path give the same bits', { timeout: TIMEOUT_MS, skip: kernelSkip('avx512') }, async (t) => {
  const seed = freshSeed(t);
  const { stdout } = await promisify(execFile)(MODEL_BINARY, [String(seed)], { timeout: TIMEOUT_MS }).catch((err: Error & { stderr?: string; stdout?: string }) => {
    throw new Error(`seed ${seed}: ${err.stderr || err.message}`);
  });
  for (const line of stdout.trim().split('\n')) t.diagnostic(line);
  assert.match(stdout, /^vdpbf16ps model equals the CPU: 800000 lanes$/m);
  assert.match(stdout, /^vdpbf16ps chain vs TDPBF16PS order: [1-9]\d* of 8192 outputs differ$/m);
  assert.match(stdout, /^modelled tiles equal the tiles' order: 70 matmuls, \d+ outputs$/m);
  assert.match(stdout, /^one-row path equals the tiles' order: 70 matmuls, \d+ outputs$/m);
  assert.match(stdout, /^(modelled|modelled and hardware) int8 tiles and the one-row int8 path equal the avx512 int8 path: \d+ outputs$/m);
  if (kernelSupported('amx')) assert.match(stdout, /^hardware tiles equal the tiles' order: 70 matmuls, \d+ outputs$/m);
  else assert.match(stdout, /^hardware tiles: not run \(.+\)$/m);
});

