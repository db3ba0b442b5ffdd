import { test } from 'node:test';
import assert from 'node:assert/strict';
import { HASH_SCHEME } from '../kv/block-hash.ts';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { GrpcEngineClient } from '../grpc/client.ts';
import { generateToWire, loadEngineService, stepFromWire, type ClientMessage, type StepOutput__Output } from '../grpc/wire.ts';
import type { GenerateRequest, RequestOutput, StepReport } from '../types.ts';
import { pollUntil, within } from '../../test/wait.ts';
import { distinctPrompt, scriptedTokenId } from './fake-runner.ts';
import { FAKE_WORKER_KV_BLOCKS, startFakeWorker } from './fake-worker.ts';
import { createWorkerLogger, type Logger } from '../log.ts';

const numKvBlocks = FAKE_WORKER_KV_BLOCKS;

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

function startWorker(listen = '127.0.0.1:0', log?: Logger) {
  return startFakeWorker({ listen, log, temperature: 0.5 });
}

function request(requestId: string, maxTokens: number, extra: Partial<GenerateRequest['sampling']> = {}): GenerateRequest {
  return { requestId, promptTokenIds: distinctPrompt(requestId, 6), sampling: { maxTokens, ...extra } };
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
    collect(client, request('c', 1, { stopTokenIds: [scriptedTokenId(2, 0)] })),
    collect(client, request('d', 4, { topP: 0.25, topK: 3 })),
  ]);
  const tokensOf = (outputs: RequestOutput[]) => outputs.flatMap((output) => output.newTokenIds);
  // Scheduled in arrival order, the n-th request samples its own tokens from scriptedTokenId(n, 0).
  const scripted = (ordinal: number, numTokens: number) => Array.from({ length: numTokens }, (_, i) => scriptedTokenId(ordinal, i));
  assert.deepEqual(results.map(tokensOf), [scripted(0, 3), scripted(1, 5), scripted(2, 1), scripted(3, 4)]);
  assert.deepEqual(results.map((outputs) => outputs.at(-1)!.finishReason), ['length', 'length', 'stop', 'length']);
  assert.equal(results[2].at(-1)!.stopTokenId, scriptedTokenId(2, 0));
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
  // Each request's own full blocks stay cached: 6-token prompts and 3, 5, 1 and 4 outputs compute 8, 10, 6 and 9 tokens.
  assert.deepEqual(health.load, { numRunning: 0, numWaiting: 0, numFreeBlocks: numKvBlocks, numTotalBlocks: numKvBlocks, numQueuedPrefillTokens: 0, numCachedBlocks: 2 + 2 + 1 + 2 });
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
  assert.deepEqual(load, { numRunning: 0, numWaiting: 0, numFreeBlocks: numKvBlocks, numTotalBlocks: numKvBlocks, numQueuedPrefillTokens: 0, numCachedBlocks: 2 });
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
  await pollUntil(async () => {
    const { load } = await client.health();
    return load.numRunning + load.numWaiting >= 2;
  }, 'the worker holds both requests');
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
  await pollUntil(async () => {
    const { load } = await observer.health();
    return load.numRunning + load.numWaiting >= 1;
  }, 'the worker holds the request');
  client.close();
  assert.equal((await pending).at(-1)!.error?.code, 'engine_unavailable');
  // One step per health round trip: the cancel overtakes the 100 steps the request would need.
  await pollUntil(async () => {
    const { load } = await observer.health();
    if (load.numFreeBlocks === numKvBlocks && load.numRunning === 0) return true;
    gate.open();
    return false;
  }, 'the worker frees the orphaned request');
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
  assert.deepEqual(outputs.flatMap((output) => output.newTokenIds), [scriptedTokenId(0, 0), scriptedTokenId(0, 1)]);
});

