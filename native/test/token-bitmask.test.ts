// Structured outputs' token bitmasks in native sampling, held against the reference chain
// (sampling-reference.ts: the mask first, as -Infinity, then bias and penalties) applied to the
// raw logits the same pass returns: greedy ids exactly, seeded draws by their frequencies, the
// fallbacks when bans or the mask leave nothing, and rows written by another thread while the
// pass runs. Models, prompts, masks and settings are drawn fresh each run; failures print the seed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { ForwardBatch } from '../api.ts';
import { MAX_TOP_LOGPROBS, SEQ_RETURN_LOGITS, SEQ_SAMPLE } from '../api.ts';
import {
  bitmaskRow,
  buildBatch,
  freshSeed,
  randomTokens,
  uniformSource,
} from './helpers.ts';
import {
  NEUTRAL_SETTINGS,
  adjustLogits,
  argmax,
  chiSquare,
  chiSquareLimit,
  logSoftmax,
  samplingDistribution,
  topLogprobs,
  type SamplingSettings,
} from './sampling-reference.ts';
import { chunkOf, drawCounts, rawLogitsOf, withSamplingModel } from './sampling-harness.ts';

// Not a multiple of 32: the last bitmask word is partly unused.
const VOCAB_SIZE = 75;
const PROMPT_TOKENS = 8;
const DRAWS_PER_CASE = 4096;

/**
 * About `fraction` of the vocabulary, never the raw favourite (so a runtime ignoring the mask
 * fails). As a grammar's masks do, some 32-id words are whole runs (all allowed, all refused),
 * which the sampler takes a word at a time, and the others mixed.
 */
function randomMask(random: () => number, raw: Float32Array, fraction: number): number[] {
  const favourite = argmax(raw);
  const wordKinds = Array.from({ length: Math.ceil(VOCAB_SIZE / 32) }, () => random());
  const allowedOf = (id: number) => {
    const kind = wordKinds[id >> 5];
    return kind < 0.25 ? true : kind < 0.5 ? false : random() < fraction;
  };
  const allowed = Array.from({ length: VOCAB_SIZE }, (_, id) => id).filter((id) => id !== favourite && allowedOf(id));
  return allowed.length > 0 ? allowed : [(favourite + 1) % VOCAB_SIZE];
}

test('greedy with a bitmask takes the exact argmax of what it allows, after bias and penalties too; logprobs stay raw', async (t) => {
  const seed = freshSeed(t);
  const random = uniformSource(seed);
  await withSamplingModel(VOCAB_SIZE, seed, async (model) => {
    for (let p = 0; p < 6; p++) {
      const prompt = randomTokens(PROMPT_TOKENS, VOCAB_SIZE, seed + p);
      const raw = await rawLogitsOf(model, prompt);
      const cases: SamplingSettings[] = [0.05, 0.3, 0.9].flatMap((fraction) => {
        const allowedTokenIds = randomMask(random, raw, fraction);
        const history = allowedTokenIds.slice(0, 3).map((tokenId, i) => ({ tokenId, outputCount: i, inPrompt: i !== 1 }));
        return [
          { ...NEUTRAL_SETTINGS, allowedTokenIds },
          { ...NEUTRAL_SETTINGS, allowedTokenIds, temperature: 1.2, topK: 1 },
          {
            ...NEUTRAL_SETTINGS,
            allowedTokenIds,
            logitBias: [[allowedTokenIds[0], -2.5]],
            repetitionPenalty: 1.7,
            frequencyPenalty: 0.6,
            presencePenalty: -0.4,
            penaltyHistory: history,
          },
        ];
      });
      // An unconstrained sequence rides along: its sample is the plain argmax.
      const chunks = [...cases.map((settings, i) => chunkOf(prompt, settings, i, { numTopLogprobs: 3, flags: SEQ_SAMPLE | SEQ_RETURN_LOGITS })), chunkOf(prompt, NEUTRAL_SETTINGS, cases.length)];
      const result = await model.forward(buildBatch(chunks, { vocabSize: VOCAB_SIZE }));
      const rawLogprobs = logSoftmax(raw);
      const rawTop = topLogprobs(raw, 3);
      cases.forEach((settings, i) => {
        const label = `seed ${seed}, prompt ${p}, case ${i}: ${JSON.stringify(settings)}`;
        assert.deepEqual(result.logits.subarray(i * VOCAB_SIZE, (i + 1) * VOCAB_SIZE), raw, `${label}: SEQ_RETURN_LOGITS returns the raw logits`);
        const expected = argmax(adjustLogits(raw, settings));
        assert.equal(result.sampledTokenIds[i], expected, label);
        assert.ok(settings.allowedTokenIds!.includes(expected), label);
        assert.ok(Math.abs(result.sampledLogprobs[i] - rawLogprobs[expected]) < 1e-5, `${label}: the sampled logprob is the raw one`);
        assert.deepEqual(Array.from(result.topTokenIds.subarray(i * MAX_TOP_LOGPROBS, i * MAX_TOP_LOGPROBS + 3)), rawTop.ids, `${label}: top logprobs are of the raw logits`);
      });
      assert.equal(result.sampledTokenIds[cases.length], argmax(raw), `seed ${seed}: the unconstrained companion`);
    }
  });
});

