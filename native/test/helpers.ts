// Shared by the native runtime's tests: random checkpoints in temporary directories, and
// ForwardBatch building from per-sequence pieces.
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { DEFAULT_OPTIONS, writeRandomCheckpoint, type CheckpointOptions } from '../../tools/make-checkpoint.ts';
import { testSeed } from '../../test/seed.ts';
import type { ForwardBatch, LoadOptions, NativeModel, WeightDtype } from '../api.ts';
import { SEQ_RETURN_LOGITS, SEQ_SAMPLE } from '../api.ts';
import { kernelSupported, loadModel } from '../index.ts';
import { KERNEL_NAMES, cpuFlagsOf, kernelPathsOf, type KernelName } from './kernel-coverage.ts';

export type ShapeOptions = Omit<CheckpointOptions, 'outDir' | keyof typeof DEFAULT_OPTIONS> & Partial<CheckpointOptions>;

/**
 * Every kernel path, whether this CPU runs it or not: tests loop over all three and pass
 * kernelSkip(kernel) as their skip option, so a path the CPU lacks shows as skipped.
 */
export const KERNELS: readonly KernelName[] = KERNEL_NAMES;

/** False where this CPU runs the path; otherwise why not, for a skipped test. */
export function kernelSkip(kernel: KernelName): false | string {
  if (kernelSupported(kernel)) return false;
  const missing = existsSync('/proc/cpuinfo') ? kernelPathsOf(cpuFlagsOf(readFileSync('/proc/cpuinfo', 'utf8'))).missingFlags[kernel] : undefined;
  return `this CPU cannot run the ${kernel} kernels${missing?.length ? ` (it lacks ${missing.join(', ')})` : ''}`;
}

/**
 * How far a position's logits may sit from the fp64 reference's, as max|logit − ref| / max|ref|
 * (numerics.test.ts, family-numerics.test.ts): 1e-5 for fp32 weights, 2e-2 for bf16 and fp16
 * where the activations stay fp32 (avx2 and scalar widen the weights). On avx512 and amx, bf16
 * weights meet activations rounded to bf16 as well (vdpbf16ps, TDPBF16PS): a second rounding of
 * the same size, about twice the error. Measured on avx512 (2026-12-07; numerics' 6 shapes over
 * 100 seeds and family-numerics' 11 cases over 54, 1,194 draws): median 8.5e-3, 99th percentile
 * 1.7e-2, 6 draws past 2e-2 (so at 2e-2 a run's 17 such draws failed about one run in twelve) and
 * the largest 2.91e-2 (phi4-mini's 40-token case, seed 1618263119; that case's median is 1.2e-2),
 * then 2.28e-2 (numerics' 5-head llama, seed 2123059754). 5e-2 is 1.7x the largest seen. avx2
 * and scalar on the same draws: median 4.2e-3, largest 1.03e-2. A rope scale 10% off costs
 * 0.2-0.39 (numerics' plain-rope shapes, every seed tried); fp32 weights' 1e-5 catches far
 * smaller slips.
 */
export function logitTolerance(dtype: WeightDtype, kernel: KernelName): number {
  if (dtype === 'fp32') return 1e-5;
  return dtype === 'bf16' && (kernel === 'avx512' || kernel === 'amx') ? 5e-2 : 2e-2;
}

/** A fresh seed per run, or CONDUIT_TEST_SEED's; reported on t, so a run can be replayed. */
export { testSeed as freshSeed };

export function makeTempDir(prefix: string): { dir: string; [Symbol.dispose](): void } {
  const dir = mkdtempSync(path.join(os.tmpdir(), `conduit-native-${prefix}-`));
  return { dir, [Symbol.dispose]: () => rmSync(dir, { recursive: true, force: true }) };
}

/** Writes a random checkpoint under parentDir/name and returns its directory. */
export function writeCheckpoint(parentDir: string, name: string, shape: ShapeOptions): string {
  const outDir = path.join(parentDir, name);
  writeRandomCheckpoint({ ...DEFAULT_OPTIONS, ...shape, outDir });
  return outDir;
}

export function loadOptions(modelDir: string, overrides: Partial<LoadOptions> = {}): LoadOptions {
  return {
    modelDir,
    dtype: 'auto',
    kvCacheDtype: 'auto',
    numKvBlocks: 64,
    blockSizeTokens: 16,
    numThreads: 2,
    kernel: 'auto',
    ...overrides,
  };
}

export async function withModel<T>(options: LoadOptions, fn: (model: NativeModel) => Promise<T>): Promise<T> {
  const model = await loadModel(options);
  try {
    return await fn(model);
  } finally {
    model.close();
  }
}

/** One distinct token of a sequence's history, as the penalties see it. */
export interface PenaltyEntry {
  tokenId: number;
  outputCount: number;
  inPrompt: boolean;
}

