// One round of `npm run chaos:workers` (tools/worker-chaos.ts): `conduit serve` started as a
// process over two remote workers, one SIGKILLed while both stream. Its clients get an OpenAI
// error event and [DONE], not a hang or a cut connection; the other worker's streams get every
// token; a request right after the kill succeeds; the worker, started again, is routed to again.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ChaosCluster } from '../../tools/worker-chaos.ts';

test('a worker killed mid-stream: a clean error for its clients, the other worker\'s streams untouched, new requests served', { timeout: 180_000 }, async (t) => {
  const cluster = await ChaosCluster.start({ numWorkers: 2, streamsPerWorker: 2, numTokens: 300 });
  t.after(() => cluster.close());
  for (let round = 0; round < 2; round++) {
    const result = await cluster.round(round);
    assert.deepEqual(result.problems, [], `round ${round}`);
    assert.ok(result.numCleanErrors > 0, `round ${round}: the killed worker had streams`);
    t.diagnostic(`round ${round}: ${result.numCleanErrors} clean errors, ${result.numCompleted} completed, balanced: ${result.balanced}`);
  }
});