test('draws with a bitmask, temperature, min-p, top-k, top-p and penalties follow the reference and never leave the mask', async (t) => {
  const seed = freshSeed(t);
  const random = uniformSource(seed);
  await withSamplingModel(VOCAB_SIZE, seed, async (model) => {
    const prompt = randomTokens(PROMPT_TOKENS, VOCAB_SIZE, seed);
    const raw = await rawLogitsOf(model, prompt);
    const cases: Record<string, SamplingSettings> = {
      'temperature only': { ...NEUTRAL_SETTINGS, allowedTokenIds: randomMask(random, raw, 0.5), temperature: 1.5 },
      'min-p': { ...NEUTRAL_SETTINGS, allowedTokenIds: randomMask(random, raw, 0.7), temperature: 2, minP: 0.05 },
      'top-k and top-p with bias': {
        ...NEUTRAL_SETTINGS, allowedTokenIds: randomMask(random, raw, 0.6), temperature: 1.8, topK: 12, topP: 0.9, logitBias: [[3, 1.5], [5, -1]],
      },
      'penalties': {
        ...NEUTRAL_SETTINGS,
        allowedTokenIds: randomMask(random, raw, 0.4),
        temperature: 1.2,
        repetitionPenalty: 1.4,
        presencePenalty: 0.5,
        penaltyHistory: [{ tokenId: 1, outputCount: 2, inPrompt: false }, { tokenId: 2, outputCount: 0, inPrompt: true }],
      },
    };
    for (const [name, settings] of Object.entries(cases)) {
      const label = `seed ${seed}, ${name}: ${JSON.stringify(settings)}`;
      const probs = samplingDistribution(raw, settings);
      const counts = await drawCounts(model, VOCAB_SIZE, prompt, settings, BigInt(seed), DRAWS_PER_CASE);
      const allowed = new Set(settings.allowedTokenIds);
      counts.forEach((count, id) => assert.ok(count === 0 || allowed.has(id), `${label}: token ${id} drawn ${count} times outside the mask`));
      const { statistic, degreesOfFreedom } = chiSquare(counts, probs);
      assert.ok(statistic <= chiSquareLimit(degreesOfFreedom), `${label}: chi-square ${statistic.toFixed(1)} over ${degreesOfFreedom} degrees of freedom`);
    }
  });
});

test('bans that cover every allowed token fall back to the best allowed one; a mask allowing nothing falls back to the raw argmax', async (t) => {
  const seed = freshSeed(t);
  const random = uniformSource(seed);
  await withSamplingModel(VOCAB_SIZE, seed, async (model) => {
    const prompt = randomTokens(PROMPT_TOKENS, VOCAB_SIZE, seed);
    const raw = await rawLogitsOf(model, prompt);
    const allowedTokenIds = randomMask(random, raw, 0.2);
    const bans = allowedTokenIds.map((id): [number, number] => [id, -Infinity]);
    const settings: SamplingSettings[] = [
      { ...NEUTRAL_SETTINGS, allowedTokenIds, logitBias: bans },
      { ...NEUTRAL_SETTINGS, allowedTokenIds, logitBias: bans, temperature: 1, topP: 0.8 },
      { ...NEUTRAL_SETTINGS, allowedTokenIds: [], temperature: 0.7 },
    ];
    const result = await model.forward(buildBatch(settings.map((s, i) => chunkOf(prompt, s, i, { seed: BigInt(seed) })), { vocabSize: VOCAB_SIZE }));
    const bestAllowed = allowedTokenIds.reduce((best, id) => (raw[id] > raw[best] || (raw[id] === raw[best] && id < best) ? id : best));
    assert.equal(result.sampledTokenIds[0], bestAllowed, `seed ${seed}: greedy`);
    assert.equal(result.sampledTokenIds[1], bestAllowed, `seed ${seed}: drawn`);
    assert.equal(result.sampledTokenIds[2], argmax(raw), `seed ${seed}: an empty mask`);
  });
});

test('rows written by another thread while the pass runs: sampling waits for the ready counter', async (t) => {
  const seed = freshSeed(t);
  const random = uniformSource(seed);
  await withSamplingModel(VOCAB_SIZE, seed, async (model) => {
    const prompt = randomTokens(PROMPT_TOKENS, VOCAB_SIZE, seed);
    const raw = await rawLogitsOf(model, prompt);
    const masks = [randomMask(random, raw, 0.1), randomMask(random, raw, 0.3)];
    const words = Math.ceil(VOCAB_SIZE / 32);
    const bitmask = new Int32Array(new SharedArrayBuffer(2 * words * 4));
    const ready = new Int32Array(new SharedArrayBuffer(4));
    const batch: ForwardBatch = {
      ...buildBatch([0, 1, 2].map((i) => chunkOf(prompt, NEUTRAL_SETTINGS, i))),
      // Sequence 1 stays unconstrained; rows are filled in the opposite order.
      bitmaskRows: Int32Array.of(1, -1, 0),
      tokenBitmask: bitmask,
      bitmaskWords: words,
      bitmaskReady: ready,
      bitmaskReadyTarget: 2,
    };
    let settled = false;
    const pass = model.forward(batch).finally(() => (settled = true));
    // Both rows are still all zeros (nothing allowed) while the pass runs its layers.
    for (const [row, allowed] of [[1, masks[0]], [0, masks[1]]] as const) {
      await new Promise((resolve) => setTimeout(resolve, 40));
      assert.equal(settled, false, `seed ${seed}: the pass settled before its row ${row} was written`);
      bitmask.set(bitmaskRow(allowed, VOCAB_SIZE), row * words);
      Atomics.add(ready, 0, 1);
    }
    const result = await pass;
    const bestOf = (allowed: number[]) => argmax(adjustLogits(raw, { ...NEUTRAL_SETTINGS, allowedTokenIds: allowed }));
    assert.deepEqual(Array.from(result.sampledTokenIds), [bestOf(masks[0]), argmax(raw), bestOf(masks[1])], `seed ${seed}`);
  });
});
