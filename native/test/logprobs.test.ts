// Top logprobs of sampled positions and prompt logprobs, against the fp64 log-softmax of the raw
// logits the runtime returns (SEQ_RETURN_LOGITS): ids exact, descending with ties to the lower
// id, values within LOGPROB_TOLERANCE. Models and prompts are drawn fresh each run; failures
// print the seed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { closeSync, openSync, readSync, writeSync } from 'node:fs';
import path from 'node:path';
import type { ForwardResult, NativeModel } from '../api.ts';
import { MAX_TOP_LOGPROBS, SEQ_PROMPT_LOGPROBS, SEQ_RETURN_LOGITS, SEQ_SAMPLE } from '../api.ts';
import { readSafetensorsHeader } from '../safetensors.ts';
import {
  buildBatch,
  consecutiveBlocks,
  freshSeed,
  loadOptions,
  makeTempDir,
  randomTokens,
  uniformSource,
  withModel,
  writeCheckpoint,
  type SeqChunk,
  type ShapeOptions,
} from './helpers.ts';
import { idsByValue, logSoftmax, topLogprobs } from './sampling-reference.ts';

/**
 * The runtime's log-softmax takes its denominator from fp32 exponentials (~2 ulp) summed in fp32
 * chunks of 64, and rounds the result to fp32 (half an ulp is 9.5e-7 between −16 and −32, the
 * most negative these models give). Measured at most 4.8e-7 off the fp64 value.
 */
const LOGPROB_TOLERANCE = 2e-6;
const BLOCK_SIZE_TOKENS = 16;

function tinyShape(vocabSize: number, seed: number): ShapeOptions {
  return { arch: 'llama', hiddenSize: 32, numLayers: 1, numHeads: 2, numKvHeads: 2, intermediateSize: 48, vocabSize, dtype: 'fp32', seed };
}

/** Overwrites lm_head rows `copies` with row `source` (an fp32, untied checkpoint), so those tokens' logits tie bit for bit. */
function duplicateLmHeadRow(modelDir: string, source: number, copies: readonly number[], hiddenSize: number): void {
  const file = path.join(modelDir, 'model.safetensors');
  const lmHead = readSafetensorsHeader(file).tensors.get('lm_head.weight')!;
  const rowBytes = hiddenSize * 4;
  const row = Buffer.alloc(rowBytes);
  const fd = openSync(file, 'r+');
  try {
    readSync(fd, row, 0, rowBytes, lmHead.dataBegin + source * rowBytes);
    for (const copy of copies) writeSync(fd, row, 0, rowBytes, lmHead.dataBegin + copy * rowBytes);
  } finally {
    closeSync(fd);
  }
}

function assertClose(actual: number, expected: number, label: string): void {
  assert.ok(Math.abs(actual - expected) <= LOGPROB_TOLERANCE, `${label}: ${actual} against ${expected}`);
}

/** Row `row` of a [rows × MAX_TOP_LOGPROBS] output, its first n entries checked against the reference top-n of logits. */
function assertTopRow(ids: Int32Array, logprobs: Float32Array, row: number, logits: Float32Array, n: number, label: string): void {
  const begin = row * MAX_TOP_LOGPROBS;
  const expected = topLogprobs(logits, n);
  assert.deepEqual(Array.from(ids.subarray(begin, begin + n)), expected.ids, `${label}: top ids`);
  expected.logprobs.forEach((logprob, i) => assertClose(logprobs[begin + i], logprob, `${label}: top logprob ${i}`));
  assertUnusedTail(ids, logprobs, row, n, label);
}

function assertUnusedTail(ids: Int32Array, logprobs: Float32Array, row: number, used: number, label: string): void {
  for (let i = row * MAX_TOP_LOGPROBS + used; i < (row + 1) * MAX_TOP_LOGPROBS; i++) {
    assert.equal(ids[i], -1, `${label}: unused entry ${i}`);
    assert.ok(Number.isNaN(logprobs[i]), `${label}: unused entry ${i}`);
  }
}

