// The model runner over the native runtime: lays a SchedulerOutput out as a ForwardBatch.
// The batch's fixed-shape arrays are sized once for the largest step the scheduler can produce
// (maxNumSeqs sequences, maxNumBatchedTokens tokens) and refilled in place every step; the
// penalty and bias entries, whose count varies, live in arrays that only grow.
import type { ForwardBatch, NativeModel } from '../native/api.ts';
import { MAX_TOP_LOGPROBS, SEQ_PROMPT_LOGPROBS, SEQ_SAMPLE, emptyForwardBatch, sampleStrideOf } from '../native/api.ts';
import type { StepBitmasks } from './grammar/service.ts';
import type { ModelRunner, RunnerInfo } from './runner.ts';
import { TOP_LOGPROBS_STRIDE, type RunnerResult, type ScheduledSequence, type SchedulerOutput } from './scheduler-output.ts';

export interface NativeRunnerLimits {
  maxModelLen: number;
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
}

const NO_BIAS = -1;

export class NativeRunner implements ModelRunner {
  readonly info: RunnerInfo;
  private readonly model: NativeModel;
  private readonly batch: ForwardBatch;
  private readonly numKvGroups: number;
  /** biasSlots[tokenId]: a sequence's bias entry for the token while its entries are written, else NO_BIAS. */
  private readonly biasSlots: Int32Array;
  /** [maxNumSeqs]: each sequence's proposals this step; handed to the batch only in steps that have some. */
  private readonly numDraftTokens: Int32Array;

  constructor(model: NativeModel, limits: NativeRunnerLimits) {
    if (MAX_TOP_LOGPROBS !== TOP_LOGPROBS_STRIDE) {
      throw new Error(`native top-logprob rows are ${MAX_TOP_LOGPROBS} wide; the engine's are ${TOP_LOGPROBS_STRIDE}`);
    }
    const { numKvBlocks, blockSizeTokens, vocabSize, kvCacheGroups } = model.info;
    const { maxModelLen, maxNumSeqs, maxNumBatchedTokens } = limits;
    this.model = model;
    this.numKvGroups = kvCacheGroups.length;
    this.info = { numKvBlocks, blockSizeTokens, kvCacheGroups, vocabSize, maxModelLen, numComputeThreads: model.info.numThreads };
    this.biasSlots = new Int32Array(vocabSize).fill(NO_BIAS);
    this.numDraftTokens = new Int32Array(maxNumSeqs);
    const maxBlocksPerSeq = Math.ceil(maxModelLen / blockSizeTokens);
    this.batch = emptyForwardBatch(maxNumSeqs, maxNumBatchedTokens, this.numKvGroups * maxNumSeqs * maxBlocksPerSeq);
  }

  execute(output: SchedulerOutput, bitmasks: StepBitmasks | null = null): Promise<RunnerResult> {
    this.fill(output);
    const { batch } = this;
    batch.bitmaskRows = bitmasks?.bitmaskRows ?? null;
    batch.tokenBitmask = bitmasks?.tokenBitmask ?? null;
    batch.bitmaskWords = bitmasks?.bitmaskWords;
    batch.bitmaskReady = bitmasks?.bitmaskReady ?? null;
    batch.bitmaskReadyTarget = bitmasks?.bitmaskReadyTarget;
    const sampleStride = sampleStrideOf(batch);
    return this.model.forward(batch).then((result) => Object.assign(result, { sampleStride }));
  }

  get activeThreadsCell(): Int32Array | undefined {
    return this.model.activeThreadsCell;
  }

  close(): void {
    this.model.close();
  }

