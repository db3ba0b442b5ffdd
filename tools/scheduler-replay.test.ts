// The replay's step-cost fit and time split, on steps whose costs are known exactly.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fitStepCost, splitTime } from './scheduler-replay.ts';
import type { StepRecord } from './scheduler-sim.ts';

function stepsOf(cost: { fixedMs: number; msPerPromptToken: number; msPerDecodeRow: number }, shapes: [number, number][]): StepRecord[] {
  let endMs = 0;
  return shapes.map(([numPromptTokens, numDecodeRows]) => {
    const ms = cost.fixedMs + cost.msPerPromptToken * numPromptTokens + cost.msPerDecodeRow * numDecodeRows;
    endMs += ms;
    return { ms, endMs, numPromptTokens, numDecodeRows };
  });
}

test('the fit recovers a step cost that is exactly linear in prompt tokens and decode rows', () => {
  const truth = { fixedMs: 5 + Math.random(), msPerPromptToken: 0.3 * (1 + Math.random()), msPerDecodeRow: 0.5 * (1 + Math.random()) };
  const steps = stepsOf(truth, [[256, 0], [512, 3], [96, 8], [0, 8], [0, 31], [512, 31], [17, 2]]);
  const fit = fitStepCost(steps)!;
  assert.ok(Math.abs(fit.fixedMs - truth.fixedMs) < 1e-6, `fixed ${fit.fixedMs} vs ${truth.fixedMs}`);
  assert.ok(Math.abs(fit.msPerPromptToken - truth.msPerPromptToken) < 1e-9);
  assert.ok(Math.abs(fit.msPerDecodeRow - truth.msPerDecodeRow) < 1e-8);
});

test('no decodes at all leaves the decode row\'s cost undetermined: no fit', () => {
  assert.equal(fitStepCost(stepsOf({ fixedMs: 5, msPerPromptToken: 0.3, msPerDecodeRow: 0.5 }, [[256, 0], [512, 0], [96, 0]])), null);
});

test('the split counts the steps that ended by the given time, in the fitted parts', () => {
  const cost = { fixedMs: 10, msPerPromptToken: 1, msPerDecodeRow: 2 };
  const steps = stepsOf(cost, [[100, 0], [50, 1], [0, 2]]);  // ends at 110, 172, 186
  assert.deepEqual(splitTime(steps, cost, 172), { numSteps: 2, fixedMs: 20, promptMs: 150, decodeMs: 2, numPromptTokens: 150, numDecodeRows: 1 });
});
