// Token-length distributions for the `distribution` scenario, written on the command line as
// `fixed:N`, `uniform:MIN:MAX`, `normal:MEAN:STDDEV` or `lognormal:MEAN:STDDEV`. Draws are
// rounded and clamped to at least one token.

import { type Rng, randomInt, standardNormal } from './random.ts';

export type LengthDistribution =
  | { kind: 'fixed'; tokens: number }
  | { kind: 'uniform'; minTokens: number; maxTokens: number }
  | { kind: 'normal' | 'lognormal'; meanTokens: number; stddevTokens: number };

export function parseLengthDistribution(spec: string): LengthDistribution {
  const [kind, ...rest] = spec.split(':');
  const numbers = rest.map(Number);
  const usage = `expected fixed:N, uniform:MIN:MAX, normal:MEAN:STDDEV or lognormal:MEAN:STDDEV but received "${spec}"`;
  if (numbers.some((value) => !Number.isFinite(value) || value < 0)) throw new Error(usage);
  if (kind === 'fixed' && numbers.length === 1 && numbers[0] >= 1) return { kind, tokens: numbers[0] };
  if (kind === 'uniform' && numbers.length === 2 && numbers[0] >= 1 && numbers[1] >= numbers[0]) {
    return { kind, minTokens: numbers[0], maxTokens: numbers[1] };
  }
  if ((kind === 'normal' || kind === 'lognormal') && numbers.length === 2 && numbers[0] >= 1) {
    return { kind, meanTokens: numbers[0], stddevTokens: numbers[1] };
  }
  throw new Error(usage);
}

export function drawLength(rng: Rng, distribution: LengthDistribution): number {
  switch (distribution.kind) {
    case 'fixed':
      return distribution.tokens;
    case 'uniform':
      return randomInt(rng, distribution.minTokens, distribution.maxTokens);
    case 'normal':
      return clampLength(distribution.meanTokens + distribution.stddevTokens * standardNormal(rng));
    case 'lognormal': {
      // Parameters of the underlying normal chosen so the draws have the requested mean and stddev.
      const { meanTokens: mean, stddevTokens: stddev } = distribution;
      const sigmaSquared = Math.log(1 + (stddev * stddev) / (mean * mean));
      const mu = Math.log(mean) - sigmaSquared / 2;
      return clampLength(Math.exp(mu + Math.sqrt(sigmaSquared) * standardNormal(rng)));
    }
  }
}

function clampLength(tokens: number): number {
  return Math.max(1, Math.round(tokens));
}

/**
 * numLengths lengths drawn uniformly from meanTokens ± halfWidthTokens, in mirrored pairs
 * (mean + d, mean - d) so that their mean is meanTokens exactly whatever the draws: a workload of
 * spread lengths then asks for as many tokens as the fixed one it stands beside.
 */
export function mirroredUniformLengths(rng: Rng, numLengths: number, meanTokens: number, halfWidthTokens: number): number[] {
  if (!(Number.isInteger(meanTokens) && Number.isInteger(halfWidthTokens) && halfWidthTokens >= 0 && meanTokens - halfWidthTokens >= 1)) {
    throw new Error(`expected integers with mean - halfWidth >= 1 but received mean ${meanTokens}, halfWidth ${halfWidthTokens}`);
  }
  const lengths: number[] = [];
  while (lengths.length < numLengths) {
    const offset = randomInt(rng, -halfWidthTokens, halfWidthTokens);
    lengths.push(meanTokens + offset);
    if (lengths.length < numLengths) lengths.push(meanTokens - offset);
  }
  return lengths;
}
