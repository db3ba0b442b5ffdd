// Routing decisions from synthetic KV events and loads: prefix hits against load, busy workers,
// sessions, the baseline policies, lost workers, retries and the index's drift.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ModelRouter, type RouterObserver } from '../model-router.ts';
import { pino } from 'pino';
import { DEFAULT_ROUTER_SETTINGS, type RouterSettings } from '../settings.ts';
import { BLOCK_SIZE, MODEL, SyntheticWorker, hashesOf, prompt } from './synthetic-worker.ts';
import { createRng } from '../../loadtest/random.ts';

function setup(numWorkers: number, settings: Partial<RouterSettings> = {}) {
  const router = new ModelRouter<SyntheticWorker>({
    modelName: MODEL,
    blockSizeTokens: BLOCK_SIZE,
    settings: { ...DEFAULT_ROUTER_SETTINGS, ...settings },
    random: createRng(7), // seeded: tie-breaks replay
  });
  const workers = Array.from({ length: numWorkers }, (_, i) => new SyntheticWorker(`w${i}`));
  for (const worker of workers) router.addWorker(worker, worker.modelInfo());
  return { router, workers };
}

function routeTo(router: ModelRouter<SyntheticWorker>, promptTokenIds: number[], extra: { affinityKey?: string; cacheSalt?: string } = {}) {
  const routed = router.route({ promptTokenIds, ...extra });
  assert.ok(routed, 'a worker was chosen');
  return routed;
}

test('kv-aware sends a prompt to the worker holding its longest prefix, and predicts the hit', () => {
  const { router, workers } = setup(4);
  const history = prompt(64);
  workers[1].stores(history, 4);
  workers[2].stores(history, 12);
  workers[3].stores(prompt(64, 1), 15);
  const routed = routeTo(router, history);
  assert.equal(routed.worker.address, 'w2');
  assert.equal(routed.numPredictedCachedTokens, 12 * BLOCK_SIZE);
});

test('the last token is never predicted cached: a prompt of whole blocks hits all but its last block', () => {
  const { router, workers } = setup(2);
  const tokens = prompt(8 * BLOCK_SIZE);
  workers[0].stores(tokens, 8);
  const whole = routeTo(router, tokens);
  assert.equal(whole.numPredictedCachedTokens, 7 * BLOCK_SIZE);
  whole.finished();
  // One more token and every full block counts.
  assert.equal(routeTo(router, [...tokens, 5]).numPredictedCachedTokens, 8 * BLOCK_SIZE);
});

test('cold prompts go to the least loaded worker; equal loads spread by chance, not to the first', () => {
  const { router, workers } = setup(3);
  workers[0].report([], { numRunning: 4, numQueuedPrefillTokens: 100 });
  workers[1].report([], { numRunning: 1 });
  workers[2].report([], { numRunning: 3 });
  const routed = routeTo(router, prompt(20, 5));
  assert.equal(routed.worker.address, 'w1');
  routed.finished();

  const idle = setup(4);
  const counts = new Map<string, number>();
  for (let i = 0; i < 200; i++) {
    const each = routeTo(idle.router, prompt(20, 100 + i));
    counts.set(each.worker.address, (counts.get(each.worker.address) ?? 0) + 1);
    each.finished();
  }
  assert.equal(counts.size, 4, `every idle worker gets cold prompts: ${[...counts]}`);
  for (const count of counts.values()) assert.ok(count > 20, `spread: ${[...counts]}`);
});

test('a cache hit is worth twice its prefill tokens in queued load (the default weight 0.5), and no more', () => {
  const { router, workers } = setup(2);
  const tokens = prompt(41);
  workers[0].stores(tokens, 10, { numQueuedPrefillTokens: 70 });
  // Saving 40 tokens beats 0.5 × 70 queued: the hit wins.
  assert.equal(routeTo(router, tokens).worker.address, 'w0');
  const { router: other, workers: otherWorkers } = setup(2);
  otherWorkers[0].stores(tokens, 10, { numQueuedPrefillTokens: 90 });
  assert.equal(routeTo(other, tokens).worker.address, 'w1');
});

