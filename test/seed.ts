// Seeds of the randomized tests. A run draws a fresh seed unless CONDUIT_TEST_SEED names one,
// and every test that draws one reports it as a diagnostic, passing or failing, so any run can
// be replayed: CONDUIT_TEST_SEED=<seed> node --import tsx --test <file>.
import type { TestContext } from 'node:test';

export const TEST_SEED_VARIABLE = 'CONDUIT_TEST_SEED';

/** The seed CONDUIT_TEST_SEED names (a non-negative integer below 2^31), or null when it is unset. */
export function seedFromEnvironment(value: string | undefined): number | null {
  if (value === undefined || value === '') return null;
  const seed = Number(value);
  if (!Number.isInteger(seed) || seed < 0 || seed >= 2 ** 31) {
    throw new Error(`${TEST_SEED_VARIABLE} must be an integer in [0, 2^31), not '${value}'`);
  }
  return seed;
}

/** A seed for one test: CONDUIT_TEST_SEED's, or a fresh one; reported on t when given. */
export function testSeed(t?: TestContext): number {
  const seed = seedFromEnvironment(process.env[TEST_SEED_VARIABLE]) ?? Math.floor(Math.random() * 2 ** 31);
  t?.diagnostic(`seed ${seed} (replay: ${TEST_SEED_VARIABLE}=${seed})`);
  return seed;
}