  private fill(output: SchedulerOutput): void {
    const { batch } = this;
    const { scheduled } = output;
    // Rows as wide as this step's longest block table, not maxModelLen's: less to fill and read.
    let maxBlocksPerSeq = 0;
    for (const entry of scheduled) for (const table of entry.blockTables) maxBlocksPerSeq = Math.max(maxBlocksPerSeq, table.length);
    batch.numSeqs = scheduled.length;
    batch.numTokens = output.numScheduledTokens;
    batch.maxBlocksPerSeq = maxBlocksPerSeq;
    batch.blockTables.fill(-1, 0, this.numKvGroups * scheduled.length * maxBlocksPerSeq);

    let tokenIndex = 0;
    let speculates = false;
    let numPenaltyEntries = 0;
    let numBiasEntries = 0;
    for (let seq = 0; seq < scheduled.length; seq++) {
      const entry = scheduled[seq];
      batch.queryStarts[seq] = tokenIndex;
      const drafts = entry.draftTokenIds;
      const end = entry.startPosition + entry.numScheduledTokens - drafts.length;
      for (let position = entry.startPosition; position < end; position++, tokenIndex++) {
        batch.tokenIds[tokenIndex] = entry.tokenIds[position];
        batch.positions[tokenIndex] = position;
      }
      // Proposals follow the known tokens, at the positions they would take if accepted.
      for (let draft = 0; draft < drafts.length; draft++, tokenIndex++) {
        batch.tokenIds[tokenIndex] = drafts[draft];
        batch.positions[tokenIndex] = end + draft;
      }
      this.numDraftTokens[seq] = drafts.length;
      speculates ||= drafts.length > 0;
      // Group g's tables follow group g - 1's: [group][seq][block].
      for (let group = 0; group < this.numKvGroups; group++) {
        const table = entry.blockTables[group];
        batch.blockTables.set(table, (group * scheduled.length + seq) * maxBlocksPerSeq);
      }
      const { sampling } = entry;
      batch.seqFlags[seq] = (entry.sample ? SEQ_SAMPLE : 0) | (entry.scoresPrompt ? SEQ_PROMPT_LOGPROBS : 0);
      batch.temperatures[seq] = sampling.temperature;
      batch.topPs[seq] = sampling.topP;
      batch.topKs[seq] = sampling.topK;
      batch.seeds[seq] = sampling.seed;
      batch.outputIndices[seq] = entry.numOutputTokens;
      batch.minPs[seq] = sampling.minP;
      batch.presencePenalties[seq] = sampling.presencePenalty;
      batch.frequencyPenalties[seq] = sampling.frequencyPenalty;
      batch.repetitionPenalties[seq] = sampling.repetitionPenalty;
      batch.numTopLogprobs[seq] = entry.sample ? sampling.numTopLogprobs : 0;
      batch.numPromptTopLogprobs[seq] = entry.scoresPrompt ? sampling.numPromptLogprobs! : 0;
      batch.promptNextTokenIds[seq] = entry.scoresPrompt && end < entry.tokenIds.length ? entry.tokenIds[end] : -1;
      // Penalties and bias only shape a sample.
      batch.penaltyStarts[seq] = numPenaltyEntries;
      batch.biasStarts[seq] = numBiasEntries;
      if (!entry.sample) continue;
      numPenaltyEntries = this.fillPenalties(entry, numPenaltyEntries);
      numBiasEntries = this.fillBias(entry, numBiasEntries);
    }
    batch.queryStarts[scheduled.length] = tokenIndex;
    batch.numDraftTokens = speculates ? this.numDraftTokens : null;
    batch.penaltyStarts[scheduled.length] = numPenaltyEntries;
    batch.biasStarts[scheduled.length] = numBiasEntries;
  }

  /** Appends the sequence's penalty entries from index `first`; returns the end. */
  private fillPenalties(entry: ScheduledSequence, first: number): number {
    const history = entry.penaltyHistory;
    if (history === null) return first;
    const { batch } = this;
    const { promptTokenIds, outputCounts } = history;
    // Prompt tokens matter only to the repetition penalty.
    const withPrompt = entry.sampling.repetitionPenalty !== 1;
    this.reservePenalties(first + (withPrompt ? promptTokenIds.size : 0) + outputCounts.size);
    let index = first;
    if (withPrompt) {
      for (const tokenId of promptTokenIds) {
        batch.penaltyTokenIds[index] = tokenId;
        batch.penaltyOutputCounts[index] = outputCounts.get(tokenId) ?? 0;
        batch.penaltyInPrompt[index++] = 1;
      }
    }
    for (const [tokenId, count] of outputCounts) {
      const inPrompt = promptTokenIds.has(tokenId);
      if (withPrompt && inPrompt) continue;
      batch.penaltyTokenIds[index] = tokenId;
      batch.penaltyOutputCounts[index] = count;
      batch.penaltyInPrompt[index++] = inPrompt ? 1 : 0;
    }
    return index;
  }

  /** Appends the request's logit bias and the banned tokens (-Infinity, which wins) from index `first`; returns the end. */
  private fillBias(entry: ScheduledSequence, first: number): number {
    const { logitBias } = entry.sampling;
    const banned = entry.bannedTokenIds;
    if (logitBias.size === 0 && banned.length === 0) return first;
    const { batch, biasSlots } = this;
    this.reserveBias(first + logitBias.size + banned.length);
    let index = first;
    for (const [tokenId, bias] of logitBias) {
      biasSlots[tokenId] = index;
      batch.biasTokenIds[index] = tokenId;
      batch.biasValues[index++] = bias;
    }
    for (const tokenId of banned) {
      // Each id at most once per sequence: a banned token already biased is banned in place.
      const slot = biasSlots[tokenId];
      if (slot !== NO_BIAS) {
        batch.biasValues[slot] = -Infinity;
        continue;
      }
      biasSlots[tokenId] = index;
      batch.biasTokenIds[index] = tokenId;
      batch.biasValues[index++] = -Infinity;
    }
    for (let i = first; i < index; i++) biasSlots[batch.biasTokenIds[i]] = NO_BIAS;
    return index;
  }

  private reservePenalties(numEntries: number): void {
    const { batch } = this;
    if (numEntries <= batch.penaltyTokenIds.length) return;
    const capacity = Math.max(numEntries, 2 * batch.penaltyTokenIds.length);
    batch.penaltyTokenIds = grown(batch.penaltyTokenIds, new Int32Array(capacity));
    batch.penaltyOutputCounts = grown(batch.penaltyOutputCounts, new Int32Array(capacity));
    batch.penaltyInPrompt = grown(batch.penaltyInPrompt, new Uint8Array(capacity));
  }

  private reserveBias(numEntries: number): void {
    const { batch } = this;
    if (numEntries <= batch.biasTokenIds.length) return;
    const capacity = Math.max(numEntries, 2 * batch.biasTokenIds.length);
    batch.biasTokenIds = grown(batch.biasTokenIds, new Int32Array(capacity));
    batch.biasValues = grown(batch.biasValues, new Float32Array(capacity));
  }
}

function grown<T extends Int32Array | Uint8Array | Float32Array>(old: T, larger: T): T {
  larger.set(old);
  return larger;
}
