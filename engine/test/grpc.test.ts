import { test } from 'node:test';
import assert from 'node:assert/strict';
import { HASH_SCHEME } from '../kv/block-hash.ts';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createEngine } from '../engine.ts';
import { GrpcEngineClient } from '../grpc/client.ts';
import { serveEngine } from '../grpc/service.ts';
import type { GenerateRequest, RequestOutput } from '../types.ts';
import { FakeRunner } from './fake-runner.ts';

const numKvBlocks = 64;

/** Lets the engine take one step per permit. */
class StepGate {
  private numPermits = 0;
  private waiter: (() => void) | null = null;

  open(numSteps = 1): void {
    this.numPermits += numSteps;
    this.release();
  }

  wait = (): Promise<void> =>
    new Promise((resolve) => {
      this.waiter = resolve;
      this.release();
    });

  private release(): void {
    if (this.waiter === null || this.numPermits === 0) return;
    this.numPermits--;
    const waiter = this.waiter;
    this.waiter = null;
    waiter();
  }
}

async function startWorker(listen = '127.0.0.1:0') {
  const runner = new FakeRunner({ numKvBlocks, blockSizeTokens: 4, vocabSize: 500, maxModelLen: 128 });
  const engine = createEngine(runner, {
    servedName: 'fake',
    maxNumSeqs: 8,
    maxNumBatchedTokens: 64,
    generationDefaults: { eosTokenIds: [2], temperature: 0.5 },
  });
  const server = await serveEngine(engine, listen);
  const client = new GrpcEngineClient(server.address);
  const stop = async () => {
    client.close();
    await server.close();
    await engine.close();
  };
  return { runner, engine, server, client, stop };
}

function request(requestId: string, maxTokens: number, extra: Partial<GenerateRequest['sampling']> = {}): GenerateRequest {
  return { requestId, promptTokenIds: [11, 12, 13, 14, 15, 16], sampling: { maxTokens, ...extra } };
}

function collect(client: GrpcEngineClient, req: GenerateRequest, onEach?: (output: RequestOutput) => void) {
  return new Promise<RequestOutput[]>((resolve) => {
    const outputs: RequestOutput[] = [];
    client.generate(req, (output) => {
      outputs.push(output);
      onEach?.(output);
      if (output.finishReason !== null) resolve(outputs);
    });
  });
}

test('one stream carries several concurrent requests, each routed back by id', async (t) => {
  const { client, runner, stop } = await startWorker();
  t.after(stop);
  const maxSeed = (1n << 64n) - 1n;
  const results = await Promise.all([
    collect(client, request('a', 3, { seed: maxSeed, temperature: 0 })),
    collect(client, request('b', 5)),
    collect(client, request('c', 1, { stopTokenIds: [100] })),
    collect(client, request('d', 4, { topP: 0.25, topK: 3 })),
  ]);
  const tokensOf = (outputs: RequestOutput[]) => outputs.flatMap((output) => output.newTokenIds);
  assert.deepEqual(results.map(tokensOf), [[100, 101, 102], [100, 101, 102, 103, 104], [100], [100, 101, 102, 103]]);
  assert.deepEqual(results.map((outputs) => outputs.at(-1)!.finishReason), ['length', 'length', 'stop', 'length']);
  assert.equal(results[2].at(-1)!.stopTokenId, 100);
  assert.equal(results[1].at(-1)!.numPromptTokens, 6);
  assert.equal(client.numInFlight, 0);

  // Sampling fields cross the wire intact; unset ones take the checkpoint defaults.
  const samplingOf = (id: string) => runner.steps.flatMap((step) => step.scheduled).find((entry) => entry.requestId.endsWith(id))!.sampling;
  assert.equal(samplingOf('a').seed, maxSeed);
  assert.equal(samplingOf('a').temperature, 0);
  assert.equal(samplingOf('b').temperature, 0.5);
  assert.deepEqual([samplingOf('d').topP, samplingOf('d').topK], [0.25, 3]);

  const health = await client.health();
  assert.equal(health.serving, true);
  assert.deepEqual(health.model, { modelName: 'fake', maxModelLen: 128, vocabSize: 500, blockSizeTokens: 4, eosTokenIds: [2], blockHashScheme: HASH_SCHEME });
  assert.deepEqual(health.load, { numRunning: 0, numWaiting: 0, numFreeBlocks: numKvBlocks, numTotalBlocks: numKvBlocks, numQueuedPrefillTokens: 0 });
});