/** One sequence's share of a step: its next tokens from startPosition on, and its block table. */
export interface SeqChunk {
  tokenIds: readonly number[];
  startPosition: number;
  blockIds: readonly number[];
  /** Per KV-cache group, its block table; blockIds for every group when absent. */
  groupBlockIds?: ReadonlyArray<readonly number[]>;
  flags?: number;
  temperature?: number;
  topP?: number;
  topK?: number;
  seed?: bigint;
  outputIndex?: number;
  minP?: number;
  presencePenalty?: number;
  frequencyPenalty?: number;
  repetitionPenalty?: number;
  penaltyHistory?: readonly PenaltyEntry[];
  /** [tokenId, value] pairs added to the logits. */
  logitBias?: ReadonlyArray<readonly [number, number]>;
  numTopLogprobs?: number;
  numPromptTopLogprobs?: number;
  promptNextTokenId?: number;
  /** A structured output's mask: the only tokens the sample may be (null or absent: unconstrained). */
  allowedTokenIds?: readonly number[] | null;
}

/** The packed bitmask row (ForwardBatch.tokenBitmask) that allows exactly allowedTokenIds. */
export function bitmaskRow(allowedTokenIds: readonly number[], vocabSize: number): Int32Array {
  const row = new Int32Array(Math.ceil(vocabSize / 32));
  for (const id of allowedTokenIds) row[id >> 5] |= 1 << (id & 31);
  return row;
}

/** The penalty history of a sequence: one entry per distinct token of its prompt and output, in first-seen order. */
export function penaltyHistory(promptTokenIds: readonly number[], outputTokenIds: readonly number[]): PenaltyEntry[] {
  const entries = new Map<number, PenaltyEntry>();
  const entryOf = (tokenId: number): PenaltyEntry => {
    let entry = entries.get(tokenId);
    if (entry === undefined) entries.set(tokenId, (entry = { tokenId, outputCount: 0, inPrompt: false }));
    return entry;
  };
  for (const tokenId of promptTokenIds) entryOf(tokenId).inPrompt = true;
  for (const tokenId of outputTokenIds) entryOf(tokenId).outputCount++;
  return [...entries.values()];
}

/**
 * A batch of chunks. numKvGroups: how many block tables it holds (ModelInfo.kvCacheGroups.length);
 * vocabSize: needed only when a chunk has allowedTokenIds.
 */
export function buildBatch(chunks: readonly SeqChunk[], { numKvGroups = 1, vocabSize }: { numKvGroups?: number; vocabSize?: number } = {}): ForwardBatch {
  const numSeqs = chunks.length;
  const numTokens = chunks.reduce((sum, c) => sum + c.tokenIds.length, 0);
  const tableOf = (chunk: SeqChunk, group: number) => chunk.groupBlockIds?.[group] ?? chunk.blockIds;
  const maxBlocksPerSeq = Math.max(1, ...chunks.flatMap((c) => Array.from({ length: numKvGroups }, (_, g) => tableOf(c, g).length)));
  const numPenaltyEntries = chunks.reduce((sum, c) => sum + (c.penaltyHistory?.length ?? 0), 0);
  const numBiasEntries = chunks.reduce((sum, c) => sum + (c.logitBias?.length ?? 0), 0);
  const batch: ForwardBatch = {
    numSeqs,
    numTokens,
    tokenIds: new Int32Array(numTokens),
    positions: new Int32Array(numTokens),
    queryStarts: new Int32Array(numSeqs + 1),
    maxBlocksPerSeq,
    blockTables: new Int32Array(numKvGroups * numSeqs * maxBlocksPerSeq).fill(-1),
    seqFlags: new Uint8Array(numSeqs),
    temperatures: new Float32Array(numSeqs),
    topPs: new Float32Array(numSeqs),
    topKs: new Int32Array(numSeqs),
    seeds: new BigUint64Array(numSeqs),
    outputIndices: new Int32Array(numSeqs),
    minPs: new Float32Array(numSeqs),
    presencePenalties: new Float32Array(numSeqs),
    frequencyPenalties: new Float32Array(numSeqs),
    repetitionPenalties: new Float32Array(numSeqs),
    penaltyStarts: new Int32Array(numSeqs + 1),
    penaltyTokenIds: new Int32Array(numPenaltyEntries),
    penaltyOutputCounts: new Int32Array(numPenaltyEntries),
    penaltyInPrompt: new Uint8Array(numPenaltyEntries),
    biasStarts: new Int32Array(numSeqs + 1),
    biasTokenIds: new Int32Array(numBiasEntries),
    biasValues: new Float32Array(numBiasEntries),
    numTopLogprobs: new Int32Array(numSeqs),
    numPromptTopLogprobs: new Int32Array(numSeqs),
    promptNextTokenIds: new Int32Array(numSeqs),
  };
  let t = 0;
  chunks.forEach((chunk, seq) => {
    batch.queryStarts[seq] = t;
    chunk.tokenIds.forEach((tokenId, i) => {
      batch.tokenIds[t] = tokenId;
      batch.positions[t] = chunk.startPosition + i;
      t++;
    });
    for (let group = 0; group < numKvGroups; group++) batch.blockTables.set(tableOf(chunk, group), (group * numSeqs + seq) * maxBlocksPerSeq);
    batch.seqFlags[seq] = chunk.flags ?? SEQ_SAMPLE | SEQ_RETURN_LOGITS;
    batch.temperatures[seq] = chunk.temperature ?? 0;
    batch.topPs[seq] = chunk.topP ?? 1;
    batch.topKs[seq] = chunk.topK ?? 0;
    batch.seeds[seq] = chunk.seed ?? 0n;
    batch.outputIndices[seq] = chunk.outputIndex ?? 0;
    batch.minPs[seq] = chunk.minP ?? 0;
    batch.presencePenalties[seq] = chunk.presencePenalty ?? 0;
    batch.frequencyPenalties[seq] = chunk.frequencyPenalty ?? 0;
    batch.repetitionPenalties[seq] = chunk.repetitionPenalty ?? 1;
    batch.numTopLogprobs[seq] = chunk.numTopLogprobs ?? 0;
    batch.numPromptTopLogprobs[seq] = chunk.numPromptTopLogprobs ?? 0;
    batch.promptNextTokenIds[seq] = chunk.promptNextTokenId ?? -1;
    fillPenaltyRange(batch, seq, chunk.penaltyHistory ?? []);
    fillBiasRange(batch, seq, chunk.logitBias ?? []);
  });
  batch.queryStarts[numSeqs] = t;
  fillBitmasks(batch, chunks, vocabSize);
  return batch;
}