/** A raw Stream call, as another implementation of the wire would open it. */
function openRawStream(address: string) {
  const Engine = loadEngineService();
  const stub = new Engine(address, grpc.credentials.createInsecure()) as unknown as grpc.Client & {
    Stream(): grpc.ClientDuplexStream<ClientMessage, StepOutput__Output>;
  };
  const call = stub.Stream();
  const messages: { outputs: RequestOutput[]; report: StepReport }[] = [];
  const waiters: { count: number; resolve: () => void }[] = [];
  call.on('data', (message: StepOutput__Output) => {
    messages.push(stepFromWire(message));
    for (const waiter of waiters.splice(0)) {
      if (messages.length >= waiter.count) waiter.resolve();
      else waiters.push(waiter);
    }
  });
  call.on('error', () => {});
  return {
    call,
    messages,
    /** Resolves once count messages have arrived in all. */
    waitFor: (count: number) =>
      within(new Promise<void>((resolve) => (messages.length >= count ? resolve() : waiters.push({ count, resolve }))), `${count} messages`),
    close() {
      call.cancel();
      stub.close();
    },
  };
}

test('the worker sends one message per step with every request\'s outputs, its load and its statistics', async (t) => {
  const { runner, server, client, stop } = await startWorker();
  const gate = new StepGate();
  runner.beforeStep = gate.wait;
  const stream = openRawStream(server.address);
  t.after(() => {
    stream.close();
    runner.beforeStep = null;
    gate.open(1_000);
    return stop();
  });
  // A stream opens with the prefix cache's contents: an empty cache is one 'cleared'.
  await stream.waitFor(1);
  assert.deepEqual(stream.messages[0].report.events, [{ kind: 'cleared' }]);
  assert.equal(stream.messages[0].report.stats, null);

  const maxTokensById = { a: 3, b: 5, c: 2, d: 4 };
  // One prompt for all four, so that they share its first block.
  const sharedPrompt = distinctPrompt('shared', 6);
  for (const [requestId, maxTokens] of Object.entries(maxTokensById)) {
    stream.call.write({ generate: generateToWire({ ...request(requestId, maxTokens, { temperature: 0 }), promptTokenIds: sharedPrompt }) });
  }
  // The first step holds the first request; the rest join the second, so four run together.
  await pollUntil(async () => {
    const { load } = await client.health();
    return load.numRunning + load.numWaiting >= 4;
  }, 'the worker holds all four requests');
  gate.open(1_000);
  const numFinished = () => stream.messages.flatMap((message) => message.outputs).filter((output) => output.finishReason !== null).length;
  while (numFinished() < 4) await stream.waitFor(stream.messages.length + 1);
  const stepMessages = stream.messages.filter((message) => message.report.stats !== null);
  assert.equal(stepMessages.length, runner.steps.length);
  for (const [index, message] of stepMessages.entries()) {
    const step = runner.steps[index];
    // Every scheduled request that produced news is in its step's one message.
    assert.deepEqual(
      message.outputs.map((output) => output.requestId).sort(),
      step.scheduled.map((entry) => entry.requestId.split('/').at(-1)).sort(),
    );
    assert.equal(message.report.stats!.numScheduledSeqs, step.scheduled.length);
    assert.equal(message.report.stats!.numScheduledTokens, step.scheduled.reduce((sum, entry) => sum + entry.numScheduledTokens, 0));
  }
  const numOutputTokens = stepMessages.flatMap((message) => message.outputs).reduce((sum, output) => sum + output.newTokenIds.length, 0);
  assert.equal(numOutputTokens, 3 + 5 + 2 + 4);
  assert.equal(stepMessages.length, 6, 'one message per step (the longest request\'s 5 and the first alone), not one per token');
  assert.equal(Math.max(...stepMessages.map((message) => message.outputs.length)), 4);
  assert.deepEqual(stepMessages.at(-1)!.report.load, {
    numRunning: 0, numWaiting: 0, numFreeBlocks: numKvBlocks, numTotalBlocks: numKvBlocks, numQueuedPrefillTokens: 0, numCachedBlocks: 1 + 3,
  });
  // Their 6-token prompts fill one 4-token block each, the same block: stored once. Each samples
  // its own tokens, so a second block (prompt tail and outputs, full once 8 tokens are computed:
  // a, b and d) is stored per request.
  const stored = stepMessages.flatMap((message) => message.report.events).filter((event) => event.kind === 'stored');
  assert.equal(stored.flatMap((event) => (event.kind === 'stored' ? event.blockHashes : [])).length, 1 + 3);

  // A stream opened later learns the whole cache in its first message.
  const late = openRawStream(server.address);
  t.after(() => late.close());
  await late.waitFor(1);
  const [cleared, snapshot] = late.messages[0].report.events;
  assert.deepEqual(cleared, { kind: 'cleared' });
  assert.equal(snapshot.kind, 'stored');
  assert.deepEqual(
    new Set(snapshot.kind === 'stored' ? snapshot.blockHashes : []),
    new Set(stored.flatMap((event) => (event.kind === 'stored' ? event.blockHashes : []))),
  );
});

