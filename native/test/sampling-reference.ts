// The sampling chain written the plain way, for the tests to hold the runtime against: logit
// bias, penalties, temperature, min-p, top-k, top-p, and log-softmax / top-N of raw logits.
//
// The runtime adjusts logits in fp32, one operation at a time, as vLLM does; Math.fround of one
// fp64 +, −, × or ÷ of two floats is exactly that fp32 operation, so the adjusted logits here are
// the runtime's bit for bit (and a greedy id can be compared exactly). Everything after them
// (probabilities, truncation, log-softmax) is fp64.
import type { PenaltyEntry } from './helpers.ts';

/** One sequence's sampling settings, as buildBatch takes them. */
export interface SamplingSettings {
  temperature: number;
  topP: number;
  topK: number;
  minP: number;
  presencePenalty: number;
  frequencyPenalty: number;
  repetitionPenalty: number;
  penaltyHistory: readonly PenaltyEntry[];
  logitBias: ReadonlyArray<readonly [number, number]>;
  /** A structured output's mask: the only tokens allowed; null for none. */
  allowedTokenIds?: readonly number[] | null;
}

export const NEUTRAL_SETTINGS: SamplingSettings = {
  temperature: 0,
  topP: 1,
  topK: 0,
  minP: 0,
  presencePenalty: 0,
  frequencyPenalty: 0,
  repetitionPenalty: 1,
  penaltyHistory: [],
  logitBias: [],
};

const f32 = Math.fround;

/** The raw logits with every token the mask does not allow at -Infinity (unchanged without a mask). */
export function maskedLogits(raw: Float32Array, settings: SamplingSettings): Float64Array {
  const logits = Float64Array.from(raw);
  const allowed = settings.allowedTokenIds;
  if (allowed == null) return logits;
  const allowedSet = new Set(allowed);
  for (let id = 0; id < logits.length; id++) if (!allowedSet.has(id)) logits[id] = -Infinity;
  return logits;
}

/** The mask, then bias, then the repetition penalty, then the frequency and presence penalties; parameters as the batch's Float32Arrays hold them. */
export function adjustLogits(raw: Float32Array, settings: SamplingSettings): Float64Array {
  const logits = maskedLogits(raw, settings);
  for (const [tokenId, value] of settings.logitBias) logits[tokenId] = f32(logits[tokenId] + f32(value));
  const repetition = f32(settings.repetitionPenalty);
  const frequency = f32(settings.frequencyPenalty);
  const presence = f32(settings.presencePenalty);
  for (const { tokenId, outputCount, inPrompt } of settings.penaltyHistory) {
    let logit = logits[tokenId];
    if (outputCount > 0 || inPrompt) logit = logit > 0 ? f32(logit / repetition) : f32(logit * repetition);
    if (outputCount > 0) logit = f32(f32(logit - f32(frequency * outputCount)) - presence);
    logits[tokenId] = logit;
  }
  return logits;
}

/** The largest value's lowest index. */
export function argmax(values: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < values.length; i++) if (values[i] > values[best]) best = i;
  return best;
}

/** Ids from the largest value down, ties to the lower id (the runtime's order of top ids and ranks). */
export function idsByValue(values: ArrayLike<number>): number[] {
  return Array.from({ length: values.length }, (_, i) => i).sort((a, b) => values[b] - values[a] || a - b);
}

/**
 * The distribution a draw follows: one-hot on the argmax when greedy (or when every token is
 * banned: the best the mask allows, else the raw argmax); otherwise softmax(logits / temperature) with tokens below minP × the
 * largest probability dropped, then all but the topK most likely, then all past the smallest
 * most-likely prefix holding topP of what is left, renormalized.
 */
