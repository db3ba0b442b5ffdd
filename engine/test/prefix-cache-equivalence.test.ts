// Prefix caching changes which KV is computed, never what it holds: on a real (tiny, random)
// checkpoint, greedy outputs and their log-probabilities are bitwise the same with the cache on
// and off, under preemption, and whatever the chunk size, and equal a decode of each prompt
// alone. Prompts share prefixes the way chats and few-shot prompts do.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createEngine, type Engine } from '../engine.ts';
import { NativeRunner } from '../native-runner.ts';
import type { RequestOutput } from '../types.ts';
import { RecordingRunner, load, tinyCheckpoint } from './tiny-model.ts';

const numOutputTokens = 6;
const system = [31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43];

const turn1 = [...system, 100, 101, 102];

/**
 * Each request, by id, and its prompt; the second turn of a chat sends the first turn's prompt,
 * its answer and a new message, so it can be built only once that answer is known.
 */
const prompts: [string, (results: Map<string, Result>) => number[]][] = [
  ['turn-1', () => turn1],
  ['other-user', () => [...system, 150, 151]],
  ['same-again', () => turn1.slice()],
  ['turn-2', (results) => [...turn1, ...results.get('turn-1')!.tokenIds, 200, 201]],
  ['unrelated', () => [5, 17, 99, 3, 42, 7, 8, 150, 33]],
  ['block-exact', () => system.slice(0, 12)],
];

interface Result {
  tokenIds: number[];
  logprobs: number[];
  numCachedTokens: number;
}

function generate(engine: Engine, requestId: string, promptTokenIds: number[]): Promise<Result> {
  return new Promise((resolve, reject) => {
    const result: Result = { tokenIds: [], logprobs: [], numCachedTokens: 0 };
    engine.generate(
      { requestId, promptTokenIds, sampling: { temperature: 0, maxTokens: numOutputTokens, ignoreEos: true } },
      (output: RequestOutput) => {
        result.tokenIds.push(...output.newTokenIds);
        result.logprobs.push(...output.newLogprobs);
        result.numCachedTokens = output.numCachedTokens;
        if (output.finishReason === 'length') resolve(result);
        else if (output.finishReason !== null) reject(new Error(`${requestId}: ${output.finishReason} ${output.error?.message}`));
      },
    );
  });
}

interface Setting {
  enablePrefixCaching: boolean;
  numKvBlocks: number;
  maxNumBatchedTokens: number;
}

/** Runs every prompt twice: one by one (each after the last, so later ones find earlier ones cached), then all at once. */
async function runAll(modelDir: string, setting: Setting) {
  const limits = { maxModelLen: 128, maxNumSeqs: 4, maxNumBatchedTokens: setting.maxNumBatchedTokens };
  const runner = new RecordingRunner(new NativeRunner(await load(modelDir, setting.numKvBlocks), limits));
  const engine = createEngine(runner, {
    servedName: 'tiny',
    maxNumSeqs: limits.maxNumSeqs,
    maxNumBatchedTokens: limits.maxNumBatchedTokens,
    generationDefaults: { eosTokenIds: [2] },
    enablePrefixCaching: setting.enablePrefixCaching,
  });
  try {
    const sequential = new Map<string, Result>();
    const promptsById = new Map<string, number[]>();
    for (const [requestId, promptOf] of prompts) {
      promptsById.set(requestId, promptOf(sequential));
      sequential.set(requestId, await generate(engine, requestId, promptsById.get(requestId)!));
    }
    const concurrent = new Map<string, Result>();
    await Promise.all(
      [...promptsById].map(async ([requestId, prompt]) => concurrent.set(requestId, await generate(engine, `${requestId}-again`, prompt))),
    );
    // Completion order must not reorder the comparison.
    const concurrentInOrder = new Map([...promptsById.keys()].map((requestId) => [requestId, concurrent.get(requestId)!]));
    const numPreempted = runner.steps.reduce((sum, step) => sum + step.preemptedRequestIds.length, 0);
    return { sequential, concurrent: concurrentInOrder, numPreempted };
  } finally {
    await engine.close();
  }
}

function tokensAndLogprobs(results: Map<string, Result>) {
  return [...results].map(([requestId, result]) => [requestId, result.tokenIds, Array.from(new Float32Array(result.logprobs), (x) => x.toString())]);
}

test('greedy outputs are bitwise the same with the prefix cache on and off, under preemption, at any chunk size', async (t) => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-prefix-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const modelDir = tinyCheckpoint(dir);

  // The reference: no cache, a roomy pool, every prompt in one chunk.
  const reference = await runAll(modelDir, { enablePrefixCaching: false, numKvBlocks: 64, maxNumBatchedTokens: 64 });
  const expected = tokensAndLogprobs(reference.sequential);
  assert.deepEqual(tokensAndLogprobs(reference.concurrent), expected);

  let numPreempted = 0;
  for (const enablePrefixCaching of [true, false]) {
    // 9 blocks of 4 cannot hold four of these requests at once: preemption. 4 tokens a step chunks every prompt.
    for (const [numKvBlocks, maxNumBatchedTokens] of [[64, 64], [64, 4], [9, 8], [9, 4]]) {
      const label = `caching ${enablePrefixCaching}, ${numKvBlocks} blocks, ${maxNumBatchedTokens} tokens a step`;
      const run = await runAll(modelDir, { enablePrefixCaching, numKvBlocks, maxNumBatchedTokens });
      assert.deepEqual(tokensAndLogprobs(run.sequential), expected, `${label}, one by one`);
      assert.deepEqual(tokensAndLogprobs(run.concurrent), expected, `${label}, all at once`);
      numPreempted += run.numPreempted;
      if (!enablePrefixCaching) {
        assert.ok([...run.sequential.values()].every((result) => result.numCachedTokens === 0), label);
        continue;
      }
      // One by one, each prompt finds the full blocks of those before it (block size 4), the
      // answer's included; a prompt all in the cache still computes its last token.
      const cached = Object.fromEntries([...run.sequential].map(([requestId, result]) => [requestId, result.numCachedTokens]));
      if (numKvBlocks === 64) {
        assert.deepEqual(cached, { 'turn-1': 0, 'other-user': 12, 'same-again': 12, 'turn-2': 20, unrelated: 0, 'block-exact': 8 }, label);
      }
    }
  }
  assert.ok(numPreempted > 0, 'some setting preempted');
});
