// Goodness of fit of seeded draws: temperature, top-k, top-p and min-p, alone and combined, on
// a random model's raw logits, against the truncated, renormalized softmax computed in fp64
// (sampling-reference.ts). Each case draws DRAWS_PER_CASE tokens of one seed at output indices
// 0, 1, ... and must pass Pearson's chi-square at a 1e-6 false-failure rate, and never draw a
// token outside the reference's support. Each case's settings are placed on the logits drawn
// (cuts midway between two tokens, temperatures away from 1), and the test first shows that the
// near-miss distributions a plausible bug produces (top-k off by one, top-p not renormalized, the
// temperature applied twice or not at all, a min-p threshold without the temperature) would fail
// it with overwhelming probability. Seeds: the draws over many seeds at one output index follow
// the distribution too (a sampler ignoring the seed draws one token), and a seed repeats alone or
// in any batch.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { NativeModel } from '../api.ts';
import { SEQ_RETURN_LOGITS, SEQ_SAMPLE } from '../api.ts';
import { buildBatch, freshSeed, loadOptions, makeTempDir, randomTokens, withModel, writeCheckpoint, type SeqChunk } from './helpers.ts';
import { NEUTRAL_SETTINGS, chiSquare, chiSquareLimit, idsByValue, samplingDistribution, type SamplingSettings } from './sampling-reference.ts';

const VOCAB_SIZE = 64;
const PROMPT_TOKENS = 4;
const SEQS_PER_PASS = 256;
const DRAWS_PER_CASE = 16384;
/**
 * How far a near-miss distribution must sit from the right one: its expected chi-square over
 * DRAWS_PER_CASE draws (the noncentrality) at least this many times the 1e-6 limit, so that the
 * test fails it with overwhelming probability, not by luck.
 */
const MIN_POWER_RATIO = 4;

type Truncation = Pick<SamplingSettings, 'temperature' | 'topK' | 'topP' | 'minP'>;

async function withRandomModel(seed: number, fn: (model: NativeModel) => Promise<void>): Promise<void> {
  using temp = makeTempDir('sampling-statistics');
  const modelDir = writeCheckpoint(temp.dir, 'model', {
    arch: 'llama', hiddenSize: 32, numLayers: 1, numHeads: 2, numKvHeads: 2, intermediateSize: 48, vocabSize: VOCAB_SIZE, dtype: 'fp32', seed,
  });
  await withModel(loadOptions(modelDir, { numKvBlocks: SEQS_PER_PASS }), fn);
}

function chunkOf(prompt: readonly number[], seq: number, extra: Partial<SeqChunk>): SeqChunk {
  return { tokenIds: prompt, startPosition: 0, blockIds: [seq], flags: SEQ_SAMPLE, ...extra };
}

/** Draws of each (seed, outputIndex) pair, SEQS_PER_PASS per forward pass, in order. */
async function drawAll(model: NativeModel, prompt: readonly number[], truncation: Truncation, draws: ReadonlyArray<{ seed: bigint; outputIndex: number }>): Promise<number[]> {
  const tokenIds: number[] = [];
  for (let first = 0; first < draws.length; first += SEQS_PER_PASS) {
    const chunks = draws.slice(first, first + SEQS_PER_PASS).map((draw, i) => chunkOf(prompt, i, { ...truncation, ...draw }));
    tokenIds.push(...(await model.forward(buildBatch(chunks))).sampledTokenIds);
  }
  return tokenIds;
}

function countsOf(tokenIds: readonly number[]): Float64Array {
  const counts = new Float64Array(VOCAB_SIZE);
  for (const tokenId of tokenIds) counts[tokenId]++;
  return counts;
}

function distributionOf(raw: Float32Array, truncation: Truncation): Float64Array {
  return samplingDistribution(raw, { ...NEUTRAL_SETTINGS, ...truncation });
}

