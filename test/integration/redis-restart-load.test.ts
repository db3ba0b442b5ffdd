// Redis stopped and started again (empty) under steady load, twice: a gateway with
// router.redis_url over two `conduit worker --redis-url` processes keeps answering every request
// while Redis is away (it routes on what it knew), and after Redis returns the workers register
// again and the gateway's index is rebuilt. Every request sent completes; none fails.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { RunningServer } from '../../bin/serve.ts';
import { startRedisServer } from '../redis-server.ts';
import { pollUntil, within } from '../wait.ts';
import { boundedFetch, defaultModelDir, startServer } from './harness.ts';
import { startWorkerProcess, type WorkerProcess } from './worker-process.ts';

const HEARTBEAT = { interval_s: 0.2, ttl_s: 1 };
const NUM_CLIENTS = 4;
const NUM_CYCLES = 2;
/** Requests that complete while Redis is down, per cycle, before it is started again. */
const REQUESTS_DURING_OUTAGE = 50;

async function metric(server: RunningServer, name: string): Promise<number[]> {
  const text = await (await boundedFetch(`${server.metricsAddress}/metrics`)).text();
  return [...text.matchAll(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, 'gm'))].map((match) => Number(match[1]));
}

async function numWorkersOf(server: RunningServer): Promise<number> {
  const health = (await (await boundedFetch(`${server.httpAddress}/health`)).json()) as { models: { numWorkers: number }[] };
  return health.models[0].numWorkers;
}

test('Redis stopped and restarted under load: no request lost, workers re-register, the index is rebuilt', {
  timeout: 240_000,
}, async (t) => {
  const redis = await startRedisServer();
  const workers: WorkerProcess[] = [];
  let gateway: RunningServer | null = null;
  t.after(async () => {
    await gateway?.close();
    await Promise.all(workers.map((worker) => worker.stop('SIGKILL')));
    await redis.close();
  });
  const workerArgs = [
    '--kv-cache-blocks', '256', '--redis-url', redis.url,
    '--heartbeat-interval-s', String(HEARTBEAT.interval_s), '--heartbeat-ttl-s', String(HEARTBEAT.ttl_s),
  ];
  workers.push(...(await Promise.all([startWorkerProcess(workerArgs), startWorkerProcess(workerArgs)])));
  gateway = await startServer([{ path: defaultModelDir, num_workers: 0 }], {
    redis_url: redis.url, heartbeat_interval_s: HEARTBEAT.interval_s, heartbeat_ttl_s: HEARTBEAT.ttl_s,
  });
  const server = gateway;
  await pollUntil(async () => (await numWorkersOf(server)) === 2, 'the gateway found both workers in Redis');

  let numSent = 0;
  let numCompleted = 0;
  const failures: string[] = [];
  let stopping = false;
  /** Resolvers waiting for numCompleted to reach a count. */
  const waiters: { count: number; resolve: () => void }[] = [];
  const completedAtLeast = (count: number, what: string) => within(new Promise<void>((resolve) => {
    if (numCompleted >= count) resolve();
    else waiters.push({ count, resolve });
  }), what);
  const client = async (clientIndex: number) => {
    for (let turn = 0; !stopping; turn++) {
      numSent++;
      try {
        const response = await boundedFetch(`${server.httpAddress}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'x-session-id': `client-${clientIndex}-${turn % 3}` },
          body: JSON.stringify({ model: 'conduit-tiny', prompt: `Client ${clientIndex} says hello for the ${turn}th time`, max_tokens: 8, ignore_eos: true }),
        });
        const body = await response.json() as { usage?: { completion_tokens: number } };
        if (response.status === 200 && body.usage?.completion_tokens === 8) {
          numCompleted++;
          for (const waiter of waiters.filter((w) => w.count <= numCompleted)) {
            waiters.splice(waiters.indexOf(waiter), 1);
            waiter.resolve();
          }
        } else failures.push(`${response.status} ${JSON.stringify(body)}`);
      } catch (err) {
        failures.push((err as Error).message);
      }
    }
  };
  const clients = Array.from({ length: NUM_CLIENTS }, (_, i) => client(i));
  const figures: string[] = [];
  try {
    for (let cycle = 0; cycle < NUM_CYCLES; cycle++) {
      const atStop = numCompleted;
      const stoppedAtMs = Date.now();
      await redis.stop();
      await pollUntil(async () => (await metric(server, 'conduit_router_redis_connected'))[0] === 0, 'the gateway noticed Redis gone');
      await completedAtLeast(atStop + REQUESTS_DURING_OUTAGE, `${REQUESTS_DURING_OUTAGE} requests completed without Redis`);
      assert.equal(await numWorkersOf(server), 2, 'no worker dropped while Redis was away');
      const atStart = numCompleted;
      const downMs = Date.now() - stoppedAtMs;
      await redis.start();
      // Back: connected, both workers registered in the new (empty) Redis, the index in step with the workers.
      await pollUntil(async () => (await metric(server, 'conduit_router_redis_connected'))[0] === 1, 'the gateway reconnected');
      let numWorkers = 0;
      await pollUntil(async () => (numWorkers = await numWorkersOf(server)) === 2, 'both workers registered again')
        .catch((err: Error) => {
          throw new Error(`${err.message} (the gateway counts ${numWorkers}; worker logs:\n${workers.map((worker) => worker.log().slice(-2000)).join('\n---\n')})`);
        });
      await pollUntil(async () => {
        const drift = await metric(server, 'conduit_router_index_drift_blocks');
        return drift.length === 2 && drift.every((blocks) => blocks === 0);
      }, 'the index rebuilt');
      await completedAtLeast(atStart + REQUESTS_DURING_OUTAGE, 'requests completed after Redis returned');
      figures.push(`cycle ${cycle}: Redis down ${(downMs / 1000).toFixed(1)} s, ${atStart - atStop} requests completed meanwhile`);
    }
  } finally {
    stopping = true;
    await Promise.all(clients);
  }
  t.diagnostic(`${numSent} requests sent, ${numCompleted} completed, ${failures.length} failed; ${figures.join('; ')}`);
  assert.deepEqual(failures.slice(0, 5), [], 'no request failed');
  assert.equal(numCompleted, numSent, 'every request sent completed');
});
