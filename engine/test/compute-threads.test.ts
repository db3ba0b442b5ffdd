// The rule for a step's compute threads while grammar threads are busy (compute-threads.ts).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { activeComputeThreads, availableCores } from '../compute-threads.ts';

test('with no grammar thread busy a step takes its configured threads, even more than the cores', () => {
  assert.equal(activeComputeThreads(2, 2, 0), 2);
  assert.equal(activeComputeThreads(4, 2, 0), 4);
  assert.equal(activeComputeThreads(1, 1, 0), 1);
});

test('busy grammar threads (compiling, or filling a few rows) take their cores from the step, which keeps at least one thread', () => {
  assert.equal(activeComputeThreads(2, 2, 1), 1);
  assert.equal(activeComputeThreads(8, 8, 1), 7);
  assert.equal(activeComputeThreads(8, 8, 3), 5);
  // Cores to spare: nothing to give up.
  assert.equal(activeComputeThreads(2, 8, 1), 2);
  assert.equal(activeComputeThreads(6, 8, 3), 5);
  // As many busy grammar threads as cores, or more: one thread still computes.
  assert.equal(activeComputeThreads(2, 2, 2), 1);
  assert.equal(activeComputeThreads(4, 2, 5), 1);
});

test('one core or none reported: a step runs on one thread while a grammar thread is busy', () => {
  assert.equal(activeComputeThreads(1, 1, 1), 1);
  assert.equal(activeComputeThreads(2, 1, 1), 1);
  assert.equal(activeComputeThreads(2, 0, 1), 1);
});

test('the cores are the process\'s own: at least one, at most the machine\'s', () => {
  const cores = availableCores();
  assert.ok(Number.isInteger(cores) && cores >= 1, `availableCores() = ${cores}`);
});