/** The softmax of raw / temperature, sorted descending. */
function sortedProbs(raw: Float32Array, temperature: number): number[] {
  const max = Math.max(...raw);
  const weights = Array.from(raw, (x) => Math.exp((x - max) / temperature)).sort((a, b) => b - a);
  const total = weights.reduce((sum, w) => sum + w, 0);
  return weights.map((w) => w / total);
}

/** A top-p midway between the cumulative masses of the first rank and rank + 1 most likely tokens (renormalized over the first `among`). */
function topPCuttingAfter(probs: readonly number[], rank: number, among = probs.length): number {
  const kept = probs.slice(0, among);
  const total = kept.reduce((sum, p) => sum + p, 0);
  const cumulative = (n: number) => kept.slice(0, n).reduce((sum, p) => sum + p, 0) / total;
  return (cumulative(rank) + cumulative(rank + 1)) / 2;
}

/** A min-p midway (geometrically) between the probability ratios of the rank-th and (rank + 1)-th most likely tokens to the first. */
function minPCuttingAfter(probs: readonly number[], rank: number): number {
  return Math.sqrt((probs[rank - 1] / probs[0]) * (probs[rank] / probs[0]));
}

/** What a top-p that forgets to renormalize draws: the dropped tail's mass lands on the last kept token. */
function withoutTopPRenormalization(raw: Float32Array, truncation: Truncation): Float64Array {
  const truncated = distributionOf(raw, truncation);
  const probs = distributionOf(raw, { ...truncation, topP: 1 });
  const kept = idsByValue(truncated).filter((id) => truncated[id] > 0);
  let keptMass = 0;
  for (let id = 0; id < probs.length; id++) {
    if (truncated[id] > 0) keptMass += probs[id];
    else probs[id] = 0;
  }
  probs[kept.at(-1)!] += 1 - keptMass;
  return probs;
}

/**
 * How surely DRAWS_PER_CASE draws from `alternative` fail the test of `expected`, as a multiple of
 * what suffices: Pearson's noncentrality (the chi-square the alternative expects beyond its
 * degrees of freedom) over the 1e-6 limit, or the expected number of draws outside the support
 * over 20 (e^-20 of never drawing one). At 1 or more a bug is caught but for odds below 1e-9.
 */
function powerAgainst(expected: Float64Array, alternative: Float64Array): number {
  let noncentrality = 0;
  let outsideMass = 0;
  for (let id = 0; id < expected.length; id++) {
    if (expected[id] > 0) noncentrality += (alternative[id] - expected[id]) ** 2 / expected[id];
    else outsideMass += alternative[id];
  }
  const limit = chiSquareLimit(expected.filter((p) => p > 0).length - 1);
  return Math.max((DRAWS_PER_CASE * noncentrality) / (MIN_POWER_RATIO * limit), (DRAWS_PER_CASE * outsideMass) / 20);
}

interface Case {
  name: string;
  truncation: Truncation;
  /** The bugs this case is there to catch, as the distributions they would draw from. */
  nearMisses: Record<string, Float64Array>;
}

function nearMissesOf(raw: Float32Array, truncation: Truncation, bugs: readonly string[]): Record<string, Float64Array> {
  const { temperature, topK, minP } = truncation;
  const all: Record<string, () => Float64Array> = {
    'temperature applied twice': () => distributionOf(raw, { ...truncation, temperature: temperature * temperature }),
    'temperature ignored': () => distributionOf(raw, { ...truncation, temperature: 1 }),
    'top-k one short': () => distributionOf(raw, { ...truncation, topK: topK - 1 }),
    'top-k one over': () => distributionOf(raw, { ...truncation, topK: topK + 1 }),
    'top-p not renormalized': () => withoutTopPRenormalization(raw, truncation),
    // A threshold of max + ln(min_p) on the logits, without the temperature: min_p^(1/T) on the probabilities.
    'min-p threshold without the temperature': () => distributionOf(raw, { ...truncation, minP: minP ** (1 / temperature) }),
  };
  return Object.fromEntries(bugs.map((bug) => [bug, all[bug]()]));
}

