// The draft-model proposer (vLLM's `draft_model`): a smaller checkpoint with the target's
// tokenizer, in the same worker, guesses each speculating sequence's next k tokens by k greedy
// one-token steps, batched over the sequences, before the target's step. It keeps its own KV
// cache: a block pool of its own and a block table per target sequence, freed when the sequence
// finishes. Its KV is trimmed to what the target accepted by comparing its guesses with the
// tokens that followed, so a verification of fewer guesses than it made, a rejection or a
// preemption of the target needs nothing more. What it guesses never changes an output: the
// target verifies every guess (proposer.ts).
import type { DtypeSetting, ForwardBatch, KernelPath, NativeModel } from '../../native/api.ts';
import { SEQ_SAMPLE, emptyForwardBatch } from '../../native/api.ts';
import { loadModel } from '../../native/index.ts';
import type { ProposalCandidate, Proposer, ProposerInput } from './proposer.ts';

export interface DraftLimits {
  /** Most sequences in one draft step (the target's max_num_seqs). */
  maxNumSeqs: number;
  /** Most tokens in one draft step: a sequence's catch-up (its prompt, at first) goes in chunks of at most this. */
  maxNumBatchedTokens: number;
}

export interface DraftLoadOptions extends DraftLimits {
  modelDir: string;
  /** The target's vocabulary: the draft's must be the same (one tokenizer, one id space). */
  targetVocabSize: number;
  dtype: DtypeSetting;
  kvCacheDtype: DtypeSetting;
  /** The draft's own pool: as many tokens as the target's holds is enough for every sequence it holds. */
  numKvBlocks: number;
  blockSizeTokens: number;
  numThreads: number;
  kernel: KernelPath;
}

/** Loads the draft checkpoint beside the target; a vocabulary unlike the target's is a config error. */
export async function loadDraftProposer(options: DraftLoadOptions): Promise<DraftProposer> {
  const { modelDir, targetVocabSize, dtype, kvCacheDtype, numKvBlocks, blockSizeTokens, numThreads, kernel } = options;
  const model = await loadModel({ modelDir, dtype, kvCacheDtype, numKvBlocks, blockSizeTokens, numThreads, kernel });
  try {
    const { vocabSize } = model.info;
    if (vocabSize !== targetVocabSize) {
      throw new Error(
        `speculative_config.model: the draft model ${modelDir} has a vocabulary of ${vocabSize} tokens, the target ${targetVocabSize}; a draft model must share the target's tokenizer`,
      );
    }
    return new DraftProposer(model, options);
  } catch (err) {
    model.close();
    throw err;
  }
}

/** One target sequence's draft KV and latest guesses. */
interface DraftSequence {
  readonly blockIds: number[];
  /** Positions [0, numComputedTokens) hold KV: the known tokens then, and the guesses fed back after them. */
  numComputedTokens: number;
  /** The known tokens' count when the guesses were made: guess j is for position numKnownTokens + j. */
  numKnownTokens: number;
  readonly guesses: number[];
}

/** Weight of the history in the draft pass time's moving average. */
const PASS_MS_DECAY = 0.9;

export class DraftProposer implements Proposer {
  readonly model: NativeModel;
  /** A one-token draft pass's time, a moving average (0 before the first). */
  passMs = 0;
  private readonly limits: DraftLimits;
  private readonly blockSizeTokens: number;
  private readonly freeBlockIds: number[];
  private readonly states = new Map<ProposerInput, DraftSequence>();
  private readonly batch: ForwardBatch;
  private readonly maxBlocksPerSeq: number;
  /** Reused per prepare: this step's sequences, their states, and the guesses each still makes. */
  private readonly active: DraftSequence[] = [];
  private readonly activeInputs: ProposerInput[] = [];
  private readonly numWanted: number[] = [];
  /** The states a draft step runs, in batch order. */
  private readonly members: DraftSequence[] = [];