test('an idle stream carries a heartbeat (the load and nothing else) every second, so that silence means a hung worker', async (t) => {
  const { server, stop } = await startWorker();
  const stream = openRawStream(server.address);
  t.after(() => {
    stream.close();
    return stop();
  });
  // The cache snapshot, then two heartbeats.
  await stream.waitFor(3);
  for (const heartbeat of stream.messages.slice(1, 3)) {
    assert.deepEqual(heartbeat.outputs, []);
    assert.deepEqual(heartbeat.report.events, []);
    assert.equal(heartbeat.report.stats, null);
    assert.equal(heartbeat.report.load.numTotalBlocks, numKvBlocks);
  }
});

test('the worker logs an aborted or failed request under the gateway\'s id, and never its tokens; the first token reports queue and prefill times', async (t) => {
  const lines: Record<string, unknown>[] = [];
  const log = createWorkerLogger('info', { write: (line: string) => lines.push(JSON.parse(line)) });
  const { client, stop } = await startWorker('127.0.0.1:0', log);
  t.after(stop);

  const finished = await collect(client, { ...request('done', 3), externalRequestId: 'ext-done' });
  const first = finished.find((output) => output.newTokenIds.length > 0)!;
  assert.ok(first.queueTimeMs !== undefined && first.queueTimeMs >= 0);
  assert.ok(first.prefillTimeMs !== undefined && first.prefillTimeMs >= 0);
  assert.ok(finished.filter((output) => output.queueTimeMs !== undefined).length === 1);

  let aborted = false;
  await collect(client, { ...request('cut', 100), externalRequestId: 'ext-cut' }, (output) => {
    if (aborted || output.newTokenIds.length === 0) return;
    aborted = true;
    client.abort('cut');
  });
  await collect(client, { requestId: 'big', promptTokenIds: distinctPrompt('big', 6), sampling: { maxTokens: 1000 }, externalRequestId: 'ext-big' });

  await pollUntil(async () => lines.length >= 2, 'two log lines');
  const abortLine = lines.find((line) => line.request_id === 'ext-cut')!;
  assert.equal(abortLine.msg, 'request aborted');
  assert.equal(abortLine.level, 'info');
  assert.equal(abortLine.role, 'worker');
  const failLine = lines.find((line) => line.request_id === 'ext-big')!;
  assert.equal(failLine.msg, 'request failed');
  assert.equal(failLine.level, 'warn');
  assert.equal(typeof failLine.code, 'string');
  // A request that finished normally leaves no line; no line holds token ids.
  assert.ok(!lines.some((line) => line.request_id === 'ext-done'));
  assert.ok(!JSON.stringify(lines).includes('token_ids'));
  assert.ok(!JSON.stringify(lines).includes(String(distinctPrompt('cut', 6))));
});