/** Of the candidates, the case its near misses fail most surely. */
function mostTelling(raw: Float32Array, name: (truncation: Truncation) => string, candidates: readonly Truncation[], bugs: readonly string[]): Case {
  const scored = candidates.map((truncation) => {
    const expected = distributionOf(raw, truncation);
    const nearMisses = nearMissesOf(raw, truncation, bugs);
    return { truncation, nearMisses, power: Math.min(...Object.values(nearMisses).map((alternative) => powerAgainst(expected, alternative))) };
  });
  const best = scored.reduce((a, b) => (b.power > a.power ? b : a));
  return { name: name(best.truncation), truncation: best.truncation, nearMisses: best.nearMisses };
}

const RANKS = [3, 4, 5, 6, 7, 8, 9, 10, 12];

/**
 * Cases placed on these logits: temperatures scaled to their spread (so the softmax is neither
 * one-hot nor flat, and away from 1 so that T and T² differ), cuts midway between two tokens,
 * each case's cut chosen where its near misses differ most from it.
 */
function casesFor(raw: Float32Array): Case[] {
  const mean = raw.reduce((sum, x) => sum + x, 0) / raw.length;
  const spread = Math.sqrt(raw.reduce((sum, x) => sum + (x - mean) ** 2, 0) / raw.length);
  const cool = spread / 1.5 < 1 ? Math.min(spread / 1.5, 0.6) : Math.max(spread / 1.5, 1.6);
  const warm = cool * 1.8;
  const plain = (temperature: number): Truncation => ({ temperature, topK: 0, topP: 1, minP: 0 });
  const probs = { cool: sortedProbs(raw, cool), warm: sortedProbs(raw, warm) };
  const temperatureBugs = ['temperature applied twice', 'temperature ignored'];
  const describe = ({ temperature, topK, topP, minP }: Truncation) =>
    [`temperature ${temperature.toPrecision(3)}`, minP > 0 && `min-p ${minP.toPrecision(3)}`, topK > 0 && `top-k ${topK}`, topP < 1 && `top-p ${topP.toPrecision(3)}`]
      .filter(Boolean)
      .join(', ');
  return [
    mostTelling(raw, describe, [plain(cool)], temperatureBugs),
    mostTelling(raw, describe, [plain(warm)], temperatureBugs),
    mostTelling(raw, describe, RANKS.map((topK) => ({ ...plain(warm), topK })), ['top-k one short', 'top-k one over']),
    mostTelling(raw, describe, RANKS.map((rank) => ({ ...plain(warm), topP: topPCuttingAfter(probs.warm, rank) })), ['top-p not renormalized']),
    ...(['cool', 'warm'] as const).map((heat) =>
      mostTelling(
        raw,
        describe,
        RANKS.map((rank) => ({ ...plain(heat === 'cool' ? cool : warm), minP: minPCuttingAfter(probs[heat], rank) })),
        ['min-p threshold without the temperature'],
      ),
    ),
    mostTelling(raw, describe, RANKS.map((rank) => ({ ...plain(warm), topK: 8, topP: topPCuttingAfter(probs.warm, Math.min(rank, 7), 8) })), ['top-p not renormalized']),
    // min-p first: top-p's share is of what min-p and top-k leave.
    mostTelling(
      raw,
      describe,
      RANKS.map((rank) => ({ ...plain(warm), minP: minPCuttingAfter(probs.warm, 9), topK: 12, topP: topPCuttingAfter(probs.warm, Math.min(rank, 8), 9) })),
      ['top-p not renormalized'],
    ),
  ];
}