test('requests routed since the last report count: a burst of cold prompts spreads over the workers', () => {
  const { router } = setup(4);
  const counts = new Map<string, number>();
  for (let i = 0; i < 8; i++) {
    const routed = routeTo(router, prompt(100, i));
    counts.set(routed.worker.address, (counts.get(routed.worker.address) ?? 0) + 1);
  }
  assert.deepEqual([...counts.values()], [2, 2, 2, 2]);
});

test('a burst sharing one prefix stays on its holder only while the saved prefill outweighs the queue there', () => {
  const { router, workers } = setup(2, { requestLoadTokens: 0, busyLoadFactor: 100 });
  const system = prompt(80);
  workers[0].stores(system, 20);
  const addresses = [];
  for (let i = 0; i < 8; i++) addresses.push(routeTo(router, [...system, ...prompt(20, i + 1)]).worker.address);
  // Each request queues its 20 uncached tokens on w0 (0.5 × 20 more cost for the next), against
  // 100 to compute on w1: w0 takes eight; the ninth costs 100 on either, and the tie goes to the
  // lighter load.
  assert.deepEqual(addresses, Array(8).fill('w0'));
  assert.equal(routeTo(router, [...system, ...prompt(20, 9)]).worker.address, 'w1');
});

test('a prompt routed and not yet computed counts as cached on its worker: a burst on a new prefix stays together', () => {
  // Load left out: the first request's own queued prefill outweighs a 5-block hit behind it.
  const { router } = setup(4, { loadWeight: 0 });
  const system = prompt(5 * BLOCK_SIZE);
  const first = routeTo(router, [...system, ...prompt(20, 1)]);
  assert.equal(first.numPredictedCachedTokens, 0);
  // No KV event names the system prompt yet: without the prompt in flight each would look cold and go elsewhere.
  const followers = [2, 3, 4].map((seed) => routeTo(router, [...system, ...prompt(20, seed)]));
  for (const follower of followers) {
    assert.equal(follower.worker.address, first.worker.address);
    assert.equal(follower.numPredictedCachedTokens, system.length);
  }
  // Only whole blocks count, and only as far as the prompts agree.
  const partial = routeTo(router, [...system.slice(0, 2 * BLOCK_SIZE + 3), ...prompt(40, 9)]);
  assert.equal(partial.numPredictedCachedTokens, 2 * BLOCK_SIZE);
  partial.finished();
  // Another tenant's salt never matches.
  const salted = routeTo(router, [...system, ...prompt(20, 5)], { cacheSalt: 'tenant-b' });
  assert.equal(salted.numPredictedCachedTokens, 0);
  salted.finished();
  // Started (its blocks now come by KV events) or failed: it counts no more.
  first.started(0);
  for (const follower of followers) follower.finished();
  assert.equal(routeTo(router, [...system, ...prompt(20, 6)]).numPredictedCachedTokens, 0);
});

test('a busy worker is skipped even on a hit: too many requests, or a nearly full KV cache', () => {
  const { router, workers } = setup(3);
  const tokens = prompt(200);
  workers[0].stores(tokens, 49, { numRunning: 20 });
  workers[1].report([], { numRunning: 2 });
  workers[2].report([], { numRunning: 2 });
  // The mean is 8, the threshold 2 x 9 = 18: w0 is over it despite a 196-token hit.
  const routed = routeTo(router, tokens);
  assert.notEqual(routed.worker.address, 'w0');
  assert.equal(routed.numPredictedCachedTokens, 0);

  const full = setup(2);
  full.workers[0].stores(tokens, 49, { numFreeBlocks: 20, numTotalBlocks: 1000 });
  assert.equal(routeTo(full.router, tokens).worker.address, 'w1');
  // When every worker is busy, the best of them is taken.
  full.workers[1].report([], { numFreeBlocks: 10, numTotalBlocks: 1000 });
  assert.equal(routeTo(full.router, tokens).worker.address, 'w0');
});

