// The machinery of the batch-invariance tests: a miniature engine loop that runs a target
// sequence alone, chunked or among companions, and compares what it reports bit for bit.
import assert from 'node:assert/strict';
import type { ForwardBatch, ForwardResult, NativeModel } from '../api.ts';
import { MAX_TOP_LOGPROBS, SEQ_PROMPT_LOGPROBS, SEQ_RETURN_LOGITS, SEQ_SAMPLE } from '../api.ts';
import { buildBatch, consecutiveBlocks, penaltyHistory, randomTokens, type SeqChunk } from './helpers.ts';

export const BLOCK_SIZE_TOKENS = 16;
export const TARGET_PROMPT_TOKENS = 80;
const NUM_DECODE_STEPS = 4;
export const NUM_COMPANIONS = 15;
const MAX_POSITIONS = TARGET_PROMPT_TOKENS + NUM_DECODE_STEPS + 1;
export const MAX_BLOCKS_PER_SEQ = Math.ceil(MAX_POSITIONS / BLOCK_SIZE_TOKENS);
/** Blocks of one KV-cache group: room for the target and every companion; group g's come after group g - 1's. */
export const BLOCKS_PER_GROUP = (NUM_COMPANIONS + 2) * MAX_BLOCKS_PER_SEQ;
/** Where a target among companions starts its blocks: past every companion's (companions start at block 0). */
export const FIRST_BLOCK_AFTER_COMPANIONS = (NUM_COMPANIONS + 1) * MAX_BLOCKS_PER_SEQ;
// The reference runs on 2 threads; these others must match it bit for bit.
export const OTHER_THREAD_COUNTS = [1, 3, 8];

/** A sequence's fixed settings; its penalty history follows from its tokens at each step. */
export type Sampling = Omit<SeqChunk, 'tokenIds' | 'startPosition' | 'blockIds' | 'groupBlockIds' | 'flags' | 'outputIndex' | 'penaltyHistory' | 'promptNextTokenId' | 'allowedTokenIds'> & {
  penalized?: boolean;
  promptLogprobs?: boolean;
  /** A grammar's mask, as a salt: the allowed tokens follow from it and the output index, like a grammar's state. */
  maskSalt?: number;
};

/** About 2 in 5 tokens of the vocabulary, a different set at each output index. */
function grammarMask(salt: number, outputIndex: number, vocabSize: number): number[] {
  return Array.from({ length: vocabSize }, (_, id) => id).filter((id) => (Math.imul(id + salt, 2654435761) + outputIndex * 97) % 5 < 2 && id % 5 !== outputIndex % 5);
}

export interface Sequence {
  tokenIds: number[];
  numPromptTokens: number;
  numComputedTokens: number;
  numOutputTokens: number;
  chunkTokens: number;
  /** Per KV-cache group. */
  groupBlockIds: number[][];
  sampling: Sampling;
}

export interface Trace {
  logits: Float32Array[];
  tokenIds: number[];
  topTokenIds: Int32Array[];
  topLogprobs: Float32Array[];
  /** By position: what each position reported, NaN / -1 where nothing. */
  promptLogprobs: Float32Array;
  promptTopTokenIds: Int32Array;
  promptTopLogprobs: Float32Array;
}

export function makeSequence(promptTokenIds: number[], chunkTokens: number, firstBlock: number, sampling: Sampling, numKvGroups = 1): Sequence {
  const groupBlockIds = Array.from({ length: numKvGroups }, (_, g) =>
    consecutiveBlocks(g * BLOCKS_PER_GROUP + firstBlock, MAX_BLOCKS_PER_SEQ * BLOCK_SIZE_TOKENS, BLOCK_SIZE_TOKENS),
  );
  return { tokenIds: [...promptTokenIds], numPromptTokens: promptTokenIds.length, numComputedTokens: 0, numOutputTokens: 0, chunkTokens, groupBlockIds, sampling };
}

function emptyTrace(): Trace {
  return {
    logits: [],
    tokenIds: [],
    topTokenIds: [],
    topLogprobs: [],
    promptLogprobs: new Float32Array(MAX_POSITIONS).fill(NaN),
    promptTopTokenIds: new Int32Array(MAX_POSITIONS * MAX_TOP_LOGPROBS).fill(-1),
    promptTopLogprobs: new Float32Array(MAX_POSITIONS * MAX_TOP_LOGPROBS).fill(NaN),
  };
}

