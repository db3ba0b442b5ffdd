// A worker's registration and KV stream in a real redis-server: the heartbeat that expires, a
// stream that always opens with a snapshot of the cache, compaction, leaving, and Redis
// restarting empty.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Redis } from 'ioredis';
import { decodeKvEvents, KV_ENTRY, kvStreamKey, parseRegistration, workerKey, WORKERS_KEY } from '../shared-state.ts';
import { startDroppingProxy } from '../../test/dropping-proxy.ts';
import { startRedisServer } from '../../test/redis-server.ts';
import { createEngine, type Engine } from '../engine.ts';
import { RedisPublisher, type PublisherSettings, type ReportSource } from '../redis-publisher.ts';
import type { BlockHash } from '../kv/block-hash.ts';
import type { GenerateRequest, KvEvent, StepReport } from '../types.ts';
import { FakeRunner } from './fake-runner.ts';

function setup() {
  const runner = new FakeRunner({ numKvBlocks: 16, blockSizeTokens: 4, vocabSize: 500, maxModelLen: 64 });
  return createEngine(runner, { servedName: 'fake', maxNumSeqs: 4, maxNumBatchedTokens: 16, generationDefaults: { eosTokenIds: [2] } });
}

function generate(engine: Engine, requestId: string, promptTokenIds: number[]): Promise<void> {
  const request: GenerateRequest = { requestId, promptTokenIds, sampling: { maxTokens: 2, seed: 1n } };
  return new Promise((resolve) => engine.generate(request, (output) => output.finishReason !== null && resolve()));
}

/** The engine's own view of its cache: the snapshot a new listener gets (after any report in flight). */
function cacheOf(engine: Engine): Promise<Set<BlockHash>> {
  return new Promise((resolve) => {
    const stop = engine.onReport((report) => {
      if (report.events[0]?.kind !== 'cleared') return;
      stop();
      resolve(replay([report.events]));
    });
  });
}

function replay(eventLists: KvEvent[][]): Set<BlockHash> {
  const cache = new Set<BlockHash>();
  for (const events of eventLists) {
    for (const event of events) {
      if (event.kind === 'cleared') cache.clear();
      else for (const hash of event.blockHashes) event.kind === 'stored' ? cache.add(hash) : cache.delete(hash);
    }
  }
  return cache;
}

async function streamOf(redis: Redis, workerId: string): Promise<{ events: KvEvent[]; numCachedBlocks: number }[]> {
  const entries = await redis.xrange(kvStreamKey(workerId), '-', '+');
  return entries.map(([, fields]) => {
    const values = new Map<string, string>();
    for (let i = 0; i < fields.length; i += 2) values.set(fields[i], fields[i + 1]);
    return { events: decodeKvEvents(values.get(KV_ENTRY.events)!), numCachedBlocks: Number(values.get(KV_ENTRY.numCachedBlocks)) };
  });
}