test('a session sticks to the worker of its last turn before its events arrive, unless that worker is busy', () => {
  const { router, workers } = setup(4);
  const first = routeTo(router, prompt(40, 1), { affinityKey: 'conversation-1' });
  const home = first.worker.address;
  // No events yet: the index knows nothing of the first turn, the session still finds its worker.
  first.finished();
  for (let turn = 0; turn < 5; turn++) {
    const next = routeTo(router, prompt(60 + turn, 1), { affinityKey: 'conversation-1' });
    assert.equal(next.worker.address, home);
    next.finished();
  }
  const homeWorker = workers.find((worker) => worker.address === home)!;
  homeWorker.report([], { numRunning: 40 });
  assert.notEqual(routeTo(router, prompt(80, 1), { affinityKey: 'conversation-1' }).worker.address, home);
});

test('a cache salt keeps a tenant off another tenant\'s blocks', () => {
  const { router, workers } = setup(2);
  const tokens = prompt(40);
  workers[0].report([{ kind: 'stored', blockHashes: hashesOf(tokens, 9, 'tenant-a') }]);
  workers[1].report([{ kind: 'stored', blockHashes: hashesOf(tokens, 9) }]);
  assert.equal(routeTo(router, tokens, { cacheSalt: 'tenant-a' }).worker.address, 'w0');
  assert.equal(routeTo(router, tokens).worker.address, 'w1');
  assert.equal(routeTo(router, tokens, { cacheSalt: 'tenant-b' }).numPredictedCachedTokens, 0);
});

test('past 64 workers, a long prompt finds each worker\'s prefix; a reused slot starts empty', () => {
  const { router, workers } = setup(100);
  // 120 blocks: the router hashes and walks them in several runs.
  const tokens = prompt(120 * BLOCK_SIZE + 1);
  for (const [i, worker] of workers.entries()) worker.stores(tokens, i + 20 * (i % 2));
  // w99 holds 119 blocks (odd: 99 + 20), w98 98, w97 117.
  let routed = routeTo(router, tokens);
  assert.equal(routed.worker.address, 'w99');
  assert.equal(routed.numPredictedCachedTokens, 119 * BLOCK_SIZE);
  routed.finished();
  router.removeWorker('w99');
  const newcomer = new SyntheticWorker('w100');
  router.addWorker(newcomer, newcomer.modelInfo());
  routed = routeTo(router, tokens);
  assert.equal(routed.worker.address, 'w97');
  assert.equal(routed.numPredictedCachedTokens, 117 * BLOCK_SIZE);
  routed.finished();
  newcomer.stores(tokens, 120);
  routed = routeTo(router, tokens);
  assert.equal(routed.worker.address, 'w100');
  assert.equal(routed.numPredictedCachedTokens, 120 * BLOCK_SIZE);
});

test('a request that computes its whole prompt is routed by load alone', () => {
  const { router, workers } = setup(2);
  const tokens = prompt(40);
  workers[0].stores(tokens, 9, { numRunning: 1 });
  const routed = router.route({ promptTokenIds: tokens, usesPrefixCache: false })!;
  assert.equal(routed.worker.address, 'w1');
  assert.equal(routed.numPredictedCachedTokens, 0);
});