test('abort mid-stream ends the request and frees its blocks on the worker', async (t) => {
  const { client, runner, stop } = await startWorker();
  const gate = new StepGate();
  runner.beforeStep = gate.wait;
  t.after(() => {
    runner.beforeStep = null;
    gate.open(1_000);
    return stop();
  });
  gate.open();
  const outputs = await collect(client, request('long', 100), (output) => {
    if (output.numOutputTokens === 1) client.abort('long');
    // One step per output received, so the abort overtakes the request's end.
    if (output.finishReason === null) gate.open();
  });
  assert.equal(outputs.at(-1)!.finishReason, 'abort');
  assert.ok(outputs.at(-1)!.numOutputTokens < 100);
  assert.equal(client.numInFlight, 0);
  const { load } = await client.health();
  assert.deepEqual(load, { numRunning: 0, numWaiting: 0, numFreeBlocks: numKvBlocks, numTotalBlocks: numKvBlocks, numQueuedPrefillTokens: 0 });
});

test('a refused request comes back as one error output', async (t) => {
  const { client, stop } = await startWorker();
  t.after(stop);
  const [output] = await collect(client, request('too-long', 1000));
  assert.equal(output.finishReason, 'error');
  assert.equal(output.error?.code, 'context_length_exceeded');
});

test('pending requests fail cleanly when the worker goes away, and later ones fail fast', async () => {
  const { client, runner, engine, server } = await startWorker();
  const gate = new StepGate();
  runner.beforeStep = gate.wait;
  const pending = Promise.all([collect(client, request('a', 10)), collect(client, request('b', 10))]);
  // Wait until the worker holds both requests, then take it away.
  for (let load = (await client.health()).load; load.numRunning + load.numWaiting < 2; ) {
    load = (await client.health()).load;
  }
  await server.close();
  const failed = await pending;
  for (const outputs of failed) {
    assert.equal(outputs.at(-1)!.finishReason, 'error');
    assert.equal(outputs.at(-1)!.error?.code, 'engine_unavailable');
  }
  assert.equal(client.numInFlight, 0);

  const [late] = await collect(client, request('c', 1));
  assert.equal(late.error?.code, 'engine_unavailable');
  await assert.rejects(client.health(), /engine worker 127\.0\.0\.1:\d+/);

  client.close();
  gate.open(1_000);
  await engine.close();
});

test('a client that goes away has its requests aborted on the worker', { timeout: 30_000 }, async (t) => {
  const { client, runner, server, stop } = await startWorker();
  const gate = new StepGate();
  runner.beforeStep = gate.wait;
  const observer = new GrpcEngineClient(server.address);
  t.after(() => {
    observer.close();
    gate.open(1_000);
    return stop();
  });
  const pending = collect(client, request('orphan', 100));
  for (let load = (await observer.health()).load; load.numRunning + load.numWaiting < 1; ) {
    load = (await observer.health()).load;
  }
  client.close();
  assert.equal((await pending).at(-1)!.error?.code, 'engine_unavailable');
  // One step per health round trip: the cancel overtakes the 100 steps the request would need.
  for (let load = (await observer.health()).load; load.numFreeBlocks < numKvBlocks || load.numRunning > 0; ) {
    gate.open();
    load = (await observer.health()).load;
  }
  const numOutputTokens = runner.steps.flatMap((step) => step.scheduled).map((entry) => entry.numOutputTokens);
  assert.ok(Math.max(...numOutputTokens) < 99);
});

test('a worker listens on a unix socket', async (t) => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-engine-sock-'));
  const { client, server, stop } = await startWorker(`unix:${path.join(dir, 'worker.sock')}`);
  t.after(async () => {
    await stop();
    rmSync(dir, { recursive: true, force: true });
  });
  assert.equal(server.address, `unix:${path.join(dir, 'worker.sock')}`);
  const outputs = await collect(client, request('u', 2));
  assert.deepEqual(outputs.flatMap((output) => output.newTokenIds), [100, 101]);
});