test('seeded draws follow the truncated, renormalized softmax: temperature, top-k, top-p, min-p, alone and combined', async (t) => {
  const seed = freshSeed(t);
  await withRandomModel(seed, async (model) => {
    const prompt = randomTokens(PROMPT_TOKENS, VOCAB_SIZE, seed);
    const raw = (await model.forward(buildBatch([chunkOf(prompt, 0, { flags: SEQ_RETURN_LOGITS })]))).logits;
    const cases = casesFor(raw);

    // Power: each near miss, drawn DRAWS_PER_CASE times, fails some case but for odds below 1e-9.
    const bestPower = new Map<string, number>();
    for (const { name, truncation, nearMisses } of cases) {
      const expected = distributionOf(raw, truncation);
      for (const [bug, alternative] of Object.entries(nearMisses)) {
        const power = powerAgainst(expected, alternative);
        t.diagnostic(`${name}: "${bug}" power ${power.toFixed(1)}`);
        bestPower.set(bug, Math.max(bestPower.get(bug) ?? 0, power));
      }
    }
    assert.equal(bestPower.size, 6);
    for (const [bug, power] of bestPower) assert.ok(power >= 1, `seed ${seed}: "${bug}" would pass too easily (power ${power.toFixed(2)} < 1)`);

    for (const { name, truncation } of cases) {
      await t.test(name, async () => {
        const label = `seed ${seed}, ${name}: ${JSON.stringify(truncation)}`;
        const expected = distributionOf(raw, truncation);
        const draws = Array.from({ length: DRAWS_PER_CASE }, (_, outputIndex) => ({ seed: BigInt(seed), outputIndex }));
        const counts = countsOf(await drawAll(model, prompt, truncation, draws));
        counts.forEach((count, id) => assert.ok(count === 0 || expected[id] > 0, `${label}: token ${id} drawn ${count} times outside the support`));
        const { statistic, degreesOfFreedom } = chiSquare(counts, expected);
        assert.ok(statistic <= chiSquareLimit(degreesOfFreedom), `${label}: chi-square ${statistic.toFixed(1)} over ${degreesOfFreedom} degrees of freedom`);
      });
    }
  });
});

test('different seeds draw differently: at one output index, draws over seeds follow the distribution; a seed repeats alone and in a batch', async (t) => {
  const seed = freshSeed(t);
  await withRandomModel(seed, async (model) => {
    const prompt = randomTokens(PROMPT_TOKENS, VOCAB_SIZE, seed);
    const raw = (await model.forward(buildBatch([chunkOf(prompt, 0, { flags: SEQ_RETURN_LOGITS })]))).logits;
    const truncation = { ...casesFor(raw)[1].truncation, topK: 20 };
    const expected = distributionOf(raw, truncation);
    // The most likely token's share bounds how often two seeds agree: a sampler ignoring the seed
    // draws one token every time.
    assert.ok(Math.max(...expected) < 0.5, `seed ${seed}: the case needs a spread distribution`);

    const outputIndex = seed % 1000;
    const draws = Array.from({ length: DRAWS_PER_CASE }, (_, i) => ({ seed: BigInt(seed) * 7919n + BigInt(i), outputIndex }));
    const bySeed = await drawAll(model, prompt, truncation, draws);
    const { statistic, degreesOfFreedom } = chiSquare(countsOf(bySeed), expected);
    assert.ok(statistic <= chiSquareLimit(degreesOfFreedom), `seed ${seed}: over seeds, chi-square ${statistic.toFixed(1)} over ${degreesOfFreedom} degrees of freedom`);

    // The same seeds again, each alone in a pass, and in a batch shuffled among others.
    for (const i of [0, 1, 2, 3]) {
      const [alone] = await drawAll(model, prompt, truncation, [draws[i]]);
      assert.equal(alone, bySeed[i], `seed ${seed}: draw ${i} alone`);
    }
    const shuffled = draws.slice(0, SEQS_PER_PASS).reverse();
    const again = await drawAll(model, prompt, truncation, shuffled);
    assert.deepEqual(again.reverse(), bySeed.slice(0, SEQS_PER_PASS), `seed ${seed}: the same seeds in another batch order`);
  });
});
