// The engine on a real (tiny, random) checkpoint: greedy outputs through the scheduler, with
// chunked prefill, preemption and batching, must equal a plain step-by-step decode of each
// prompt alone, and seeded samples must not depend on the batch. The runtime's kernels are
// batch-invariant, so equality is exact.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { HASH_SCHEME } from '../kv/block-hash.ts';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describeKvCache } from '../../native/index.ts';
import { createEngine, type Engine } from '../engine.ts';
import { GrpcEngineClient } from '../grpc/client.ts';
import { NativeRunner } from '../native-runner.ts';
import { prefillLimitsFor } from '../scheduler.ts';
import type { SamplingParams } from '../types.ts';
import { startWorker } from '../worker.ts';
import { generate, referenceDecode } from './greedy.ts';
import { RecordingRunner, blockSizeTokens, load, tinyCheckpoint } from './tiny-model.ts';

const numOutputTokens = 8;
const prompts = [
  [5, 17, 99, 3, 42, 7, 8, 150, 33, 21, 64],
  [200, 1, 9],
  [77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93],
  [11, 250, 6, 60, 120, 240, 13],
  [3, 3, 3, 3, 3],
];

const generateTokens = async (engine: Engine, requestId: string, prompt: number[], sampling?: SamplingParams): Promise<number[]> =>
  (await generate(engine, requestId, prompt, numOutputTokens, sampling)).tokens;

test('outputs through the engine equal a step-by-step decode, alone and batched', async (t) => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-engine-native-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const modelDir = tinyCheckpoint(dir);

  const referenceModel = await load(modelDir, 16);
  // The worker sizes its cache before loading; its arithmetic must match the runtime's layout.
  assert.equal(describeKvCache(modelDir, 'auto', 'auto', blockSizeTokens).bytesPerBlock, referenceModel.info.kvBytesPerBlock);
  const expected: number[][] = [];
  try {
    for (const prompt of prompts) expected.push(await referenceDecode(referenceModel, prompt, numOutputTokens, blockSizeTokens));
  } finally {
    referenceModel.close();
  }

  // 10 blocks hold any one request but not all of them at once; a budget of 8 tokens chunks prompts.
  const limits = { maxModelLen: 128, maxNumSeqs: 4, maxNumBatchedTokens: 8 };
  const runner = new RecordingRunner(new NativeRunner(await load(modelDir, 10), limits));
  const engine = createEngine(runner, {
    servedName: 'tiny',
    maxNumSeqs: limits.maxNumSeqs,
    maxNumBatchedTokens: limits.maxNumBatchedTokens,
    // Whole prompts beside decodes (throughput's limits): interactivity's one-token chunks at this
    // budget would let the cache keep up, and this test needs the preemption.
    prefillLimits: prefillLimitsFor('throughput', limits.maxNumSeqs, limits.maxNumBatchedTokens),
    generationDefaults: { eosTokenIds: [2] },
  });
  t.after(() => engine.close());

  const alone: number[][] = [];
  for (const [index, prompt] of prompts.entries()) alone.push(await generateTokens(engine, `alone-${index}`, prompt));
  assert.deepEqual(alone, expected);

  const batched = await Promise.all(prompts.map((prompt, index) => generateTokens(engine, `batched-${index}`, prompt)));
  assert.deepEqual(batched, expected);

  // Seeded sampling draws from (seed, output index): batching and preemption change nothing.
  const seeded = (index: number): SamplingParams => ({ temperature: 1.5, topK: 40, seed: BigInt(index) * 7919n });
  const sampledAlone: number[][] = [];
  for (const [index, prompt] of prompts.entries()) sampledAlone.push(await generateTokens(engine, `s-alone-${index}`, prompt, seeded(index)));
  const sampledBatched = await Promise.all(prompts.map((prompt, index) => generateTokens(engine, `s-batched-${index}`, prompt, seeded(index))));
  assert.deepEqual(sampledBatched, sampledAlone);
  assert.notDeepEqual(sampledAlone, expected);

  const entries = runner.steps.flatMap((step) => step.scheduled);
  assert.ok(runner.steps.some((step) => step.scheduled.length > 1), 'requests shared a step');
  assert.ok(entries.some((entry) => !entry.sample && entry.numScheduledTokens > 1), 'a prompt was chunked');
  assert.ok(runner.steps.some((step) => step.preemptedRequestIds.length > 0), 'a request was preempted');
  assert.equal(engine.health().load.numFreeBlocks, 10);
});

test('a worker serves the checkpoint over gRPC and sizes its cache from a byte budget', async (t) => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-worker-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const modelDir = tinyCheckpoint(dir);
  // fp32 KV: 2 (K, V) x 2 layers x 2 KV heads x 16 dims x 4 tokens x 4 bytes = 2048 bytes a block.
  const worker = await startWorker({
    modelDir,
    servedName: 'tiny',
    dtype: 'auto',
    kvCacheDtype: 'auto',
    kvCacheBytes: 2048 * 20 + 100,
    blockSizeTokens,
    maxNumSeqs: 4,
    maxNumBatchedTokens: 32,
    prefillLimits: { maxNumPartialPrefills: 4, maxLongPartialPrefills: 1, longPrefillTokenThreshold: 4 },
    numThreads: 2,
    kernel: 'auto',
    quantization: 'none',
    enablePrefixCaching: true,
    schedulingPolicy: 'fcfs',
    grammarThreads: 1,
    listen: '127.0.0.1:0',
  });
  const client = new GrpcEngineClient(worker.address);
  t.after(async () => {
    client.close();
    await worker.close();
  });
  const health = await client.health();
  assert.deepEqual(health.model, { modelName: 'tiny', maxModelLen: 80, vocabSize: 256, blockSizeTokens, eosTokenIds: [2], blockHashScheme: HASH_SCHEME });
  assert.equal(health.load.numTotalBlocks, 20);

  const tokens = await new Promise<number[]>((resolve) => {
    const collected: number[] = [];
    client.generate({ requestId: 'r', promptTokenIds: prompts[0], sampling: { maxTokens: 5, ignoreEos: true, seed: 3n } }, (output) => {
      collected.push(...output.newTokenIds);
      if (output.finishReason !== null) resolve(collected);
    });
  });
  assert.equal(tokens.length, 5);
  assert.ok(tokens.every((tokenId) => tokenId >= 0 && tokenId < 256));
});