/** The next chunk of a sequence: flags, penalty history and the link to the token after it follow from its state. */
function nextChunk(seq: Sequence, isTarget: boolean, vocabSize: number): SeqChunk {
  const end = Math.min(seq.numComputedTokens + seq.chunkTokens, seq.tokenIds.length);
  const completes = end === seq.tokenIds.length;
  const { penalized, promptLogprobs, maskSalt, ...sampling } = seq.sampling;
  const sampleFlags = completes ? SEQ_SAMPLE | (isTarget ? SEQ_RETURN_LOGITS : 0) : 0;
  return {
    ...sampling,
    allowedTokenIds: maskSalt === undefined || !completes ? null : grammarMask(maskSalt, seq.numOutputTokens, vocabSize),
    tokenIds: seq.tokenIds.slice(seq.numComputedTokens, end),
    startPosition: seq.numComputedTokens,
    blockIds: seq.groupBlockIds[0],
    groupBlockIds: seq.groupBlockIds,
    flags: sampleFlags | (promptLogprobs ? SEQ_PROMPT_LOGPROBS : 0),
    outputIndex: seq.numOutputTokens,
    penaltyHistory: penalized ? penaltyHistory(seq.tokenIds.slice(0, seq.numPromptTokens), seq.tokenIds.slice(seq.numPromptTokens)) : [],
    promptNextTokenId: completes ? -1 : seq.tokenIds[end],
  };
}

/** The target's prompt logprobs of this step, filed by position. */
function recordPromptLogprobs(trace: Trace, result: ForwardResult, batch: ForwardBatch, seqIndex: number, chunk: SeqChunk): void {
  if (result.promptLogprobs.length === 0) return;
  const firstToken = batch.queryStarts[seqIndex];
  chunk.tokenIds.forEach((_, i) => {
    const t = firstToken + i;
    const position = chunk.startPosition + i;
    trace.promptLogprobs[position] = result.promptLogprobs[t];
    if (result.promptTopTokenIds.length === 0) return;
    const row = (from: number) => [from * MAX_TOP_LOGPROBS, (from + 1) * MAX_TOP_LOGPROBS] as const;
    trace.promptTopTokenIds.set(result.promptTopTokenIds.subarray(...row(t)), row(position)[0]);
    trace.promptTopLogprobs.set(result.promptTopLogprobs.subarray(...row(t)), row(position)[0]);
  });
}

/**
 * A miniature engine loop: every step each sequence computes its next chunk (or its one decode
 * token); a sequence whose chunk reaches its last token samples and, for the target, returns
 * logits. Runs until the target has sampled NUM_DECODE_STEPS + 1 tokens. activeThreadsOf(step),
 * when given, is set with model.setActiveThreads before each pass; midPassThreads(), when given,
 * again and again while each pass runs on the native threads. The count is all threads again
 * when it returns.
 */
export async function runTarget(model: NativeModel, target: Sequence, companions: Sequence[], targetIndex: number,
  activeThreadsOf?: (step: number) => number, midPassThreads?: () => number): Promise<Trace> {
  const sequences = [...companions];
  sequences.splice(targetIndex, 0, target);
  const trace = emptyTrace();
  const vocabSize = model.info.vocabSize;
  for (let step = 0; target.numOutputTokens <= NUM_DECODE_STEPS; step++) {
    const chunks = sequences.map((seq) => nextChunk(seq, seq === target, vocabSize));
    const batch = buildBatch(chunks, { numKvGroups: model.info.kvCacheGroups.length, vocabSize });
    if (activeThreadsOf !== undefined) model.setActiveThreads(activeThreadsOf(step));
    const pass = model.forward(batch);
    if (midPassThreads !== undefined) changeThreadsDuring(model, midPassThreads);
    const result = await pass;
    recordPromptLogprobs(trace, result, batch, targetIndex, chunks[targetIndex]);
    sequences.forEach((seq, i) => {
      seq.numComputedTokens += chunks[i].tokenIds.length;
      if (!(chunks[i].flags! & SEQ_SAMPLE)) return;
      const tokenId = result.sampledTokenIds[i];
      seq.tokenIds.push(tokenId);
      seq.numOutputTokens++;
      if (seq !== target) return;
      // The target is the only sequence returning logits.
      trace.logits.push(result.logits.slice(0, vocabSize));
      trace.tokenIds.push(tokenId);
      trace.topTokenIds.push(result.topTokenIds.slice(i * MAX_TOP_LOGPROBS, (i + 1) * MAX_TOP_LOGPROBS));
      trace.topLogprobs.push(result.topLogprobs.slice(i * MAX_TOP_LOGPROBS, (i + 1) * MAX_TOP_LOGPROBS));
    });
  }
  model.setActiveThreads(0);
  return trace;
}

// The event loop cannot run while this thread changes the count, so it changes it for a fixed
// time, about what a pass of these models takes, pausing between changes as grammar threads'
// compiles starting and ending would (each a store into the model's cell, from any thread).
const MID_PASS_CHANGE_MS = 4;
const sleeper = new Int32Array(new SharedArrayBuffer(4));

function changeThreadsDuring(model: NativeModel, numThreadsOf: () => number): void {
  const untilMs = performance.now() + MID_PASS_CHANGE_MS;
  while (performance.now() < untilMs) {
    model.setActiveThreads(numThreadsOf());
    Atomics.wait(sleeper, 0, 0, 0.05);
  }
  model.setActiveThreads(0);
}

