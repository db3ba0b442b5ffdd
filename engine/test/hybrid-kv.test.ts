// The engine on a real hybrid model (Gemma 3: local layers with a 6-token window, one global
// layer): its sliding groups free the blocks their window has left, so a conversation three times
// longer than the cache could hold without that still runs, and greedy outputs equal a plain
// step-by-step decode with nothing freed and no cache; with prefix caching, a second request
// starts after the prefix the first left (its early sliding blocks long freed) and still decodes
// exactly the same.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { DEFAULT_OPTIONS, writeRandomCheckpoint } from '../../tools/make-checkpoint.ts';
import { createEngine } from '../engine.ts';
import { NativeRunner } from '../native-runner.ts';
import { generate, referenceDecode } from './greedy.ts';
import { RecordingRunner, blockSizeTokens as BLOCK_SIZE, load } from './tiny-model.ts';

const WINDOW = 6;
const NUM_OUTPUT_TOKENS = 24;
const MAX_NUM_BATCHED_TOKENS = 8;

function gemmaCheckpoint(dir: string): string {
  const outDir = path.join(dir, 'gemma');
  writeRandomCheckpoint({
    ...DEFAULT_OPTIONS,
    arch: 'gemma3',
    outDir,
    hiddenSize: 64,
    numLayers: 3,
    numHeads: 4,
    numKvHeads: 2,
    headDim: 16,
    intermediateSize: 96,
    vocabSize: 256,
    dtype: 'fp32',
    slidingWindow: WINDOW,
    slidingWindowPattern: 3,
    tieWordEmbeddings: true,
    maxPositionEmbeddings: 256,
    seed: 11,
  });
  return outDir;
}

test('sliding-window groups free their blocks; outputs and prefix hits stay exact', async (t) => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-hybrid-kv-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const modelDir = gemmaCheckpoint(dir);
  const prompt = Array.from({ length: 40 }, (_, i) => (i * 37 + 11) % 250);
  const followUp = [...prompt, 5, 6, 7, 8, 9, 10];

  const reference = await load(modelDir, 64);
  assert.deepEqual(reference.info.kvCacheGroups, [
    { slidingWindowTokens: null, numLayers: 1 },
    { slidingWindowTokens: WINDOW, numLayers: 1 },
    { slidingWindowTokens: WINDOW, numLayers: 1 },
  ]);
  const expected = [
    await referenceDecode(reference, prompt, NUM_OUTPUT_TOKENS, BLOCK_SIZE),
    await referenceDecode(reference, followUp, NUM_OUTPUT_TOKENS, BLOCK_SIZE),
  ];
  reference.close();

  // A 64-token conversation holds 16 blocks in the full group and at most ceil((6 - 1 + 8) / 4) + 1
  // = 5 in each sliding group; keeping every block would take 48. The pool has room beyond the
  // 28 the 70-token follow-up holds, so the blocks the first request freed stay cached a while.
  const numKvBlocks = 40;
  const limits = { maxModelLen: 128, maxNumSeqs: 2, maxNumBatchedTokens: MAX_NUM_BATCHED_TOKENS };
  const runner = new RecordingRunner(new NativeRunner(await load(modelDir, numKvBlocks), limits));
  const engine = createEngine(runner, {
    servedName: 'gemma',
    maxNumSeqs: limits.maxNumSeqs,
    maxNumBatchedTokens: limits.maxNumBatchedTokens,
    generationDefaults: { eosTokenIds: [1] },
  });
  t.after(() => engine.close());

  const first = await generate(engine, 'first', prompt, NUM_OUTPUT_TOKENS);
  assert.deepEqual(first.tokens, expected[0]);
  const heldPerStep = runner.steps.map((step) => step.scheduled[0].blockTables.flat().filter((blockId) => blockId >= 0).length);
  assert.ok(Math.max(...heldPerStep) <= 16 + 5 + 5, `the first request held up to ${Math.max(...heldPerStep)} blocks`);
  const second = await generate(engine, 'second', followUp, NUM_OUTPUT_TOKENS);
  assert.deepEqual(second.tokens, expected[1]);
  // The prompts share 40 tokens, 10 blocks: a hit needs those in the full group and, in the
  // sliding groups, only blocks 8 and 9 (what token 40 reads); blocks 0 to 7 were freed while the
  // first request ran, and some of them reused since.
  assert.equal(second.numCachedTokens, 10 * BLOCK_SIZE);
  const admitted = runner.steps.find((step) => step.scheduled.some((entry) => entry.requestId === 'second'))!;
  const tables = admitted.scheduled.find((entry) => entry.requestId === 'second')!.blockTables;
  for (const group of [1, 2]) assert.deepEqual(tables[group].slice(0, 8), Array(8).fill(-1), `sliding group ${group} took no block before the window`);
  const last = runner.steps.at(-1)!.scheduled[0];
  for (const [group, table] of last.blockTables.entries()) {
    const held = table.filter((blockId) => blockId >= 0).length;
    if (group === 0) assert.equal(held, table.length, 'the full group keeps every block');
    else assert.ok(held <= 3, `sliding group ${group} holds ${held} blocks at the end`);
  }
  assert.equal(engine.health().load.numFreeBlocks, numKvBlocks);
});
