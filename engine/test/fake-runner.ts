// A model runner for engine tests: scripted tokens instead of a model, and a simulated paged
// KV cache that proves the block tables right. Each step writes every computed token id into
// its slot; a sampled sequence must read its whole history back through its block table, so a
// block shared by two live sequences, or a position never recomputed after preemption, fails.
// Log-probabilities are scripted too: a sampled token's is -0.5, its k-th alternative (from 0)
// is token + k at -0.5 - k; the score of the token after position p is -(p + 1) / 8 with rank
// p + 1, its k-th alternative that token + k at that score - k.
import type { ModelRunner, RunnerInfo } from '../runner.ts';
import { TOP_LOGPROBS_STRIDE, type RunnerResult, type ScheduledSequence, type SchedulerOutput } from '../scheduler-output.ts';

/** The token a sequence samples next; the default counts 100, 101, ... per request. */
export type TokenScript = (entry: ScheduledSequence) => number;

export class FakeRunner implements ModelRunner {
  readonly info: RunnerInfo;
  readonly steps: SchedulerOutput[] = [];
  /** Makes the next execute() reject with this message. */
  failNextWith: string | null = null;
  /** Awaited at the start of every step, so a test can hold the engine between steps. */
  beforeStep: (() => Promise<void>) | null = null;
  closed = false;
  private readonly slots: Int32Array;
  private readonly script: TokenScript;

  constructor(info: RunnerInfo, script: TokenScript = (entry) => 100 + entry.numOutputTokens) {
    this.info = info;
    this.script = script;
    this.slots = new Int32Array(info.numKvBlocks * info.blockSizeTokens).fill(-1);
  }

  async execute(output: SchedulerOutput): Promise<RunnerResult> {
    await this.beforeStep?.();
    // Snapshot what the runner saw: the entries borrow the scheduler's arrays.
    this.steps.push(structuredClone(output));
    if (this.failNextWith !== null) {
      const message = this.failNextWith;
      this.failNextWith = null;
      throw new Error(message);
    }
    const result = emptyResult(output);
    let firstTokenIndex = 0;
    for (const [index, entry] of output.scheduled.entries()) {
      const end = entry.startPosition + entry.numScheduledTokens;
      for (let position = entry.startPosition; position < end; position++) {
        this.slots[this.slotOf(entry, position)] = entry.tokenIds[position];
        if (entry.scoresPrompt && position + 1 < entry.tokenIds.length) {
          const token = firstTokenIndex + position - entry.startPosition;
          const logprob = -(position + 1) / 8;
          result.promptLogprobs[token] = logprob;
          result.promptRanks[token] = position + 1;
          writeTopRow(result.promptTopTokenIds, result.promptTopLogprobs, token, entry.tokenIds[position + 1], logprob, entry.sampling.numPromptLogprobs ?? 0);
        }
      }
      firstTokenIndex += entry.numScheduledTokens;
      if (!entry.sample) continue;
      for (let position = 0; position < end; position++) {
        const cached = this.slots[this.slotOf(entry, position)];
        if (cached !== entry.tokenIds[position]) {
          throw new Error(`${entry.requestId}: KV slot of position ${position} holds ${cached}, not ${entry.tokenIds[position]}`);
        }
      }
      const tokenId = this.script(entry);
      result.sampledTokenIds[index] = tokenId;
      result.sampledLogprobs[index] = -0.5;
      writeTopRow(result.topTokenIds, result.topLogprobs, index, tokenId, -0.5, entry.sampling.numTopLogprobs);
    }
    return result;
  }

  close(): void {
    this.closed = true;
  }

  private slotOf(entry: ScheduledSequence, position: number): number {
    const { blockSizeTokens } = this.info;
    const blockId = entry.blockIds[Math.floor(position / blockSizeTokens)];
    if (blockId === undefined) throw new Error(`${entry.requestId}: no block for position ${position}`);
    return blockId * blockSizeTokens + (position % blockSizeTokens);
  }
}

/** Shaped as the native runtime shapes it: -1 / NaN / 0 wherever nothing is reported. */
function emptyResult(output: SchedulerOutput): RunnerResult {
  const numSeqs = output.scheduled.length;
  const scoring = output.scheduled.filter((entry) => entry.scoresPrompt);
  const numPromptTokens = scoring.length > 0 ? output.numScheduledTokens : 0;
  const numPromptTopTokens = scoring.some((entry) => (entry.sampling.numPromptLogprobs ?? 0) > 0) ? numPromptTokens : 0;
  return {
    sampledTokenIds: new Int32Array(numSeqs).fill(-1),
    sampledLogprobs: new Float32Array(numSeqs),
    topTokenIds: new Int32Array(numSeqs * TOP_LOGPROBS_STRIDE).fill(-1),
    topLogprobs: new Float32Array(numSeqs * TOP_LOGPROBS_STRIDE).fill(NaN),
    promptLogprobs: new Float32Array(numPromptTokens).fill(NaN),
    promptRanks: new Int32Array(numPromptTokens),
    promptTopTokenIds: new Int32Array(numPromptTopTokens * TOP_LOGPROBS_STRIDE).fill(-1),
    promptTopLogprobs: new Float32Array(numPromptTopTokens * TOP_LOGPROBS_STRIDE).fill(NaN),
  };
}

function writeTopRow(ids: Int32Array, logprobs: Float32Array, row: number, tokenId: number, logprob: number, numTop: number): void {
  for (let k = 0; k < numTop; k++) {
    ids[row * TOP_LOGPROBS_STRIDE + k] = tokenId + k;
    logprobs[row * TOP_LOGPROBS_STRIDE + k] = logprob - k;
  }
}
