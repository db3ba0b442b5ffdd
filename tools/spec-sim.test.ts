// The speculation simulator's accounting, on traces whose replay can be worked out by hand.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Proposer, ProposerInput, SpeculativeConfig } from '../engine/spec/proposer.ts';
import { simulate, type Trace } from './spec-sim.ts';

const fixed4: SpeculativeConfig = { method: 'ngram', numSpeculativeTokens: 4, promptLookupMin: 1, promptLookupMax: 3, adaptive: false };
/** A step verifying k proposals costs 2 + k / 2 (a plain one 2). */
const stepCosts = [2, 2.5, 3, 3.5, 4];
/** A loop of ten tokens, quoted once in the prompt: prompt lookup guesses every token after the first. */
const loop: Trace = { prompt: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1], output: Array.from({ length: 1 + 5 * 20 }, (_, i) => (i + 2) % 10) };

test('a proposer always right at k = 4: five tokens a step at twice a plain step\'s cost', () => {
  const result = simulate([loop], fixed4, stepCosts);
  // After the prompt's step, 100 tokens: 20 steps of four accepted and one sampled.
  assert.equal(result.numSteps, 20);
  assert.equal(result.numTokens, 100);
  assert.equal(result.numAccepted, 80);
  assert.equal(result.cost, 20 * 4);
  assert.equal(result.plainCost, 100 * 2);
});

test('a proposer always wrong: a token a step at the verifying step\'s cost; the oracle verifies nothing and costs plain', () => {
  const wrong: Proposer = {
    propose(_sequence: ProposerInput, maxNumTokens: number, out: number[]) {
      out.length = 0;
      for (let i = 0; i < maxNumTokens; i++) out.push(-1);
    },
  };
  const result = simulate([loop], fixed4, stepCosts, wrong);
  assert.equal(result.numSteps, 100);
  assert.equal(result.numTokens, 100);
  assert.equal(result.numAccepted, 0);
  // The last four steps verify 3, 2, 1 and 0 (max_tokens leaves less room).
  assert.equal(result.cost, 96 * 4 + 3.5 + 3 + 2.5 + 2);
  const oracle = simulate([loop], fixed4, stepCosts, wrong, true);
  assert.equal(oracle.cost, oracle.plainCost);
});

test('adaptive choice on a sequence that copies: at least the fixed count\'s tokens per cost, at most the oracle\'s', () => {
  const adaptive = simulate([loop], { ...fixed4, numSpeculativeTokens: 4, adaptive: true }, stepCosts);
  const oracle = simulate([loop], fixed4, stepCosts, undefined, true);
  assert.ok(adaptive.plainCost / adaptive.cost > 1);
  assert.ok(adaptive.plainCost / adaptive.cost <= oracle.plainCost / oracle.cost);
  assert.equal(oracle.numAccepted, oracle.numProposed);
});
