// The CUDA backend's host-side parts on any machine (cuda_host_test.cc, built with the addon):
// the shared sampling arithmetic picks the CPU sampler's token (ties, -0, bans, min-p, top-k,
// top-p), a batch becomes the right per-token slots, padding, chunks and output rows, and the
// graph cache evicts the least recently used; a GPU group's ranks split a model as the CPU's do,
// its all-gather copies assemble every rank's partials, and NCCL opens at run time or says why not.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { freshSeed } from './helpers.ts';

const BINARY = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', 'build', 'Release', 'cuda_host_test');
const TIMEOUT_MS = 60_000;

test('sampler headers, batch plans, the graph cache and the tensor-parallel plan of the CUDA backend, on the CPU', { timeout: TIMEOUT_MS }, async (t) => {
  const seed = freshSeed(t);
  const { stdout } = await promisify(execFile)(BINARY, [String(seed)], { timeout: TIMEOUT_MS }).catch(
    (err: Error & { stdout?: string; stderr?: string }) => {
      throw new Error(`seed ${seed}: ${err.stdout ?? ''}${err.stderr || err.message}`);
    },
  );
  assert.match(stdout, /sampler agreement: 3000 draws/);
  assert.match(stdout, /^nccl: (libnccl\.so\.2 \d+|NCCL is not available: dlopen libnccl\.so\.2: .+)$/m);
  assert.match(stdout, /^ok \(0 failures/m, stdout);
});