/** One bitmask row per constrained chunk, in batch order; no bitmask fields when none is. */
function fillBitmasks(batch: ForwardBatch, chunks: readonly SeqChunk[], vocabSize: number | undefined): void {
  const masked = chunks.filter((chunk) => chunk.allowedTokenIds != null);
  if (masked.length === 0) return;
  if (vocabSize === undefined) throw new Error('buildBatch: allowedTokenIds need the vocabulary size');
  const words = Math.ceil(vocabSize / 32);
  batch.bitmaskWords = words;
  batch.bitmaskRows = new Int32Array(chunks.length).fill(-1);
  batch.tokenBitmask = new Int32Array(masked.length * words);
  let row = 0;
  chunks.forEach((chunk, seq) => {
    if (chunk.allowedTokenIds == null) return;
    batch.tokenBitmask!.set(bitmaskRow(chunk.allowedTokenIds, vocabSize), row * words);
    batch.bitmaskRows![seq] = row++;
  });
}

function fillPenaltyRange(batch: ForwardBatch, seq: number, entries: readonly PenaltyEntry[]): void {
  const begin = batch.penaltyStarts[seq];
  entries.forEach((entry, i) => {
    batch.penaltyTokenIds[begin + i] = entry.tokenId;
    batch.penaltyOutputCounts[begin + i] = entry.outputCount;
    batch.penaltyInPrompt[begin + i] = entry.inPrompt ? 1 : 0;
  });
  batch.penaltyStarts[seq + 1] = begin + entries.length;
}

function fillBiasRange(batch: ForwardBatch, seq: number, bias: ReadonlyArray<readonly [number, number]>): void {
  const begin = batch.biasStarts[seq];
  bias.forEach(([tokenId, value], i) => {
    batch.biasTokenIds[begin + i] = tokenId;
    batch.biasValues[begin + i] = value;
  });
  batch.biasStarts[seq + 1] = begin + bias.length;
}

/** A deterministic uniform source in [0, 1): the load generator's seeded generator, one copy. */
export { createRng as uniformSource } from '../../loadtest/random.ts';

/** Deterministic pseudo-random token ids in [0, vocabSize). */
export function randomTokens(count: number, vocabSize: number, seed: number): number[] {
  let state = seed >>> 0 || 1;
  return Array.from({ length: count }, () => {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    return (state >>> 0) % vocabSize;
  });
}

/** Block ids firstBlock, firstBlock + 1, ... enough to hold numPositions. */
export function consecutiveBlocks(firstBlock: number, numPositions: number, blockSizeTokens: number): number[] {
  return Array.from({ length: Math.ceil(numPositions / blockSizeTokens) }, (_, i) => firstBlock + i);
}

/** Per KV-cache group, consecutive blocks of its own: group g's start at firstBlock + g * (blocks per group). */
export function groupConsecutiveBlocks(numGroups: number, firstBlock: number, numPositions: number, blockSizeTokens: number): number[][] {
  const perGroup = Math.ceil(numPositions / blockSizeTokens);
  return Array.from({ length: numGroups }, (_, g) => consecutiveBlocks(firstBlock + g * perGroup, numPositions, blockSizeTokens));
}
