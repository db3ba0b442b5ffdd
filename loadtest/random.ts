// Seeded randomness, so that a scenario and a load schedule replay exactly from --seed.

export type Rng = () => number;

/**
 * mulberry32: a tiny, well-mixed 32-bit generator; returns floats in [0, 1). The state is kept
 * as a signed 32-bit integer, which V8 stores unboxed: kept unsigned, every draw above 2^31
 * allocated a heap number (a checkpoint writer drawing millions left tens of MiB of garbage).
 */
export function createRng(seed: number): Rng {
  let state = seed | 0;
  return () => {
    state = (state + 0x6d2b79f5) | 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export function randomInt(rng: Rng, minInclusive: number, maxInclusive: number): number {
  return minInclusive + Math.floor(rng() * (maxInclusive - minInclusive + 1));
}

/** Gap before the next arrival of a Poisson process with the given rate. */
export function exponentialGapMs(rng: Rng, ratePerS: number): number {
  return (-Math.log(1 - rng()) / ratePerS) * 1000;
}

export function standardNormal(rng: Rng): number {
  // Box-Muller; 1 - u keeps the logarithm finite.
  return Math.sqrt(-2 * Math.log(1 - rng())) * Math.cos(2 * Math.PI * rng());
}

export function shuffleInPlace<T>(rng: Rng, items: T[]): T[] {
  for (let i = items.length - 1; i > 0; i--) {
    const j = Math.floor(rng() * (i + 1));
    [items[i], items[j]] = [items[j], items[i]];
  }
  return items;
}
