// The tensor-parallel communicator under stress (comm_stress.cc, built with the addon): 2, 4 and 8
// processes, ranks joining late, 1000 / size random all-gathers and broadcasts each (tiny ones, and ones
// past the shared-memory slot), every byte checked. A lost update hangs, and the timeout fails it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { freshSeed } from './helpers.ts';

const STRESS_BINARY = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', 'build', 'Release', 'comm_stress');
const TIMEOUT_MS = 110_000;

test('all-gathers and broadcasts deliver every byte across 2, 4 and 8 processes joining late', { timeout: TIMEOUT_MS }, async (t) => {
  const seed = freshSeed(t);
  const { stdout } = await promisify(execFile)(STRESS_BINARY, [String(seed)], { timeout: TIMEOUT_MS - 5_000 }).catch((err: Error & { stderr?: string }) => {
    throw new Error(`seed ${seed}: ${err.stderr || err.message}`);
  });
  const lines = stdout.trim().split('\n');
  assert.deepEqual(lines, [2, 4, 8].map((size) => `${size} ranks: ${1000 / size} collectives, every byte as sent`), `seed ${seed}`);
});
