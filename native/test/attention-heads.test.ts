// Attention's kernels over a bf16 pairs cache (attention_heads_test.cc, built with the addon): a
// query head's scores and value sums have the same bits alone and among the heads of its kv head,
// on 200 random shapes per kernel path, and stay within 1e-4 of fp64. avx512 pairs the heads to
// share each key and value load; the model-level tests cannot see a slip between the pair.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { KERNELS, freshSeed, kernelSkip } from './helpers.ts';

const TEST_BINARY = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', 'build', 'Release', 'attention_heads_test');
const TIMEOUT_MS = 60_000;

for (const kernel of KERNELS) {
  test(`attention, ${kernel}: each head's bits alone and among its kv head's heads`, { timeout: TIMEOUT_MS, skip: kernelSkip(kernel) }, async (t) => {
    const seed = freshSeed(t);
    const { stdout } = await promisify(execFile)(TEST_BINARY, [String(seed), kernel], { timeout: TIMEOUT_MS - 5_000 }).catch((err: Error & { stderr?: string }) => {
      throw new Error(err.stderr || `seed ${seed}: ${err.message}`);
    });
    assert.match(stdout, new RegExp(`^${kernel}: 200 cases, \\d+ outputs, each head's bits the same alone and among its kv head's heads$`, 'm'), `seed ${seed}`);
  });
}