  constructor(model: NativeModel, limits: DraftLimits) {
    const { numKvBlocks, blockSizeTokens, kvCacheGroups, maxPositionEmbeddings } = model.info;
    if (kvCacheGroups.length !== 1) throw new Error(`draft model: one KV-cache group expected (full attention), not ${kvCacheGroups.length}`);
    this.model = model;
    this.limits = limits;
    this.blockSizeTokens = blockSizeTokens;
    this.freeBlockIds = Array.from({ length: numKvBlocks }, (_, i) => numKvBlocks - 1 - i);
    this.maxBlocksPerSeq = Math.ceil(maxPositionEmbeddings / blockSizeTokens);
    const { maxNumSeqs, maxNumBatchedTokens } = limits;
    this.batch = emptyForwardBatch(maxNumSeqs, maxNumBatchedTokens, maxNumSeqs * this.maxBlocksPerSeq);
    // Greedy: temperature 0, top-k 0 and top-p 1; seeds and output indices unused.
    this.batch.topPs.fill(1);
  }

  /** Blocks of the draft's pool free now (tests: all of them once every sequence finished). */
  get numFreeBlocks(): number {
    return this.freeBlockIds.length;
  }

  /**
   * Guesses up to maxDraftTokens tokens for each candidate: first each catches up on the tokens
   * it has no KV for (its prompt, the accepted tokens), sampling the first guess, then k - 1
   * steps of one token each. A candidate whose catch-up does not fit this step's token budget
   * computes part of it and guesses nothing; one the draft's pool or context cannot hold guesses
   * nothing either (and gives its blocks back).
   */
  async prepare(candidates: readonly ProposalCandidate[]): Promise<void> {
    const { active, activeInputs, numWanted } = this;
    active.length = 0;
    activeInputs.length = 0;
    numWanted.length = 0;
    const maxPositions = this.model.info.maxPositionEmbeddings;
    for (const candidate of candidates) {
      const numKnownTokens = candidate.tokenIds.length;
      const state = this.stateOf(candidate);
      this.trim(state, candidate.tokenIds);
      state.guesses.length = 0;
      state.numKnownTokens = numKnownTokens;
      // Guess j is sampled after feeding position numKnownTokens + j - 1: all within the draft's context.
      const wanted = Math.min(candidate.maxDraftTokens, maxPositions - numKnownTokens + 1);
      if (wanted <= 0 || active.length === this.limits.maxNumSeqs) continue;
      if (!this.reserve(state, numKnownTokens + wanted - 1)) {
        this.release(candidate);
        continue;
      }
      active.push(state);
      activeInputs.push(candidate);
      numWanted.push(wanted);
    }
    if (active.length === 0) return;
    try {
      await this.guess();
    } catch (err) {
      // A failed pass leaves their KV unknown: they start over.
      for (const candidate of activeInputs) this.release(candidate);
      throw err;
    }
  }

  /** The passes over the active sequences: their catch-up and first guess, then one guess per pass. */
  private async guess(): Promise<void> {
    const { active, activeInputs, numWanted, members } = this;

    // Step 1: every candidate's catch-up, chunked within the budget; those that reach their
    // last known token sample their first guess.
    const { batch } = this;
    members.length = 0;
    let numTokens = 0;
    for (let i = 0; i < active.length; i++) {
      const state = active[i];
      const { tokenIds } = activeInputs[i];
      const end = Math.min(state.numKnownTokens, state.numComputedTokens + this.limits.maxNumBatchedTokens - numTokens);
      if (end <= state.numComputedTokens) {
        numWanted[i] = 0;
        continue;
      }
      batch.queryStarts[members.length] = numTokens;
      for (let position = state.numComputedTokens; position < end; position++, numTokens++) {
        batch.tokenIds[numTokens] = tokenIds[position];
        batch.positions[numTokens] = position;
      }
      const caughtUp = end === state.numKnownTokens;
      batch.seqFlags[members.length] = caughtUp ? SEQ_SAMPLE : 0;
      if (!caughtUp) numWanted[i] = 0;
      state.numComputedTokens = end;
      members.push(state);
    }
    await this.run(numTokens, 0);

    // Steps 2..k: feed each guess back, one token per sequence still guessing.
    for (let step = 1; ; step++) {
      members.length = 0;
      for (let i = 0; i < active.length; i++) {
        const state = active[i];
        if (state.guesses.length !== step || numWanted[i] <= step) continue;
        batch.queryStarts[members.length] = members.length;
        batch.tokenIds[members.length] = state.guesses[step - 1];
        batch.positions[members.length] = state.numComputedTokens++;
        batch.seqFlags[members.length] = SEQ_SAMPLE;
        members.push(state);
      }
      if (members.length === 0) return;
      await this.run(members.length, step);
    }
  }

