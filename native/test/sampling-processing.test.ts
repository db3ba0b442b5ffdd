// Logit bias, penalties and min-p in native sampling, held against the reference chain
// (sampling-reference.ts) applied to the raw logits the same pass returns: greedy ids exactly,
// seeded draws by their frequencies over many output indices. Models, prompts and settings are
// drawn fresh each run; failures print the seed.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { MAX_TOP_LOGPROBS, SEQ_RETURN_LOGITS, SEQ_SAMPLE } from '../api.ts';
import {
  buildBatch,
  freshSeed,
  randomTokens,
  uniformSource,
  type PenaltyEntry,
} from './helpers.ts';
import {
  NEUTRAL_SETTINGS,
  adjustLogits,
  argmax,
  chiSquare,
  chiSquareLimit,
  logSoftmax,
  samplingDistribution,
  type SamplingSettings,
} from './sampling-reference.ts';
import { chunkOf, drawCounts, rawLogitsOf, withSamplingModel } from './sampling-harness.ts';

const VOCAB_SIZE = 64;
const PROMPT_TOKENS = 8;
const DRAWS_PER_CASE = 4096;


/** Ids by raw logit, descending. */
function ranked(raw: Float32Array): number[] {
  return Array.from(raw.keys()).sort((a, b) => raw[b] - raw[a] || a - b);
}

function between(random: () => number, low: number, high: number): number {
  return low + (high - low) * random();
}

/** A history of distinct tokens that always includes the raw top three, with output counts 0..4. */
function randomHistory(random: () => number, raw: Float32Array): PenaltyEntry[] {
  const top = ranked(raw).slice(0, 3);
  const others = randomTokens(12, VOCAB_SIZE, Math.floor(random() * 2 ** 31)).filter((id) => !top.includes(id));
  return [...new Set([...top, ...others])].map((tokenId, i) => {
    const outputCount = i < 3 ? 1 + Math.floor(random() * 4) : Math.floor(random() * 5);
    return { tokenId, outputCount, inPrompt: outputCount === 0 || random() < 0.5 };
  });
}

/** Random biases on the raw top two (pushed down) and on a few others, each token once. */
function randomBias(random: () => number, raw: Float32Array): Array<[number, number]> {
  const [first, second] = ranked(raw);
  const others = randomTokens(6, VOCAB_SIZE, Math.floor(random() * 2 ** 31)).filter((id) => id !== first && id !== second);
  return [
    [first, -between(random, 0.5, 4)],
    [second, -between(random, 0, 2)],
    ...[...new Set(others)].map((id): [number, number] => [id, between(random, -3, 3)]),
  ];
}

type Adjustment = 'bias' | 'repetition' | 'frequency' | 'presence' | 'all';

function randomAdjustments(random: () => number, raw: Float32Array, adjustment: Adjustment): SamplingSettings {
  const uses = (kind: Adjustment) => adjustment === kind || adjustment === 'all';
  const penalized = adjustment !== 'bias';
  return {
    ...NEUTRAL_SETTINGS,
    logitBias: uses('bias') ? randomBias(random, raw) : [],
    penaltyHistory: penalized ? randomHistory(random, raw) : [],
    repetitionPenalty: uses('repetition') ? (random() < 0.5 ? between(random, 0.3, 0.9) : between(random, 1.2, 3)) : 1,
    frequencyPenalty: uses('frequency') ? between(random, -2, 2) : 0,
    presencePenalty: uses('presence') ? between(random, -2, 2) : 0,
  };
}

