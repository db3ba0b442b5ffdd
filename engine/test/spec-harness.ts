// What the speculative decoding suites share: a seeded random source that names its seed, so a
// failing run replays with CONDUIT_TEST_SEED=<seed>.
import type { TestContext } from 'node:test';
import { createRng, type Rng } from '../../loadtest/random.ts';
import { testSeed } from '../../test/seed.ts';

export interface Seeded {
  seed: number;
  random: Rng;
}

/** A fresh seed (or CONDUIT_TEST_SEED's), reported on t, and a generator drawn from it. */
export function seeded(t: TestContext): Seeded {
  const seed = testSeed(t);
  return { seed, random: createRng(seed) };
}