test('round-robin cycles, random reaches every worker, least-load takes the lightest', () => {
  const roundRobin = setup(3, { policy: 'round-robin' });
  const cycle = Array.from({ length: 6 }, () => routeTo(roundRobin.router, prompt(10)).worker.address);
  assert.deepEqual(cycle, ['w0', 'w1', 'w2', 'w0', 'w1', 'w2']);
  assert.equal(routeTo(roundRobin.router, prompt(10)).numPredictedCachedTokens, null);

  const random = setup(3, { policy: 'random' });
  const seen = new Set(Array.from({ length: 60 }, () => routeTo(random.router, prompt(10)).worker.address));
  assert.equal(seen.size, 3);

  const leastLoad = setup(3, { policy: 'least-load' });
  leastLoad.workers[0].stores(prompt(40), 9, { numRunning: 2 });
  leastLoad.workers[1].report([], { numRunning: 1 });
  leastLoad.workers[2].report([], { numRunning: 3 });
  assert.equal(routeTo(leastLoad.router, prompt(40)).worker.address, 'w1');
});

test('a worker whose stream is down is skipped and its blocks leave the index; with none up, any is tried', () => {
  const { router, workers } = setup(2);
  const tokens = prompt(40);
  workers[0].stores(tokens, 9);
  workers[0].load = null;
  assert.equal(routeTo(router, tokens).worker.address, 'w1');
  assert.deepEqual(router.indexStats().map((stats) => stats.numBlocks), [0, 0]);
  workers[1].load = null;
  assert.ok(router.route({ promptTokenIds: tokens }), 'a worker whose stream reopens on demand is better than none');
  // Its next stream lists its cache anew.
  workers[0].report([{ kind: 'cleared' }, { kind: 'stored', blockHashes: hashesOf(tokens, 9) }]);
  assert.equal(routeTo(router, tokens).worker.address, 'w0');
});

test('retry routes a request that failed before it started to a worker it has not failed on', () => {
  const { router, workers } = setup(3);
  const tokens = prompt(40);
  workers[0].stores(tokens, 9);
  const retried: string[] = [];
  router.observer = { ...nullObserver, retried: (_model, address) => retried.push(address) };
  const first = routeTo(router, tokens);
  assert.equal(first.worker.address, 'w0');
  const second = first.retry()!;
  assert.notEqual(second.worker.address, 'w0');
  const third = second.retry()!;
  assert.deepEqual(new Set([first, second, third].map((routed) => routed.worker.address)), new Set(['w0', 'w1', 'w2']));
  assert.equal(third.retry(), null);
  assert.deepEqual(retried, ['w0', second.worker.address, third.worker.address]);
});

test('a removed worker leaves the index, its sessions and the routing at once', () => {
  const { router, workers } = setup(2);
  const tokens = prompt(40);
  workers[0].stores(tokens, 9);
  routeTo(router, tokens, { affinityKey: 's' }).finished();
  assert.equal(router.removeWorker('w0'), workers[0]);
  assert.equal(router.numIndexedBlocks, 0);
  assert.deepEqual(router.workers.map((worker) => worker.address), ['w1']);
  assert.equal(routeTo(router, tokens, { affinityKey: 's' }).worker.address, 'w1');
  // Its events no longer reach the index; a new worker reuses its slot from empty.
  workers[0].stores(tokens, 9);
  assert.equal(router.numIndexedBlocks, 0);
  const replacement = new SyntheticWorker('w2');
  router.addWorker(replacement, replacement.modelInfo());
  assert.deepEqual(router.indexStats().map((stats) => stats.numBlocks), [0, 0]);
});

test('finished requests give their load back; started ones keep only their decode', () => {
  const { router } = setup(2, { requestLoadTokens: 10 });
  const a = routeTo(router, prompt(100, 1));
  const b = routeTo(router, prompt(100, 2));
  assert.notEqual(a.worker, b.worker);
  // a started (its prefill is done): 10 load against b's 100 + 10.
  a.started(0);
  assert.equal(routeTo(router, prompt(100, 3)).worker, a.worker);
  b.finished();
  b.finished();
  assert.equal(routeTo(router, prompt(100, 4)).worker, b.worker);
});