async function until(condition: () => Promise<boolean>, what: string, timeoutMs = 5_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

function settingsFor(redisUrl: string, engine: Engine, overrides: Partial<PublisherSettings> = {}): PublisherSettings {
  return {
    redisUrl, address: '10.0.0.5:7000', model: engine.model, numKvBlocks: 16, maxNumSeqs: 4,
    heartbeatIntervalMs: 100, heartbeatTtlMs: 400, ...overrides,
  };
}

test('a worker registers with an expiring heartbeat, and its stream opens with its cache and follows it', { timeout: 30_000 }, async (t) => {
  const server = await startRedisServer();
  t.after(() => server.close());
  const redis = new Redis(server.url, { protocol: 2 });
  t.after(() => redis.disconnect());
  const engine = setup();
  t.after(() => engine.close());
  await generate(engine, 'before', [1, 2, 3, 4, 5, 6, 7, 8, 9]);
  const publisher = new RedisPublisher(engine, settingsFor(server.url, engine));
  t.after(() => publisher.close());
  const { workerId } = publisher;

  await until(async () => (await redis.sismember(WORKERS_KEY, workerId)) === 1, 'registered');
  const registration = parseRegistration((await redis.get(workerKey(workerId)))!);
  assert.deepEqual(registration, { ...publisher.registration });
  assert.equal(registration.model.blockHashScheme, engine.model.blockHashScheme);
  const ttlMs = await redis.pttl(workerKey(workerId));
  assert.ok(ttlMs > 0 && ttlMs <= 400, `the registration expires: ${ttlMs} ms left`);

  await until(async () => (await streamOf(redis, workerId)).length > 0, 'the snapshot is published');
  const [snapshot] = await streamOf(redis, workerId);
  const cachedBefore = await cacheOf(engine);
  assert.equal(snapshot.events[0].kind, 'cleared');
  assert.ok(cachedBefore.size > 0);
  assert.deepEqual(replay([snapshot.events]), cachedBefore);
  assert.equal(snapshot.numCachedBlocks, cachedBefore.size);

  // Enough new prompts that blocks are evicted (16 blocks): stored and removed both reach the stream.
  for (let i = 0; i < 6; i++) await generate(engine, `after-${i}`, Array.from({ length: 13 }, (_, j) => 20 * i + j + 10));
  const cachedAfter = await cacheOf(engine);
  await until(async () => {
    const entries = await streamOf(redis, workerId);
    return entries.at(-1)!.numCachedBlocks === cachedAfter.size && replay(entries.map((e) => e.events)).size === cachedAfter.size;
  }, 'the stream caught up');
  const entries = await streamOf(redis, workerId);
  assert.deepEqual(replay(entries.map((entry) => entry.events)), cachedAfter);
  assert.ok(entries.some((entry) => entry.events.some((event) => event.kind === 'removed')));
});

test('deltas that outgrow the cache start a new snapshot, and the stream is trimmed before it', { timeout: 30_000 }, async (t) => {
  const server = await startRedisServer();
  t.after(() => server.close());
  const redis = new Redis(server.url, { protocol: 2 });
  t.after(() => redis.disconnect());
  const engine = setup();
  t.after(() => engine.close());
  const publisher = new RedisPublisher(engine, settingsFor(server.url, engine, { minHashesBetweenSnapshots: 8 }));
  t.after(() => publisher.close());
  await until(async () => (await streamOf(redis, publisher.workerId)).length > 0, 'the first snapshot');
  for (let i = 0; i < 12; i++) await generate(engine, `r${i}`, Array.from({ length: 13 }, (_, j) => 20 * i + j + 10));
  const cache = await cacheOf(engine);
  await until(async () => {
    const entries = await streamOf(redis, publisher.workerId);
    // The first snapshot (of the empty cache) also opens with 'cleared' and replays to the whole
    // cache: only a snapshot holding blocks is the compaction waited for.
    return entries.length > 0 && entries[0].events[0]?.kind === 'cleared'
      && entries[0].events.some((event) => event.kind === 'stored' && event.blockHashes.length > 0)
      && replay(entries.map((e) => e.events)).size === cache.size;
  }, 'a compacted stream');
  const entries = await streamOf(redis, publisher.workerId);
  assert.equal(entries[0].events[0].kind, 'cleared', 'the stream opens with a snapshot');
  // Not the first snapshot, of an empty cache: a later one, taken when the deltas outgrew it.
  assert.ok(entries[0].events.some((event) => event.kind === 'stored' && event.blockHashes.length > 0), 'a snapshot of a filled cache');
  // What follows it stays within the publisher's bound (8 + twice the cache, and the steps in
  // flight when it resubscribed), however the steps batched their events into entries.
  const numDeltaHashes = entries
    .slice(1)
    .flatMap((entry) => entry.events)
    .reduce((sum, event) => sum + (event.kind === 'cleared' ? 0 : event.blockHashes.length), 0);
  assert.ok(numDeltaHashes <= 8 + 2 * cache.size + 16, `${numDeltaHashes} hashes after the snapshot, cache ${cache.size}`);
  assert.deepEqual(replay(entries.map((entry) => entry.events)), cache);
});

test('close leaves the registry and deletes the stream; Redis restarting empty gets a new registration and snapshot', { timeout: 30_000 }, async (t) => {
  const server = await startRedisServer();
  t.after(() => server.close());
  const redis = new Redis(server.url, { protocol: 2, retryStrategy: () => 50 });
  redis.on('error', () => {});
  t.after(() => redis.disconnect());
  const engine = setup();
  t.after(() => engine.close());
  await generate(engine, 'a', [1, 2, 3, 4, 5, 6, 7, 8, 9]);
  const publisher = new RedisPublisher(engine, settingsFor(server.url, engine));
  const { workerId } = publisher;
  await until(async () => (await streamOf(redis, workerId)).length > 0, 'published');

  await server.stop();
  // Steps while Redis is away: their events are lost to the stream, not to the next snapshot.
  await generate(engine, 'b', [30, 31, 32, 33, 34, 35, 36, 37, 38]);
  await server.start();
  await until(async () => redis.status === 'ready' && (await redis.sismember(WORKERS_KEY, workerId).catch(() => 0)) === 1, 'registered again');
  const cache = await cacheOf(engine);
  await until(async () => replay((await streamOf(redis, workerId)).map((e) => e.events)).size === cache.size, 'a fresh snapshot');
  const entries = await streamOf(redis, workerId);
  assert.equal(entries[0].events[0].kind, 'cleared');
  assert.deepEqual(replay(entries.map((entry) => entry.events)), cache);

  await publisher.close();
  assert.equal(await redis.sismember(WORKERS_KEY, workerId), 0);
  assert.equal(await redis.exists(workerKey(workerId), kvStreamKey(workerId)), 0);
});

/**
 * Reports a stored block on every turn of the event loop, as an engine stepping without pause,
 * so that one lands between the moment Redis's socket stops being writable and ioredis's 'close'.
 * It stops handing out snapshots after maxSubscriptions, so that a publisher resubscribing
 * without end cannot hang the test process.
 */
class BusySource implements ReportSource {
  numSubscriptions = 0;
  private readonly listeners = new Set<(report: StepReport) => void>();
  private timer: NodeJS.Immediate | null = null;
  private nextBlock = 0;

  constructor(private readonly maxSubscriptions: number) {
    const step = () => {
      const report: StepReport = { events: [{ kind: 'stored', blockHashes: [`b${this.nextBlock++}`] }], load: { ...LOAD, numCachedBlocks: this.nextBlock }, stats: null };
      for (const listener of this.listeners) listener(report);
      this.timer = setImmediate(step);
    };
    this.timer = setImmediate(step);
  }

  onReport(listener: (report: StepReport) => void): () => void {
    this.numSubscriptions++;
    this.listeners.add(listener);
    if (this.numSubscriptions <= this.maxSubscriptions) {
      queueMicrotask(() => {
        if (this.listeners.has(listener)) listener({ events: [{ kind: 'cleared' }], load: { ...LOAD, numCachedBlocks: 0 }, stats: null });
      });
    }
    return () => this.listeners.delete(listener);
  }

  stop(): void {
    if (this.timer !== null) clearImmediate(this.timer);
    this.timer = null;
  }
}

const LOAD = { numRunning: 1, numWaiting: 0, numFreeBlocks: 8, numTotalBlocks: 16, numQueuedPrefillTokens: 0, numCachedBlocks: 0 };

test('Redis dropping the connection while the engine reports does not spin the worker; it publishes again once Redis answers', { timeout: 30_000 }, async (t) => {
  const server = await startRedisServer();
  t.after(() => server.close());
  const proxy = await startDroppingProxy(server.port);
  t.after(() => proxy.close());
  const source = new BusySource(1_000);
  t.after(() => source.stop());
  const engine = setup();
  t.after(() => engine.close());
  const publisher = new RedisPublisher(source, settingsFor(proxy.url, engine));
  t.after(() => publisher.close());
  const redis = new Redis(server.url, { protocol: 2 });
  t.after(() => redis.disconnect());
  await until(async () => (await redis.xlen(kvStreamKey(publisher.workerId))) > 10, 'publishing');
  const numBefore = source.numSubscriptions;
  proxy.drop();
  await until(async () => (await redis.xrange(kvStreamKey(publisher.workerId), '-', '+')).some(([, fields]) => fields[1] === 'c' && source.numSubscriptions > numBefore), 'a new snapshot');
  assert.ok(source.numSubscriptions - numBefore <= 2, `${source.numSubscriptions - numBefore} subscriptions after one drop`);
});