test('greedy after logit bias and each penalty takes the exact argmax of the reference adjusted logits', async (t) => {
  const seed = freshSeed(t);
  const random = uniformSource(seed);
  await withSamplingModel(VOCAB_SIZE, seed, async (model) => {
    const adjustments: Adjustment[] = ['bias', 'repetition', 'frequency', 'presence', 'all'];
    const numPrompts = 8;
    let numMoved = 0;
    for (let p = 0; p < numPrompts; p++) {
      const prompt = randomTokens(PROMPT_TOKENS, VOCAB_SIZE, seed + p);
      const raw = await rawLogitsOf(model, prompt);
      // Greedy by temperature 0, and by top_k 1 at a temperature that would otherwise draw.
      const cases = adjustments.flatMap((adjustment) => {
        const settings = randomAdjustments(random, raw, adjustment);
        return [
          { adjustment, settings },
          { adjustment, settings: { ...settings, temperature: 1.3, topK: 1 } },
        ];
      });
      const result = await model.forward(
        buildBatch(cases.map(({ settings }, i) => chunkOf(prompt, settings, i, { flags: SEQ_SAMPLE | SEQ_RETURN_LOGITS, seed: BigInt(i) }))),
      );
      cases.forEach(({ adjustment, settings }, i) => {
        const returned = result.logits.subarray(i * VOCAB_SIZE, (i + 1) * VOCAB_SIZE);
        assert.deepEqual(returned, raw, `seed ${seed}: SEQ_RETURN_LOGITS returns the raw logits whatever the adjustments`);
        const expected = argmax(adjustLogits(raw, settings));
        assert.equal(result.sampledTokenIds[i], expected, `seed ${seed}, prompt ${p}, ${adjustment}: ${JSON.stringify(settings)}`);
        const logprob = logSoftmax(raw)[expected];
        assert.ok(Math.abs(result.sampledLogprobs[i] - logprob) < 1e-5, `seed ${seed}: the sampled logprob is the raw one`);
        if (expected !== argmax(raw)) numMoved++;
      });
    }
    // The raw favourite is pushed down in most cases, so a runtime ignoring the adjustments fails.
    assert.ok(numMoved >= numPrompts, `seed ${seed}: only ${numMoved} cases moved the argmax`);
  });
});

test('a -Infinity bias bans tokens (min_tokens): greedy takes the best of the rest', async (t) => {
  const seed = freshSeed(t);
  await withSamplingModel(VOCAB_SIZE, seed, async (model) => {
    const prompt = randomTokens(PROMPT_TOKENS, VOCAB_SIZE, seed);
    const raw = await rawLogitsOf(model, prompt);
    const order = ranked(raw);
    const banned: Array<[number, number]> = order.slice(0, 3).map((id) => [id, -Infinity]);
    const result = await model.forward(buildBatch([chunkOf(prompt, { ...NEUTRAL_SETTINGS, logitBias: banned }, 0)]));
    assert.equal(result.sampledTokenIds[0], order[3], `seed ${seed}`);
  });
});

test('a row with every token banned falls back to the raw argmax, greedy or drawn', async (t) => {
  const seed = freshSeed(t);
  await withSamplingModel(VOCAB_SIZE, seed, async (model) => {
    const prompt = randomTokens(PROMPT_TOKENS, VOCAB_SIZE, seed);
    const raw = await rawLogitsOf(model, prompt);
    const allBanned = Array.from({ length: VOCAB_SIZE }, (_, id): [number, number] => [id, -Infinity]);
    const settings: SamplingSettings[] = [
      { ...NEUTRAL_SETTINGS, logitBias: allBanned },
      { ...NEUTRAL_SETTINGS, logitBias: allBanned, temperature: 1, topP: 0.9, minP: 0.1, repetitionPenalty: 1.5, penaltyHistory: [{ tokenId: 3, outputCount: 2, inPrompt: true }] },
      { ...NEUTRAL_SETTINGS, logitBias: allBanned, temperature: 0.5, topK: 5 },
    ];
    const result = await model.forward(buildBatch(settings.map((s, i) => chunkOf(prompt, s, i, { seed: BigInt(seed), numTopLogprobs: 2 }))));
    const expected = argmax(raw);
    settings.forEach((s, i) => {
      assert.equal(result.sampledTokenIds[i], expected, `seed ${seed}, case ${i}`);
      assert.ok(Math.abs(result.sampledLogprobs[i] - logSoftmax(raw)[expected]) < 1e-5, `seed ${seed}, case ${i}`);
      assert.equal(result.topTokenIds[i * MAX_TOP_LOGPROBS], expected, `seed ${seed}: top logprobs stay those of the raw logits`);
    });
  });
});