test('top logprobs are the raw top-N, descending, within tolerance of the fp64 log-softmax', async (t) => {
  const seed = freshSeed(t);
  const random = uniformSource(seed);
  const vocabSize = 96;
  using temp = makeTempDir('top-logprobs');
  const modelDir = writeCheckpoint(temp.dir, 'model', tinyShape(vocabSize, seed));
  await withModel(loadOptions(modelDir, { numKvBlocks: 64 }), async (model) => {
    const numSeqs = 24;
    const chunks = Array.from({ length: numSeqs }, (_, i): SeqChunk => ({
      tokenIds: randomTokens(3 + (i % 5), vocabSize, seed + i),
      startPosition: 0,
      blockIds: [i],
      // Every fourth sequence is not sampled: its row stays empty whatever it asks for.
      flags: i % 4 === 3 ? SEQ_RETURN_LOGITS : SEQ_SAMPLE | SEQ_RETURN_LOGITS,
      numTopLogprobs: i < 2 ? [0, MAX_TOP_LOGPROBS][i] : Math.floor(random() * (MAX_TOP_LOGPROBS + 1)),
      temperature: i % 2 === 0 ? 0 : 1,
      minP: 0.05,
      logitBias: [[i % vocabSize, 3]],
      seed: BigInt(seed + i),
    }));
    const result = await model.forward(buildBatch(chunks));
    chunks.forEach((chunk, seq) => {
      const label = `seed ${seed}, sequence ${seq}`;
      const logits = result.logits.subarray(seq * vocabSize, (seq + 1) * vocabSize);
      if (!(chunk.flags! & SEQ_SAMPLE)) {
        assertUnusedTail(result.topTokenIds, result.topLogprobs, seq, 0, label);
        return;
      }
      const n = chunk.numTopLogprobs!;
      assertTopRow(result.topTokenIds, result.topLogprobs, seq, logits, n, label);
      // The sampled logprob and a top logprob of the same token are one computation.
      const sampledAt = Array.from(result.topTokenIds.subarray(seq * MAX_TOP_LOGPROBS, seq * MAX_TOP_LOGPROBS + n)).indexOf(result.sampledTokenIds[seq]);
      if (sampledAt >= 0) assert.equal(result.topLogprobs[seq * MAX_TOP_LOGPROBS + sampledAt], result.sampledLogprobs[seq], label);
    });
  });
});

test('tied logits are listed and chosen by the lower id', async (t) => {
  const seed = freshSeed(t);
  const vocabSize = 64;
  const shape = tinyShape(vocabSize, seed);
  const prompt = randomTokens(6, vocabSize, seed);
  using temp = makeTempDir('tied-logprobs');
  const modelDir = writeCheckpoint(temp.dir, 'model', shape);
  const chunk: SeqChunk = { tokenIds: prompt, startPosition: 0, blockIds: [0], flags: SEQ_SAMPLE | SEQ_RETURN_LOGITS, numTopLogprobs: 5 };
  const before = await withModel(loadOptions(modelDir, { numKvBlocks: 4 }), (model) => model.forward(buildBatch([chunk])));
  // Two copies of the favourite's lm_head row: three identical top logits.
  const favourite = before.sampledTokenIds[0];
  const [lower, higher] = [(favourite + vocabSize - 7) % vocabSize, (favourite + 11) % vocabSize].sort((a, b) => a - b);
  duplicateLmHeadRow(modelDir, favourite, [lower, higher], shape.hiddenSize);
  await withModel(loadOptions(modelDir, { numKvBlocks: 4 }), async (model) => {
    const result = await model.forward(buildBatch([chunk]));
    const tied = [lower, favourite, higher].sort((a, b) => a - b);
    assert.deepEqual(Array.from(result.topTokenIds.subarray(0, 3)), tied, `seed ${seed}`);
    assert.equal(result.topLogprobs[0], result.topLogprobs[2], `seed ${seed}: tied logprobs are equal`);
    assert.equal(result.sampledTokenIds[0], tied[0], `seed ${seed}: greedy takes the lowest tied id`);
    assertTopRow(result.topTokenIds, result.topLogprobs, 0, result.logits, 5, `seed ${seed}`);
  });
});

/** The raw logits at every position of a prompt, fed one token per pass into blocks from firstBlock on. */
async function logitsAtEachPosition(model: NativeModel, prompt: readonly number[], firstBlock: number): Promise<Float32Array[]> {
  const blockIds = consecutiveBlocks(firstBlock, prompt.length, BLOCK_SIZE_TOKENS);
  const rows: Float32Array[] = [];
  for (let position = 0; position < prompt.length; position++) {
    const chunk: SeqChunk = { tokenIds: [prompt[position]], startPosition: position, blockIds, flags: SEQ_RETURN_LOGITS };
    // The model writes its next pass into the same arrays.
    rows.push((await model.forward(buildBatch([chunk]))).logits.slice());
  }
  return rows;
}

interface PromptCheck {
  prompt: readonly number[];
  reference: Float32Array[];
  numTop: number;
}

/** A flagged chunk of tokens [start, end) of a prompt at batch tokens from firstToken on, against the reference. */
function assertPromptChunk(result: ForwardResult, check: PromptCheck, start: number, end: number, firstToken: number, label: string): void {
  for (let position = start; position < end; position++) {
    const t = firstToken + position - start;
    const at = `${label}, position ${position}`;
    if (position + 1 === check.prompt.length) {
      assert.ok(Number.isNaN(result.promptLogprobs[t]), `${at}: nothing follows the last known token`);
      assert.equal(result.promptRanks[t], 0, `${at}: no rank without a next token`);
      if (result.promptTopTokenIds.length > 0) assertUnusedTail(result.promptTopTokenIds, result.promptTopLogprobs, t, 0, at);
      continue;
    }
    const logprobs = logSoftmax(check.reference[position]);
    assertClose(result.promptLogprobs[t], logprobs[check.prompt[position + 1]], at);
    assert.equal(result.promptRanks[t], idsByValue(check.reference[position]).indexOf(check.prompt[position + 1]) + 1, `${at}: rank`);
    if (check.numTop > 0) assertTopRow(result.promptTopTokenIds, result.promptTopLogprobs, t, check.reference[position], check.numTop, at);
    else if (result.promptTopTokenIds.length > 0) assertUnusedTail(result.promptTopTokenIds, result.promptTopLogprobs, t, 0, at);
  }
}

