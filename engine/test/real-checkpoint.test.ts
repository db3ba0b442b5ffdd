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
import type { ForwardBatch, NativeModel } from '../../native/api.ts';
import { SEQ_SAMPLE, neutralSamplingExtensions } from '../../native/api.ts';
import { describeKvCache } from '../../native/index.ts';
import { createEngine, type Engine } from '../engine.ts';
import { GrpcEngineClient } from '../grpc/client.ts';
import { NativeRunner } from '../native-runner.ts';
import type { RequestOutput, SamplingParams } from '../types.ts';
import { startWorker } from '../worker.ts';
import { RecordingRunner, blockSizeTokens, load, tinyCheckpoint } from './tiny-model.ts';

const numOutputTokens = 8;
const prompts = [
  [5, 17, 99, 3, 42, 7, 8, 150, 33, 21, 64],
  [200, 1, 9],
  [77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93],
  [11, 250, 6, 60, 120, 240, 13],
  [3, 3, 3, 3, 3],
];

/** Greedy decoding of one prompt with hand-built batches: the whole prompt, then one token per call. */
async function referenceDecode(model: NativeModel, prompt: readonly number[]): Promise<number[]> {
  const maxBlocksPerSeq = Math.ceil((prompt.length + numOutputTokens) / blockSizeTokens);
  const tokens = prompt.slice();
  const outputs: number[] = [];
  for (let start = 0; outputs.length < numOutputTokens; start = tokens.length - 1) {
    const numTokens = tokens.length - start;
    const batch: ForwardBatch = {
      numSeqs: 1,
      numTokens,
      tokenIds: Int32Array.from(tokens.slice(start)),
      positions: Int32Array.from({ length: numTokens }, (_, i) => start + i),
      queryStarts: Int32Array.of(0, numTokens),
      maxBlocksPerSeq,
      blockTables: Int32Array.from({ length: maxBlocksPerSeq }, (_, i) => i),
      seqFlags: Uint8Array.of(SEQ_SAMPLE),
      temperatures: Float32Array.of(0),
      topPs: Float32Array.of(1),
      topKs: Int32Array.of(0),
      seeds: BigUint64Array.of(0n),
      outputIndices: Int32Array.of(outputs.length),
      ...neutralSamplingExtensions(1),
    };
    const tokenId = (await model.forward(batch)).sampledTokenIds[0];
    outputs.push(tokenId);
    tokens.push(tokenId);
  }
  return outputs;
}

const greedy: SamplingParams = { temperature: 0 };

function generate(engine: Engine, requestId: string, prompt: number[], sampling = greedy): Promise<number[]> {
  return new Promise((resolve, reject) => {
    const tokens: number[] = [];
    engine.generate(
      { requestId, promptTokenIds: prompt, sampling: { ...sampling, maxTokens: numOutputTokens, ignoreEos: true } },
      (output: RequestOutput) => {
        tokens.push(...output.newTokenIds);
        if (output.finishReason === 'length') resolve(tokens);
        else if (output.finishReason !== null) reject(new Error(`${requestId}: ${output.finishReason} ${output.error?.message}`));
      },
    );
  });
}

test('outputs through the engine equal a step-by-step decode, alone and batched', async (t) => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-engine-native-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const modelDir = tinyCheckpoint(dir);

  const referenceModel = await load(modelDir, 16);
  // The worker sizes its cache before loading; its arithmetic must match the runtime's layout.
  assert.equal(describeKvCache(modelDir, 'auto', 'auto', blockSizeTokens).bytesPerBlock, referenceModel.info.kvBytesPerBlock);
  const expected: number[][] = [];
  try {
    for (const prompt of prompts) expected.push(await referenceDecode(referenceModel, prompt));
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
    generationDefaults: { eosTokenIds: [2] },
  });
  t.after(() => engine.close());

  const alone: number[][] = [];
  for (const [index, prompt] of prompts.entries()) alone.push(await generate(engine, `alone-${index}`, prompt));
  assert.deepEqual(alone, expected);

  const batched = await Promise.all(prompts.map((prompt, index) => generate(engine, `batched-${index}`, prompt)));
  assert.deepEqual(batched, expected);

  // Seeded sampling draws from (seed, output index): batching and preemption change nothing.
  const seeded = (index: number): SamplingParams => ({ temperature: 1.5, topK: 40, seed: BigInt(index) * 7919n });
  const sampledAlone: number[][] = [];
  for (const [index, prompt] of prompts.entries()) sampledAlone.push(await generate(engine, `s-alone-${index}`, prompt, seeded(index)));
  const sampledBatched = await Promise.all(prompts.map((prompt, index) => generate(engine, `s-batched-${index}`, prompt, seeded(index))));
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