test('a repetition penalty small enough to overflow a logit to +Infinity gives that token', async (t) => {
  const seed = freshSeed(t);
  await withSamplingModel(VOCAB_SIZE, seed, async (model) => {
    const prompt = randomTokens(PROMPT_TOKENS, VOCAB_SIZE, seed);
    const raw = await rawLogitsOf(model, prompt);
    // Dividing the top two (positive) logits by 1e-44 overflows both; the lower id wins.
    const [first, second] = ranked(raw);
    assert.ok(raw[second] > 1e-5, `seed ${seed}: the test needs two positive logits`);
    const history = [first, second].map((tokenId) => ({ tokenId, outputCount: 0, inPrompt: true }));
    const result = await model.forward(
      buildBatch([chunkOf(prompt, { ...NEUTRAL_SETTINGS, temperature: 1, repetitionPenalty: 1e-44, penaltyHistory: history }, 0, { seed: BigInt(seed) })]),
    );
    assert.equal(result.sampledTokenIds[0], Math.min(first, second), `seed ${seed}`);
  });
});

// Chi-square at a 1e-6 false-failure rate per case (Wilson–Hilferty quantile), and an exact
// check that nothing outside the reference's support is ever drawn.
test('draws with min-p, top-k, top-p, penalties and bias follow the reference distribution', async (t) => {
  const seed = freshSeed(t);
  const random = uniformSource(seed);
  await withSamplingModel(VOCAB_SIZE, seed, async (model) => {
    const prompt = randomTokens(PROMPT_TOKENS, VOCAB_SIZE, seed);
    const raw = await rawLogitsOf(model, prompt);
    const bans = ranked(raw).slice(0, 3).map((id): [number, number] => [id, -Infinity]);
    const cases: Record<string, SamplingSettings> = {
      'min-p with penalties': {
        ...randomAdjustments(random, raw, 'all'), logitBias: [], temperature: between(random, 0.7, 1.5), minP: between(random, 0.05, 0.3),
      },
      'top-k and top-p with bias': {
        ...randomAdjustments(random, raw, 'bias'), temperature: between(random, 0.7, 2), topK: 2 + Math.floor(random() * 11), topP: between(random, 0.5, 0.95),
      },
      'everything at once': {
        ...randomAdjustments(random, raw, 'all'),
        temperature: between(random, 0.5, 2),
        minP: between(random, 0, 0.1),
        topK: 5 + Math.floor(random() * 30),
        topP: between(random, 0.7, 1),
      },
      'the raw top three banned, min_tokens style': { ...NEUTRAL_SETTINGS, logitBias: bans, temperature: 1 },
    };
    for (const [name, settings] of Object.entries(cases)) {
      await t.test(name, async () => {
        const label = `seed ${seed}, ${name}: ${JSON.stringify(settings)}`;
        const probs = samplingDistribution(raw, settings);
        const counts = await drawCounts(model, VOCAB_SIZE, prompt, settings, BigInt(seed), DRAWS_PER_CASE);
        counts.forEach((count, id) => assert.ok(count === 0 || probs[id] > 0, `${label}: token ${id} drawn ${count} times outside the support`));
        const { statistic, degreesOfFreedom } = chiSquare(counts, probs);
        assert.ok(statistic <= chiSquareLimit(degreesOfFreedom), `${label}: chi-square ${statistic.toFixed(1)} over ${degreesOfFreedom} degrees of freedom`);
      });
    }
  });
});

test('with penalties and min-p, the same seed repeats its draws and another seed does not', async (t) => {
  const seed = freshSeed(t);
  const random = uniformSource(seed);
  await withSamplingModel(VOCAB_SIZE, seed, async (model) => {
    const prompt = randomTokens(PROMPT_TOKENS, VOCAB_SIZE, seed);
    const raw = await rawLogitsOf(model, prompt);
    const settings: SamplingSettings = { ...randomAdjustments(random, raw, 'all'), temperature: 1.5, minP: 0.01 };
    const drawsOf = async (drawSeed: bigint) => {
      const chunks = Array.from({ length: 128 }, (_, i) => chunkOf(prompt, settings, i, { seed: drawSeed, outputIndex: i }));
      return Array.from((await model.forward(buildBatch(chunks))).sampledTokenIds);
    };
    const first = await drawsOf(BigInt(seed));
    assert.deepEqual(await drawsOf(BigInt(seed)), first, `seed ${seed}`);
    assert.notDeepEqual(await drawsOf(BigInt(seed) + 1n), first, `seed ${seed}`);
  });
});
