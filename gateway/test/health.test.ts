// GET /health reads what the gateway knows of its workers (their engine streams) and never waits
// on one: with one of two workers stopped (its health() never answering) it answers at once.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { startTestGateway, type TestGateway } from './harness.ts';

let gateway: TestGateway;
before(async () => {
  gateway = await startTestGateway(() => ({ steps: [] }), { numWorkers: 2 });
});
after(() => gateway.close());

async function health(): Promise<{ status: number; ms: number; models: { name: string; numServingWorkers: number; numWorkers: number }[] }> {
  const startMs = performance.now();
  const response = await fetch(`${gateway.baseUrl}/health`);
  const body = await response.json() as { models: { name: string; numServingWorkers: number; numWorkers: number }[] };
  return { status: response.status, ms: performance.now() - startMs, models: body.models };
}

test('a worker that stopped answering does not slow /health; a worker whose stream is down counts as not serving', async () => {
  const [first, second] = gateway.engines;
  second.isHealthHung = true;
  const stopped = await health();
  assert.equal(stopped.status, 200);
  // It used to ask each worker and wait up to 2 s for the stopped one.
  assert.ok(stopped.ms < 1000, `/health took ${stopped.ms.toFixed(0)} ms`);
  assert.deepEqual(stopped.models.find((model) => model.name === 'tiny'), { name: 'tiny', numServingWorkers: 2, numWorkers: 2 });

  second.isStreamDown = true;
  const oneDown = await health();
  assert.equal(oneDown.status, 200);
  assert.equal(oneDown.models[0].numServingWorkers, 1);
  first.isStreamDown = true;
  const allDown = await health();
  assert.equal(allDown.status, 503);
  assert.equal(allDown.models[0].numServingWorkers, 0);
  first.isStreamDown = false;
  second.isStreamDown = false;
  second.isHealthHung = false;
});