test('the drift is the index\'s block count against the worker\'s own', () => {
  const { router, workers } = setup(1);
  assert.deepEqual(router.indexStats(), [{ address: 'w0', numBlocks: 0, numDriftBlocks: null }]);
  workers[0].stores(prompt(40), 9);
  assert.deepEqual(router.indexStats(), [{ address: 'w0', numBlocks: 9, numDriftBlocks: 0 }]);
  // A report whose events the index never saw (a lost message): the worker holds 12, the index 9.
  workers[0].report([], { numCachedBlocks: 12 });
  assert.equal(router.indexStats()[0].numDriftBlocks, -3);
});

test('a worker fed by a shared feed ignores its engine stream\'s events until the feed stops', () => {
  const { router, workers } = setup(2);
  const lags: number[] = [];
  router.observer = { ...nullObserver, kvEventLag: (_model, seconds) => lags.push(seconds) };
  const tokens = prompt(40);
  router.setFedExternally('w0', true);
  workers[0].stores(tokens, 9);
  assert.equal(router.numIndexedBlocks, 0, 'the stream\'s events are ignored');
  router.applyExternalEvents('w0', [{ kind: 'stored', blockHashes: hashesOf(tokens, 5) }], 5, Date.now() - 250);
  assert.deepEqual(router.indexStats()[0], { address: 'w0', numBlocks: 5, numDriftBlocks: 0 });
  assert.ok(lags[0] >= 0.25 && lags[0] < 5);
  router.setFedExternally('w0', false);
  router.applyExternalEvents('w0', [{ kind: 'cleared' }], 0, Date.now());
  assert.equal(router.numIndexedBlocks, 5, 'the feed no longer applies');
  workers[0].report([{ kind: 'stored', blockHashes: hashesOf(tokens, 9) }]);
  assert.equal(router.numIndexedBlocks, 9);
});

test('a worker that hashes differently is routed by load only', async () => {
  const lines: string[] = [];
  const log = pino({ level: 'warn' }, { write: (line: string) => lines.push(line) });
  const router = new ModelRouter<SyntheticWorker>({ modelName: MODEL, blockSizeTokens: null, settings: DEFAULT_ROUTER_SETTINGS, log });
  const good = new SyntheticWorker('good');
  const stranger = new SyntheticWorker('stranger', { blockHashScheme: 'another-hash-v9' });
  router.addWorker(good);
  await new Promise((resolve) => setImmediate(resolve));
  router.addWorker(stranger);
  await new Promise((resolve) => setImmediate(resolve));
  // One warning in the router's log, naming the worker.
  const warnings = lines.map((line) => JSON.parse(line));
  assert.equal(warnings.length, 1);
  assert.equal(warnings[0].worker, 'stranger');
  assert.match(warnings[0].msg, /stranger hashes blocks by another-hash-v9/);
  const tokens = prompt(40);
  stranger.stores(tokens, 9);
  good.report([], { numRunning: 1 });
  // The block size came from the first worker's health; the stranger's blocks never count.
  const routed = router.route({ promptTokenIds: tokens })!;
  assert.equal(routed.worker.address, 'stranger');
  assert.equal(routed.numPredictedCachedTokens, 0);
  good.stores(tokens, 9, { numRunning: 1 });
  assert.equal(router.route({ promptTokenIds: tokens })!.worker.address, 'good');
});

test('watchers see every worker, now and later, and their cleanup runs when it leaves', () => {
  const { router } = setup(2);
  const seen: string[] = [];
  const gone: string[] = [];
  router.watchWorkers((worker) => {
    seen.push(worker.address);
    return () => gone.push(worker.address);
  });
  const late = new SyntheticWorker('late');
  router.addWorker(late, late.modelInfo());
  router.removeWorker('w1');
  assert.deepEqual(seen, ['w0', 'w1', 'late']);
  assert.deepEqual(gone, ['w1']);
});

const nullObserver: RouterObserver = { routed() {}, started() {}, retried() {}, kvEventLag() {} };