export function samplingDistribution(raw: Float32Array, settings: SamplingSettings): Float64Array {
  const logits = adjustLogits(raw, settings);
  const probs = new Float64Array(raw.length);
  const best = argmax(logits);
  if (logits[best] === -Infinity) {
    // Everything banned: the best the mask allows, or the raw argmax when it allows nothing.
    const masked = maskedLogits(raw, settings);
    const allowedBest = argmax(masked);
    probs[masked[allowedBest] === -Infinity ? argmax(raw) : allowedBest] = 1;
    return probs;
  }
  const temperature = f32(settings.temperature);
  if (temperature === 0 || settings.topK === 1) {
    probs[best] = 1;
    return probs;
  }
  const minP = f32(settings.minP);
  let candidates = idsByValue(logits);
  for (const id of candidates) probs[id] = Math.exp((logits[id] - logits[best]) / temperature);
  candidates = candidates.filter((id) => probs[id] >= minP);
  if (settings.topK > 0) candidates = candidates.slice(0, settings.topK);
  const total = candidates.reduce((sum, id) => sum + probs[id], 0);
  let kept = 0;
  let cumulative = 0;
  while (kept < candidates.length && cumulative < f32(settings.topP) * total) cumulative += probs[candidates[kept++]];
  const distribution = new Float64Array(raw.length);
  for (const id of candidates.slice(0, kept)) distribution[id] = probs[id] / cumulative;
  return distribution;
}

export function logSoftmax(logits: ArrayLike<number>): Float64Array {
  let max = -Infinity;
  for (let i = 0; i < logits.length; i++) max = Math.max(max, logits[i]);
  let sum = 0;
  for (let i = 0; i < logits.length; i++) sum += Math.exp(logits[i] - max);
  const logSum = Math.log(sum);
  return Float64Array.from(logits, (x) => x - max - logSum);
}

/** The n most likely ids under raw logits, descending, ties to the lower id, with their log-softmax. */
export function topLogprobs(logits: Float32Array, n: number): { ids: number[]; logprobs: number[] } {
  const logprobs = logSoftmax(logits);
  const ids = idsByValue(logits).slice(0, n);
  return { ids, logprobs: ids.map((id) => logprobs[id]) };
}

/**
 * Pearson's chi-square statistic of observed counts against a distribution, bins expecting fewer
 * than 5 draws pooled (with the smallest regular bin while the pool itself expects fewer than 5),
 * and its degrees of freedom.
 */
export function chiSquare(counts: ArrayLike<number>, probs: Float64Array): { statistic: number; degreesOfFreedom: number } {
  let numDraws = 0;
  for (let i = 0; i < counts.length; i++) numDraws += counts[i];
  const bins: Array<{ expected: number; observed: number }> = [];
  const pool = { expected: 0, observed: 0 };
  for (let id = 0; id < probs.length; id++) {
    const expected = numDraws * probs[id];
    if (expected >= 5) bins.push({ expected, observed: counts[id] });
    else {
      pool.expected += expected;
      pool.observed += counts[id];
    }
  }
  bins.sort((a, b) => a.expected - b.expected);
  while (pool.expected > 0 && pool.expected < 5 && bins.length > 0) {
    const smallest = bins.shift()!;
    pool.expected += smallest.expected;
    pool.observed += smallest.observed;
  }
  if (pool.expected > 0) bins.push(pool);
  const statistic = bins.reduce((sum, { expected, observed }) => sum + (observed - expected) ** 2 / expected, 0);
  return { statistic, degreesOfFreedom: bins.length - 1 };
}

/**
 * The chi-square quantile exceeded with probability about 1e-6 (Wilson–Hilferty; z = 4.753 is the
 * normal's 1 − 1e-6 quantile). It errs high for few degrees of freedom, which only makes a false
 * failure rarer.
 */
export function chiSquareLimit(degreesOfFreedom: number): number {
  if (degreesOfFreedom === 0) return 0;
  const z = 4.753;
  const a = 2 / (9 * degreesOfFreedom);
  return degreesOfFreedom * (1 - a + z * Math.sqrt(a)) ** 3;
}
