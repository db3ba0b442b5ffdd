// The runtime's thread pool under stress (thread_pool_stress.cc, built with the addon): random
// task counts, chunk sizes, task lengths and pauses on 1 to 8 threads; every task must run
// exactly once. A lost wake-up hangs the program, and the timeout fails the test.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { freshSeed } from './helpers.ts';

const STRESS_BINARY = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', 'build', 'Release', 'thread_pool_stress');
const TIMEOUT_MS = 120_000;

test('every task runs exactly once, with no lost wake-up, on 1 to 8 threads', { timeout: TIMEOUT_MS }, async (t) => {
  const seed = freshSeed(t);
  const { stdout } = await promisify(execFile)(STRESS_BINARY, [String(seed)], { timeout: TIMEOUT_MS }).catch((err: Error & { stderr?: string }) => {
    throw new Error(`seed ${seed}: ${err.stderr || err.message}`);
  });
  const lines = stdout.trim().split('\n');
  assert.equal(lines.length, 16, `seed ${seed}: two lines per thread count expected (the count changed between calls, then from another thread):\n${stdout}`);
  lines.forEach((line, i) => assert.match(line, new RegExp(`^${(i >> 1) + 1} threads${i % 2 === 1 ? ' \\(count changed from another thread\\)' : ''}: 2000 calls, \\d+ tasks, each exactly once`), `seed ${seed}`));
});