  /** The guesses prepare made for the sequence at its current length; none otherwise. */
  propose(sequence: ProposerInput, maxNumTokens: number, out: number[]): void {
    out.length = 0;
    const state = this.states.get(sequence);
    if (state === undefined || state.numKnownTokens !== sequence.tokenIds.length) return;
    const count = Math.min(maxNumTokens, state.guesses.length);
    for (let i = 0; i < count; i++) out.push(state.guesses[i]);
  }

  finish(sequence: ProposerInput): void {
    this.release(sequence);
  }

  close(): void {
    this.model.close();
  }

  /** Runs one draft step over the members laid out in the batch; each sample is the member's next guess. */
  private async run(numTokens: number, step: number): Promise<void> {
    const { batch, members } = this;
    const numSeqs = members.length;
    let maxBlocks = 0;
    for (const state of members) maxBlocks = Math.max(maxBlocks, state.blockIds.length);
    batch.numSeqs = numSeqs;
    batch.numTokens = numTokens;
    batch.queryStarts[numSeqs] = numTokens;
    batch.maxBlocksPerSeq = maxBlocks;
    batch.blockTables.fill(-1, 0, numSeqs * maxBlocks);
    for (let seq = 0; seq < numSeqs; seq++) batch.blockTables.set(members[seq].blockIds, seq * maxBlocks);
    const start = performance.now();
    const result = await this.model.forward(batch);
    // Single-token passes only: the catch-up pass is paid whatever is guessed.
    if (step > 0) this.passMs = this.passMs === 0 ? performance.now() - start : PASS_MS_DECAY * this.passMs + (1 - PASS_MS_DECAY) * (performance.now() - start);
    for (let seq = 0; seq < numSeqs; seq++) {
      const tokenId = result.sampledTokenIds[seq];
      if (tokenId >= 0) members[seq].guesses.push(tokenId);
    }
  }

  private stateOf(sequence: ProposerInput): DraftSequence {
    let state = this.states.get(sequence);
    if (state === undefined) {
      state = { blockIds: [], numComputedTokens: 0, numKnownTokens: 0, guesses: [] };
      this.states.set(sequence, state);
    }
    return state;
  }

  /**
   * Keeps the KV of the known tokens it computed and of the guesses the sequence went on with
   * (fed back from position numKnownTokens then); the last known token is always fed again,
   * since its logits make the first guess. Blocks past the kept tokens go back to the pool.
   */
  private trim(state: DraftSequence, tokenIds: readonly number[]): void {
    const { numKnownTokens, guesses } = state;
    let numValid = Math.min(state.numComputedTokens, numKnownTokens);
    while (numValid < state.numComputedTokens && numValid < tokenIds.length && tokenIds[numValid] === guesses[numValid - numKnownTokens]) numValid++;
    state.numComputedTokens = Math.min(numValid, tokenIds.length - 1);
    const numBlocksKept = Math.ceil(state.numComputedTokens / this.blockSizeTokens);
    while (state.blockIds.length > numBlocksKept) this.freeBlockIds.push(state.blockIds.pop()!);
  }

  /** Blocks for positions [0, numPositions); false (nothing taken) when the pool or a table is short. */
  private reserve(state: DraftSequence, numPositions: number): boolean {
    const numBlocks = Math.ceil(numPositions / this.blockSizeTokens);
    const numNew = numBlocks - state.blockIds.length;
    if (numBlocks > this.maxBlocksPerSeq || numNew > this.freeBlockIds.length) return false;
    for (let i = 0; i < numNew; i++) state.blockIds.push(this.freeBlockIds.pop()!);
    return true;
  }

  private release(sequence: ProposerInput): void {
    const state = this.states.get(sequence);
    if (state === undefined) return;
    for (const blockId of state.blockIds) this.freeBlockIds.push(blockId);
    this.states.delete(sequence);
  }
}
