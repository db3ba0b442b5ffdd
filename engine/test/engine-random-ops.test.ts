// 10,000 random operations on the real engine loop, scheduler and KV manager (prefix caching on)
// over the fake runner: requests added with prompts sharing prefixes, aborted at random points
// (waiting, mid-prefill, decoding, preempted), finished by length and by stop tokens. Before
// every step the pool's counts are checked against the block tables the runner has been handed,
// and at the end, with no request left, every block is free: 0 leaked.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createEngine, type Engine } from '../engine.ts';
import type { KvCacheManager, KvGroup } from '../kv/kv-cache-manager.ts';
import type { RunnerResult, ScheduledSequence, SchedulerOutput } from '../scheduler-output.ts';
import type { GenerateRequest, RequestOutput } from '../types.ts';
import { testSeed } from '../../test/seed.ts';
import { within } from '../../test/wait.ts';
import { FakeRunner, distinctPrompt } from './fake-runner.ts';

const NUM_OPERATIONS = 10_000;
const BLOCK_SIZE = 4;
const MAX_MODEL_LEN = 64;
const EOS = 2;
/** Sampled tokens fall in [STOP_TOKEN, STOP_TOKEN + 16): a request asking to stop at STOP_TOKEN stops by chance. */
const STOP_TOKEN = 200;

/**
 * The engine's KV manager. Nothing outside the scheduler may touch it; this test only reads
 * reference counts from it, to compare them with the block tables the runner saw.
 */
function kvOf(engine: Engine): KvCacheManager {
  return (engine as unknown as { scheduler: { kv: KvCacheManager } }).scheduler.kv;
}

type Rng = () => number;

/** xorshift32, so that a failing seed replays. */
function createRng(seed: number): Rng {
  let state = seed >>> 0 || 1;
  return () => {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    return (state >>> 0) / 2 ** 32;
  };
}

function randomInt(random: Rng, minInclusive: number, maxInclusive: number): number {
  return minInclusive + Math.floor(random() * (maxInclusive - minInclusive + 1));
}

type AbortPoint = 'waiting' | 'prefill' | 'decode' | 'preempted';

/** Runs the random operations from inside the runner, so every step sees them at a point the seed decides. */
class OperatingRunner extends FakeRunner {
  onStep: (output: SchedulerOutput) => void = () => {};

  constructor(random: Rng, numBlocks: number, kvCacheGroups: readonly KvGroup[]) {
    super(
      { numKvBlocks: numBlocks, blockSizeTokens: BLOCK_SIZE, kvCacheGroups, vocabSize: 500, maxModelLen: MAX_MODEL_LEN },
      (_entry: ScheduledSequence) => (random() < 0.02 ? EOS : STOP_TOKEN + randomInt(random, 0, 15)),
    );
  }

  override execute(output: SchedulerOutput): Promise<RunnerResult> {
    this.onStep(output);
    return super.execute(output);
  }
}

/**
 * One full-attention group, and a hybrid model's groups (vLLM's hybrid allocator: one full group
 * and two sliding ones of a 6-token window), where sliding blocks are freed mid-sequence and a
 * prefix hit needs only what the window reaches; the fake runner checks every step's reads.
 */
const LAYOUTS: ReadonlyArray<{ name: string; numBlocks: number; groups: KvGroup[] }> = [
  { name: 'one full-attention group', numBlocks: 24, groups: [{ slidingWindowTokens: null }] },
  {
    name: 'a full group and two sliding-window groups',
    numBlocks: 40,
    groups: [{ slidingWindowTokens: null }, { slidingWindowTokens: 6 }, { slidingWindowTokens: 6 }],
  },
];