test('prompt logprobs over chunks linked by promptNextTokenIds match the position-by-position log-softmax', async (t) => {
  const seed = freshSeed(t);
  // 2^22 floats of logits per slab / 20 000 = 209 rows: the two flagged 230-token chunks take three slabs.
  const vocabSize = 20000;
  const promptTokens = 260;
  const chunkEnds = [230, promptTokens];
  using temp = makeTempDir('prompt-logprobs');
  const modelDir = writeCheckpoint(temp.dir, 'model', tinyShape(vocabSize, seed));
  const blocksPerPrompt = Math.ceil(promptTokens / BLOCK_SIZE_TOKENS);
  await withModel(loadOptions(modelDir, { numKvBlocks: 4 * blocksPerPrompt + 1, blockSizeTokens: BLOCK_SIZE_TOKENS }), async (model) => {
    const checks: PromptCheck[] = [];
    for (const [i, numTop] of [7, 0].entries()) {
      const prompt = randomTokens(promptTokens, vocabSize, seed + i);
      checks.push({ prompt, reference: await logitsAtEachPosition(model, prompt, i * blocksPerPrompt), numTop });
    }
    const other = randomTokens(promptTokens, vocabSize, seed + 2);
    let start = 0;
    for (const end of chunkEnds) {
      const flaggedChunk = (check: PromptCheck, i: number): SeqChunk => ({
        tokenIds: check.prompt.slice(start, end),
        startPosition: start,
        blockIds: consecutiveBlocks((2 + i) * blocksPerPrompt, promptTokens, BLOCK_SIZE_TOKENS),
        flags: SEQ_PROMPT_LOGPROBS | (end === promptTokens ? SEQ_SAMPLE : 0),
        numPromptTopLogprobs: check.numTop,
        promptNextTokenId: end < promptTokens ? check.prompt[end] : -1,
      });
      // An unflagged sequence between them reports nothing.
      const unflagged: SeqChunk = { tokenIds: other.slice(0, 5), startPosition: 0, blockIds: [4 * blocksPerPrompt], flags: SEQ_SAMPLE };
      const result = await model.forward(buildBatch([flaggedChunk(checks[0], 0), unflagged, flaggedChunk(checks[1], 1)]));
      const chunkTokens = end - start;
      assert.equal(result.promptLogprobs.length, 2 * chunkTokens + 5, `seed ${seed}`);
      assert.equal(result.promptTopTokenIds.length, (2 * chunkTokens + 5) * MAX_TOP_LOGPROBS, `seed ${seed}`);
      assertPromptChunk(result, checks[0], start, end, 0, `seed ${seed}, prompt 0`);
      for (let t = chunkTokens; t < chunkTokens + 5; t++) assert.ok(Number.isNaN(result.promptLogprobs[t]), `seed ${seed}: unflagged token ${t}`);
      assertUnusedTail(result.promptTopTokenIds, result.promptTopLogprobs, chunkTokens, 0, `seed ${seed}, unflagged`);
      assertPromptChunk(result, checks[1], start, end, chunkTokens + 5, `seed ${seed}, prompt 1`);
      start = end;
    }
  });
});

test('prompt logprob outputs are empty unless a sequence asks for them', async (t) => {
  const seed = freshSeed(t);
  using temp = makeTempDir('prompt-logprobs-empty');
  const modelDir = writeCheckpoint(temp.dir, 'model', tinyShape(32, seed));
  await withModel(loadOptions(modelDir, { numKvBlocks: 4 }), async (model) => {
    const chunk: SeqChunk = { tokenIds: [1, 2, 3], startPosition: 0, blockIds: [0], flags: SEQ_SAMPLE };
    const plain = await model.forward(buildBatch([chunk]));
    assert.equal(plain.promptLogprobs.length, 0);
    assert.equal(plain.promptTopTokenIds.length, 0);
    assert.equal(plain.promptRanks.length, 0);
    const withoutAlternatives = await model.forward(buildBatch([{ ...chunk, flags: SEQ_SAMPLE | SEQ_PROMPT_LOGPROBS }]));
    assert.equal(withoutAlternatives.promptLogprobs.length, 3);
    assert.equal(withoutAlternatives.promptTopLogprobs.length, 0);
    assert.deepEqual(Array.from(withoutAlternatives.promptLogprobs, Number.isNaN), [false, false, true]);
    assert.equal(withoutAlternatives.promptRanks[2], 0);
    assert.ok(withoutAlternatives.promptRanks[0] >= 1 && withoutAlternatives.promptRanks[1] >= 1);
  });
});
