// The gateway's side of the shared state in a real redis-server, against a real engine whose KV
// events a real publisher writes: discovery, the index built (and rebuilt) from the streams,
// heartbeats that expire, and Redis going away and coming back.
import { test, type TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { Redis } from 'ioredis';
import { createEngine, type Engine } from '../../engine/engine.ts';
import { extendBlockHashes, rootHash } from '../../engine/kv/block-hash.ts';
import { RedisPublisher } from '../../engine/redis-publisher.ts';
import { FakeRunner } from '../../engine/test/fake-runner.ts';
import type { GenerateRequest } from '../../engine/types.ts';
import { kvStreamKey, workerKey, WORKERS_KEY, type WorkerRegistration } from '../../proto/redis-state.ts';
import { startDroppingProxy } from '../../test/dropping-proxy.ts';
import { startRedisServer } from '../../test/redis-server.ts';
import { ModelRouter } from '../model-router.ts';
import { RedisSharedState } from '../redis-state.ts';
import { DEFAULT_ROUTER_SETTINGS } from '../settings.ts';
import { SyntheticWorker } from './synthetic-worker.ts';

const BLOCK_SIZE = 4;
const HEARTBEAT_INTERVAL_MS = 100;
const HEARTBEAT_TTL_MS = 400;

/** The gateway's client of a discovered worker: no engine behind it, only what a test reports. */
class TestClient extends SyntheticWorker {
  numInFlight = 0;
  numCloses = 0;
  close(): void {
    this.numCloses++;
  }
}

function startEngine(): Engine {
  const runner = new FakeRunner({ numKvBlocks: 64, blockSizeTokens: BLOCK_SIZE, vocabSize: 500, maxModelLen: 64 });
  return createEngine(runner, { servedName: 'fake', maxNumSeqs: 4, maxNumBatchedTokens: 16, generationDefaults: { eosTokenIds: [2] } });
}

function generate(engine: Engine, requestId: string, promptTokenIds: number[]): Promise<void> {
  const request: GenerateRequest = { requestId, promptTokenIds, sampling: { maxTokens: 2, seed: 1n } };
  return new Promise((resolve) => engine.generate(request, (output) => output.finishReason !== null && resolve()));
}

/** The number of blocks the engine caches: its snapshot to a new listener. */
function numCachedBlocksOf(engine: Engine): Promise<number> {
  return new Promise((resolve) => {
    const stop = engine.onReport((report) => {
      if (report.events[0]?.kind !== 'cleared') return;
      stop();
      resolve(report.load.numCachedBlocks);
    });
  });
}

function startGateway(redisUrl: string) {
  const router = new ModelRouter<TestClient>({ modelName: 'fake', blockSizeTokens: BLOCK_SIZE, settings: DEFAULT_ROUTER_SETTINGS });
  const clients: TestClient[] = [];
  const shared = new RedisSharedState<TestClient>({
    redisUrl,
    routers: new Map([['fake', router]]),
    connect: (registration) => {
      const client = new TestClient(registration.address, registration.model);
      clients.push(client);
      return client;
    },
    heartbeatIntervalMs: HEARTBEAT_INTERVAL_MS,
    heartbeatTtlMs: HEARTBEAT_TTL_MS,
  });
  return { router, clients, shared };
}

function startPublisher(redisUrl: string, engine: Engine, address: string): RedisPublisher {
  return new RedisPublisher(engine, {
    redisUrl, address, model: engine.model, numKvBlocks: 64, maxNumSeqs: 4,
    heartbeatIntervalMs: HEARTBEAT_INTERVAL_MS, heartbeatTtlMs: HEARTBEAT_TTL_MS,
  });
}

async function until(condition: () => boolean | Promise<boolean>, what: string, timeoutMs = 5_000): Promise<number> {
  const startMs = Date.now();
  while (!(await condition())) {
    if (Date.now() - startMs > timeoutMs) throw new Error(`timed out waiting until ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  return Date.now() - startMs;
}

const prompt = (seed: number, numTokens: number) => Array.from({ length: numTokens }, (_, i) => seed * 50 + i + 3);

test('gateways discover a worker and build its index from its stream; one started later rebuilds it', { timeout: 30_000 }, async (t) => {
  const redis = await startRedisServer();
  t.after(() => redis.close());
  const engine = startEngine();
  t.after(() => engine.close());
  await generate(engine, 'early', prompt(1, 21));
  const publisher = startPublisher(redis.url, engine, '10.0.0.5:7000');
  t.after(() => publisher.close());

  const first = startGateway(redis.url);
  t.after(() => first.shared.close());
  await first.shared.waitForWorker('fake', 5_000);
  assert.deepEqual(first.router.workers.map((worker) => worker.address), ['10.0.0.5:7000']);
  await until(async () => first.router.numIndexedBlocks === (await numCachedBlocksOf(engine)), 'the index holds the worker\'s cache');

  for (let i = 2; i < 6; i++) await generate(engine, `later-${i}`, prompt(i, 21));
  const numCached = await numCachedBlocksOf(engine);
  await until(() => first.router.numIndexedBlocks === numCached, 'the index follows the stream');
  assert.deepEqual(first.router.indexStats(), [{ address: '10.0.0.5:7000', numBlocks: numCached, numDriftBlocks: 0 }]);
  // The engine stream's events are not the index's while Redis feeds it.
  const client = first.clients[0];
  client.report([{ kind: 'stored', blockHashes: extendBlockHashes([], rootHash({ model: 'fake' }), prompt(40, 8), BLOCK_SIZE, 2) }]);
  assert.equal(first.router.numIndexedBlocks, numCached);

  const second = startGateway(redis.url);
  t.after(() => second.shared.close());
  await until(() => second.router.numIndexedBlocks === numCached, 'a new gateway rebuilt the index from the stream');
  // Both predict what the worker holds: a prompt of 5 cached blocks and one more token.
  for (const gateway of [first, second]) {
    const routed = gateway.router.route({ promptTokenIds: prompt(3, 21) })!;
    assert.equal(routed.numPredictedCachedTokens, 5 * BLOCK_SIZE);
    routed.finished();
  }
});

test('a worker that stops heartbeating leaves routing within its TTL; its client closes once idle', { timeout: 30_000 }, async (t) => {
  const redis = await startRedisServer();
  t.after(() => redis.close());
  const admin = new Redis(redis.url, { protocol: 2 });
  t.after(() => admin.disconnect());
  const gateway = startGateway(redis.url);
  t.after(() => gateway.shared.close());
  const registration: WorkerRegistration = {
    workerId: 'stopped', address: '10.0.0.6:7000', numKvBlocks: 64, maxNumSeqs: 4, startedAtMs: Date.now(),
    model: { modelName: 'fake', maxModelLen: 64, vocabSize: 500, blockSizeTokens: BLOCK_SIZE, eosTokenIds: [2], blockHashScheme: 'conduit-kv-sha256-128-v1' },
  };
  // One heartbeat, then silence (a worker that hung or lost its network).
  const heardAtMs = Date.now();
  await admin.multi().set(workerKey('stopped'), JSON.stringify(registration), 'PX', HEARTBEAT_TTL_MS).sadd(WORKERS_KEY, 'stopped').exec();
  await gateway.shared.waitForWorker('fake', 5_000);
  const client = gateway.clients[0];
  client.numInFlight = 1;
  await until(() => gateway.router.workers.length === 0, 'it left routing');
  const goneAfterMs = Date.now() - heardAtMs;
  assert.ok(goneAfterMs >= HEARTBEAT_TTL_MS - 50 && goneAfterMs < HEARTBEAT_TTL_MS + 4 * HEARTBEAT_INTERVAL_MS, `left after ${goneAfterMs} ms`);
  assert.equal(gateway.router.route({ promptTokenIds: [1, 2, 3] }), null);
  assert.equal(client.numCloses, 0, 'its request in flight finishes first');
  client.numInFlight = 0;
  await until(() => client.numCloses === 1, 'closed once idle');
  assert.equal(await admin.sismember(WORKERS_KEY, 'stopped'), 0, 'a gateway tidied the registry');
});

test('without Redis, routing goes on from the last state and the engine streams; on its return the index is rebuilt', { timeout: 30_000 }, async (t) => {
  const redis = await startRedisServer();
  t.after(() => redis.close());
  const engine = startEngine();
  t.after(() => engine.close());
  await generate(engine, 'a', prompt(1, 21));
  const publisher = startPublisher(redis.url, engine, '10.0.0.7:7000');
  t.after(() => publisher.close());
  const gateway = startGateway(redis.url);
  t.after(() => gateway.shared.close());
  await gateway.shared.waitForWorker('fake', 5_000);
  await until(async () => gateway.router.numIndexedBlocks === (await numCachedBlocksOf(engine)), 'indexed from Redis');
  const numBefore = gateway.router.numIndexedBlocks;

  await redis.stop();
  await until(() => !gateway.shared.isConnected, 'the gateway noticed');
  // Routing goes on: the worker stays, with what the index knew.
  const routed = gateway.router.route({ promptTokenIds: prompt(1, 21) })!;
  assert.equal(routed.worker.address, '10.0.0.7:7000');
  assert.equal(routed.numPredictedCachedTokens, 5 * BLOCK_SIZE);
  routed.finished();
  // Its engine stream feeds the index now (a synthetic block, which the worker does not hold).
  const client = gateway.clients[0];
  client.report([{ kind: 'stored', blockHashes: extendBlockHashes([], rootHash({ model: 'fake' }), prompt(40, 8), BLOCK_SIZE, 2) }]);
  assert.equal(gateway.router.numIndexedBlocks, numBefore + 2);
  await new Promise((resolve) => setTimeout(resolve, 2 * HEARTBEAT_TTL_MS));
  assert.equal(gateway.router.workers.length, 1, 'no heartbeat could be read: the worker stays');

  await generate(engine, 'b', prompt(2, 21));
  await redis.start();
  const numCached = await numCachedBlocksOf(engine);
  // The worker's fresh snapshot replaces the index's view: the synthetic blocks are gone, the new prompt's are in.
  await until(() => gateway.shared.isConnected && gateway.router.numIndexedBlocks === numCached, 'rebuilt from the stream', 10_000);
  assert.equal(gateway.router.workers.length, 1);
  assert.equal(gateway.router.indexStats()[0].numDriftBlocks, 0);
  const next = gateway.router.route({ promptTokenIds: prompt(2, 21) })!;
  assert.equal(next.numPredictedCachedTokens, 5 * BLOCK_SIZE);
});

function registrationOf(workerId: string, address: string): WorkerRegistration {
  return {
    workerId, address, numKvBlocks: 64, maxNumSeqs: 4, startedAtMs: Date.now(),
    model: { modelName: 'fake', maxModelLen: 64, vocabSize: 500, blockSizeTokens: BLOCK_SIZE, eosTokenIds: [2], blockHashScheme: 'conduit-kv-sha256-128-v1' },
  };
}

/** A worker's heartbeat written by the test, so that it can stop and resume when a test says. */
function heartbeatOf(admin: Redis, registration: WorkerRegistration) {
  const beat = () => admin.multi()
    .set(workerKey(registration.workerId), JSON.stringify(registration), 'PX', HEARTBEAT_TTL_MS).sadd(WORKERS_KEY, registration.workerId)
    .exec().catch(() => {});
  let timer: NodeJS.Timeout | null = null;
  return {
    start() {
      void beat();
      timer ??= setInterval(beat, HEARTBEAT_INTERVAL_MS);
    },
    stop() {
      if (timer !== null) clearInterval(timer);
      timer = null;
    },
  };
}

/** A gateway over a real Redis, and a worker's heartbeat (no engine) it has discovered. */
async function startWithHeartbeatingWorker(t: TestContext, workerId: string, address: string) {
  const redis = await startRedisServer();
  t.after(() => redis.close());
  const admin = new Redis(redis.url, { protocol: 2, retryStrategy: () => 20 });
  admin.on('error', () => {});
  t.after(() => admin.disconnect());
  const gateway = startGateway(redis.url);
  t.after(() => gateway.shared.close());
  const heartbeat = heartbeatOf(admin, registrationOf(workerId, address));
  t.after(() => heartbeat.stop());
  heartbeat.start();
  await gateway.shared.waitForWorker('fake', 5_000);
  return { redis, admin, gateway, heartbeat };
}

test('after Redis returns, a worker that registers again later than one TTL after the gateway reconnected stays routed', { timeout: 30_000 }, async (t) => {
  const { redis, admin, gateway, heartbeat } = await startWithHeartbeatingWorker(t, 'late', '10.0.0.8:7000');

  heartbeat.stop();
  await redis.stop();
  await until(() => !gateway.shared.isConnected, 'the gateway noticed');
  await redis.start();
  await until(() => gateway.shared.isConnected, 'the gateway reconnected', 10_000);
  const reconnectedAtMs = Date.now();
  // The worker's own reconnect comes later (each client retries on its own schedule, up to a
  // second apart), and its first heartbeat after that.
  await until(() => Date.now() - reconnectedAtMs >= HEARTBEAT_TTL_MS + 300, 'the worker is late');
  await until(() => admin.status === 'ready', 'the worker reconnected');
  heartbeat.start();
  await until(async () => (await admin.sismember(WORKERS_KEY, 'late')) === 1, 'registered again');
  const registeredAtMs = Date.now();
  await until(() => Date.now() - registeredAtMs >= 3 * HEARTBEAT_INTERVAL_MS, 'a few polls');
  assert.deepEqual(gateway.router.workers.map((worker) => worker.address), ['10.0.0.8:7000']);
  assert.equal(gateway.clients.length, 1, 'the worker was never dropped and joined again');
  assert.equal(gateway.clients[0].numCloses, 0);
});

test('a worker dropped after Redis returned joins again as soon as it registers, with a new client', { timeout: 30_000 }, async (t) => {
  const { redis, admin, gateway, heartbeat } = await startWithHeartbeatingWorker(t, 'gone-a-while', '10.0.0.9:7000');
  const first = gateway.clients[0];
  first.numInFlight = 1;

  heartbeat.stop();
  await redis.stop();
  await until(() => !gateway.shared.isConnected, 'the gateway noticed');
  await redis.start();
  await until(() => gateway.router.workers.length === 0, 'dropped once its grace passed', 10_000);
  assert.equal(first.numCloses, 0, 'its request in flight finishes first');
  await until(() => admin.status === 'ready', 'the worker reconnected');
  heartbeat.start();
  await until(() => gateway.router.workers.length === 1, 'joined again');
  assert.equal(gateway.clients.length, 2);
  assert.notEqual(gateway.router.workers[0], first);
  first.numInFlight = 0;
  await until(() => first.numCloses === 1, 'the old client closed once idle');
  assert.equal(gateway.clients[1].numCloses, 0);
  assert.deepEqual(gateway.router.workers.map((worker) => worker.address), ['10.0.0.9:7000']);
});

test('a stream read in flight when the connection dropped is not applied after the reconnect: each stream is read again from its start', { timeout: 30_000 }, async (t) => {
  const redis = await startRedisServer();
  t.after(() => redis.close());
  const proxy = await startDroppingProxy(redis.port);
  t.after(() => proxy.close());
  const admin = new Redis(redis.url, { protocol: 2 });
  t.after(() => admin.disconnect());
  const engine = startEngine();
  t.after(() => engine.close());
  await generate(engine, 'a', prompt(1, 21));
  // The worker reaches Redis directly; only the gateway's connections drop.
  const publisher = startPublisher(redis.url, engine, '10.0.0.10:7000');
  t.after(() => publisher.close());
  const gateway = startGateway(proxy.url);
  t.after(() => gateway.shared.close());
  await gateway.shared.waitForWorker('fake', 5_000);
  await until(async () => gateway.router.numIndexedBlocks === (await numCachedBlocksOf(engine)), 'indexed from Redis');

  // The gateway's reconnect hangs until release(): its blocking read, sent before the drop, waits to be sent again.
  proxy.drop({ hold: true });
  await until(() => !gateway.shared.isConnected, 'the gateway noticed');
  // Meanwhile its engine stream reports a block the worker does not hold, and the worker publishes new ones to Redis.
  gateway.clients[0].report([{ kind: 'stored', blockHashes: extendBlockHashes([], rootHash({ model: 'fake' }), prompt(40, 8), BLOCK_SIZE, 2) }]);
  const numEntriesBefore = await admin.xlen(kvStreamKey(publisher.workerId));
  await generate(engine, 'b', prompt(2, 21));
  await until(async () => (await admin.xlen(kvStreamKey(publisher.workerId))) > numEntriesBefore, 'published while the gateway was away');
  proxy.release();

  // Read from the snapshot, the index is the worker's cache: the engine stream's block is gone.
  const numCached = await numCachedBlocksOf(engine);
  await until(() => gateway.shared.isConnected && gateway.router.numIndexedBlocks === numCached, 'rebuilt from the snapshot', 10_000);
  assert.equal(gateway.router.indexStats()[0].numDriftBlocks, 0);
  const routed = gateway.router.route({ promptTokenIds: prompt(40, 9) })!;
  assert.equal(routed.numPredictedCachedTokens, 0);
});

test('a worker restarted on the same address (a new id, a later start) replaces the old registration at once, long before it expires; an older one never displaces it', { timeout: 30_000 }, async (t) => {
  const redis = await startRedisServer();
  t.after(() => redis.close());
  const admin = new Redis(redis.url, { protocol: 2 });
  t.after(() => admin.disconnect());
  const gateway = startGateway(redis.url);
  t.after(() => gateway.shared.close());
  const address = '10.0.0.11:7000';
  /** Registered as a worker does, with a minute to live: only the rule under test can end it early. */
  const register = (registration: WorkerRegistration) =>
    admin.multi().set(workerKey(registration.workerId), JSON.stringify(registration), 'PX', 60_000).sadd(WORKERS_KEY, registration.workerId).exec();
  const startedAtMs = Date.now();
  await register({ ...registrationOf('before-restart', address), startedAtMs });
  await gateway.shared.waitForWorker('fake', 5_000);
  const oldClient = gateway.clients[0];
  assert.deepEqual(gateway.router.workers, [oldClient]);

  // The restarted process on the same address: its old registration is still alive in Redis.
  await register({ ...registrationOf('after-restart', address), startedAtMs: startedAtMs + 1000 });
  const replacedAfterMs = await until(() => gateway.router.workers[0] !== oldClient, 'the restarted process is routed', 2_000);
  assert.ok(replacedAfterMs < 10 * HEARTBEAT_INTERVAL_MS, `replaced after ${replacedAfterMs} ms`);
  assert.equal(gateway.clients.length, 2);
  assert.deepEqual(gateway.router.workers, [gateway.clients[1]], 'one worker at the address: the new process');
  await until(() => oldClient.numCloses === 1, 'the old process\'s client closed');

  // A registration older than the one routed (a stale process's, read late) is not taken.
  await register({ ...registrationOf('stale', address), startedAtMs: startedAtMs - 1000 });
  await new Promise((resolve) => setTimeout(resolve, 5 * HEARTBEAT_INTERVAL_MS));
  assert.deepEqual(gateway.router.workers, [gateway.clients[1]]);
  assert.equal(gateway.clients.length, 2);
});