/** The reference reports what the settings ask for, so the comparisons are not of empty rows. */
export function assertReported(trace: Trace, sampling: Sampling, vocabSize: number, label: string): void {
  const numTop = sampling.numTopLogprobs ?? 0;
  for (const row of trace.topTokenIds) assert.equal(row.findIndex((id) => id < 0), numTop === MAX_TOP_LOGPROBS ? -1 : numTop, label);
  const numReported = trace.promptLogprobs.filter((logprob) => !Number.isNaN(logprob)).length;
  assert.equal(numReported, sampling.promptLogprobs ? TARGET_PROMPT_TOKENS - 1 : 0, `${label}: prompt logprobs reported`);
  const { maskSalt } = sampling;
  if (maskSalt !== undefined) {
    trace.tokenIds.forEach((tokenId, i) => assert.ok(grammarMask(maskSalt, i, vocabSize).includes(tokenId), `${label}: output ${i} is outside its mask`));
  }
}

function sameBits(a: ArrayBufferView, b: ArrayBufferView): boolean {
  return Buffer.compare(Buffer.from(a.buffer, a.byteOffset, a.byteLength), Buffer.from(b.buffer, b.byteOffset, b.byteLength)) === 0;
}

export function assertBitwiseEqual(actual: Trace, expected: Trace, label: string): void {
  assert.deepEqual(actual.tokenIds, expected.tokenIds, `${label}: sampled tokens differ`);
  assert.equal(actual.logits.length, expected.logits.length, label);
  actual.logits.forEach((row, step) => {
    assert.ok(sameBits(row, expected.logits[step]), `${label}: logits of output ${step} are not bitwise identical`);
    assert.ok(sameBits(actual.topTokenIds[step], expected.topTokenIds[step]), `${label}: top ids of output ${step} differ`);
    assert.ok(sameBits(actual.topLogprobs[step], expected.topLogprobs[step]), `${label}: top logprobs of output ${step} differ`);
  });
  assert.ok(sameBits(actual.promptLogprobs, expected.promptLogprobs), `${label}: prompt logprobs differ`);
  assert.ok(sameBits(actual.promptTopTokenIds, expected.promptTopTokenIds), `${label}: prompt top ids differ`);
  assert.ok(sameBits(actual.promptTopLogprobs, expected.promptTopLogprobs), `${label}: prompt top logprobs differ`);
}

/** The target's settings: the plain sampler, and every extension at once. */
export function targetSettings(seed: number, prompt: readonly number[]): Record<string, Sampling> {
  const plain: Sampling = { temperature: 0.9, topP: 0.95, topK: 0, seed: BigInt(seed) };
  return {
    'plain sampling': plain,
    'min-p, penalties, bias and logprobs': {
      ...plain,
      minP: 0.02,
      penalized: true,
      repetitionPenalty: 1.3,
      frequencyPenalty: 0.4,
      presencePenalty: 0.3,
      // A random prompt may repeat a token; a bias lists each token once.
      logitBias: [...new Set([prompt[0], prompt[1], (prompt[2] + 1) % 300])].map((tokenId, i): [number, number] => [tokenId, [-Infinity, 2, -1.5][i]]),
      numTopLogprobs: 7,
      promptLogprobs: true,
      numPromptTopLogprobs: 4,
    },
    'a grammar bitmask with penalties and logprobs': { ...plain, maskSalt: seed % 1000, penalized: true, repetitionPenalty: 1.2, numTopLogprobs: 5 },
  };
}

/**
 * NUM_COMPANIONS fresh sequences (runTarget advances them, so build new ones per run): random
 * prompts of 1 to 40 tokens in chunks of 1 to 6, with companionSettings, in consecutive block ranges.
 */
export function makeCompanions(seed: number, vocabSize: number, numKvGroups = 1, firstBlock = 0): Sequence[] {
  return Array.from({ length: NUM_COMPANIONS }, (_, i) =>
    makeSequence(randomTokens(1 + ((seed + i * 7) % 40), vocabSize, seed + i + 1), 1 + (i % 6), firstBlock + i * MAX_BLOCKS_PER_SEQ, companionSettings(i), numKvGroups),
  );
}

/** Companions mixing settings unlike the target's: greedy and drawn, penalized or not, bans, logprobs. */
export function companionSettings(i: number): Sampling {
  return {
    temperature: i % 2 === 0 ? 0 : 0.7,
    topK: i % 3 === 0 ? 5 : 0,
    seed: BigInt(i),
    minP: i % 4 === 1 ? 0.1 : 0,
    penalized: i % 3 === 1 || i % 5 === 2,
    repetitionPenalty: i % 3 === 1 ? 0.8 : 1,
    frequencyPenalty: i % 5 === 2 ? -1 : 0,
    presencePenalty: i % 3 === 1 ? 1.5 : 0,
    logitBias: i % 4 === 2 ? [[i, -Infinity], [i + 100, 5]] : [],
    numTopLogprobs: (i % 7) * 3,
    promptLogprobs: i % 4 === 0,
    numPromptTopLogprobs: i % 8,
    maskSalt: i % 3 === 2 ? i : undefined,
  };
}