for (const { name, numBlocks: NUM_BLOCKS, groups } of LAYOUTS) test(`${NUM_OPERATIONS.toLocaleString('en')} random add / abort / finish operations on the engine leak no KV block: ${name}`, async (t) => {
  const seed = testSeed(t);
  // Each seed exercises one way of sharing steps: one prompt at a time; one long (over 3 tokens
  // to compute) and short ones beside it; or every prompt the budget holds.
  const prefillLimits = [
    { maxNumPartialPrefills: 1, maxLongPartialPrefills: 1, longPrefillTokenThreshold: 0 },
    { maxNumPartialPrefills: 6, maxLongPartialPrefills: 1, longPrefillTokenThreshold: 3 },
    { maxNumPartialPrefills: 6, maxLongPartialPrefills: 6, longPrefillTokenThreshold: 3 },
  ][seed % 3];
  const label = `seed ${seed}, ${JSON.stringify(prefillLimits)}`;
  const random = createRng(seed);
  const runner = new OperatingRunner(random, NUM_BLOCKS, groups);
  const engine = createEngine(runner, {
    servedName: 'fake',
    maxNumSeqs: 6,
    maxNumBatchedTokens: 12,
    prefillLimits,
    generationDefaults: { eosTokenIds: [EOS] },
    enablePrefixCaching: true,
  });
  t.after(() => engine.close());
  const kv = kvOf(engine);
  const prefixes = [distinctPrompt('p0', 8), distinctPrompt('p1', 16), distinctPrompt('p2', 5)];

  /** The block table each request holding blocks was last scheduled with (copied: the entries borrow the scheduler's arrays). */
  const held = new Map<string, number[]>();
  const preempted = new Set<string>();
  /** Requests in flight, and whether each has produced a token. */
  const inFlight = new Map<string, { numOutputTokens: number; promptLength: number }>();
  const finishes = { length: 0, stop: 0, abort: 0, error: 0 };
  const aborts: Record<AbortPoint, number> = { waiting: 0, prefill: 0, decode: 0, preempted: 0 };
  const errors: string[] = [];
  let numOperations = 0;
  let numAdded = 0;
  let allFinished: () => void = () => {};
  const finished = new Promise<void>((resolve) => (allFinished = resolve));

  const onOutput = (output: RequestOutput) => {
    const state = inFlight.get(output.requestId)!;
    state.numOutputTokens = output.numOutputTokens;
    if (output.finishReason === null) return;
    finishes[output.finishReason]++;
    if (output.finishReason === 'error') errors.push(`${output.requestId}: ${output.error?.code} ${output.error?.message}`);
    if (output.finishReason !== 'abort') numOperations++;
    inFlight.delete(output.requestId);
    held.delete(output.requestId);
    preempted.delete(output.requestId);
    if (inFlight.size > 0) return;
    // An idle engine runs no step, so no step would add the next request.
    if (numOperations < NUM_OPERATIONS) add();
    else allFinished();
  };

  function add(): void {
    const requestId = `r${numAdded++}`;
    const promptTokenIds = [...prefixes[randomInt(random, 0, prefixes.length - 1)], ...distinctPrompt(requestId, randomInt(random, 1, 20))];
    const request: GenerateRequest = {
      requestId,
      promptTokenIds,
      sampling: {
        maxTokens: randomInt(random, 1, Math.min(24, MAX_MODEL_LEN - promptTokenIds.length)),
        ...(random() < 0.3 ? { stopTokenIds: [STOP_TOKEN] } : {}),
      },
      ...(random() < 0.1 ? { cacheSalt: 'tenant' } : {}),
    };
    inFlight.set(requestId, { numOutputTokens: 0, promptLength: promptTokenIds.length });
    numOperations++;
    engine.generate(request, onOutput);
  }

  const pointOf = (requestId: string): AbortPoint => {
    if (preempted.has(requestId)) return 'preempted';
    if (!held.has(requestId)) return 'waiting';
    return inFlight.get(requestId)!.numOutputTokens === 0 ? 'prefill' : 'decode';
  };

  /** Aborts a random request at a random one of the points where some request is now. */
  const abort = () => {
    const byPoint = new Map<AbortPoint, string[]>();
    for (const requestId of inFlight.keys()) {
      const point = pointOf(requestId);
      byPoint.set(point, [...(byPoint.get(point) ?? []), requestId]);
    }
    const points = [...byPoint.keys()];
    const point = points[randomInt(random, 0, points.length - 1)];
    const candidates = byPoint.get(point)!;
    aborts[point]++;
    numOperations++;
    engine.abort(candidates[randomInt(random, 0, candidates.length - 1)]);
  };

  const checkPool = (output: SchedulerOutput) => {
    for (const requestId of output.preemptedRequestIds) {
      held.delete(requestId);
      preempted.add(requestId);
    }
    for (const entry of output.scheduled) {
      held.set(entry.requestId, entry.blockTables.flat().filter((blockId) => blockId >= 0));
      preempted.delete(entry.requestId);
    }
    const holders = new Int32Array(NUM_BLOCKS);
    for (const [requestId, blockIds] of held) {
      assert.equal(new Set(blockIds).size, blockIds.length, `${label}: ${requestId}'s table lists a block twice`);
      for (const blockId of blockIds) holders[blockId]++;
    }
    let numHeld = 0;
    for (let blockId = 0; blockId < NUM_BLOCKS; blockId++) {
      assert.equal(kv.refCountOf(blockId), holders[blockId], `${label}, operation ${numOperations}: block ${blockId}'s reference count`);
      if (holders[blockId] > 0) numHeld++;
    }
    assert.equal(kv.numFreeBlocks + numHeld, NUM_BLOCKS, `${label}, operation ${numOperations}: free + held = total`);
    assert.ok(kv.numCachedBlocks <= NUM_BLOCKS, `${label}: more cached blocks than blocks`);
  };

  /** The first broken invariant: thrown inside a step, it fails that step, so it is kept to be reported first. */
  let violation: Error | null = null;
  runner.onStep = (output) => {
    try {
      checkPool(output);
    } catch (err) {
      violation ??= err as Error;
      throw err;
    }
    if (numOperations >= NUM_OPERATIONS) return;
    // Up to 10 requests in flight against 6 running at most and 24 blocks: a queue, chunked
    // prefills and preemptions all the time.
    if (inFlight.size < 10 && random() < 0.6) add();
    if (inFlight.size > 0 && random() < 0.25 && numOperations < NUM_OPERATIONS) abort();
  };

  add();
  await within(finished, `${label}: every request finishing`);
  // One more round lets the engine apply what the last step posted, then it idles.
  await new Promise((resolve) => setImmediate(resolve));

  t.diagnostic(`${numAdded} requests; finishes ${JSON.stringify(finishes)}; aborts ${JSON.stringify(aborts)}; ${runner.steps.length} steps`);
  if (violation !== null) throw violation;
  assert.deepEqual(errors, [], `${label}: no request ends in an error`);
  assert.ok(finishes.length > 0 && finishes.stop > 0, `${label}: requests finish by length and by stop`);
  for (const point of Object.keys(aborts) as AbortPoint[]) assert.ok(aborts[point] > 0, `${label}: some request aborted while ${point}`);
  const load = engine.health().load;
  assert.equal(load.numRunning + load.numWaiting, 0, `${label}: no request left`);
  assert.equal(load.numFreeBlocks, NUM_BLOCKS, `${label}: every block free at the end (0 leaked)`);
  for (let blockId = 0; blockId < NUM_BLOCKS; blockId++) assert.equal(kv.refCountOf(blockId), 0, `${label}: block ${blockId} unreferenced`);
});
