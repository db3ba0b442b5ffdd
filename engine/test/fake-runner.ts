// A model runner for engine tests: scripted tokens instead of a model, and a simulated paged
// KV cache that proves the block tables right. Each step writes every computed token id into
// its slot in every KV-cache group; every step's tokens must read back through each group's table
// everything that group's layers attend to (its whole history, or its window), so a block shared
// by two live sequences, a position never recomputed after preemption, or a prefix hit missing a
// block inside a window, fails.
// That holds only where sequences differ: by default every request samples its own tokens
// (scriptedTokenId), and distinctPrompt gives each request id its own prompt.
// Log-probabilities are scripted too: a sampled token's is -0.5, its k-th alternative (from 0)
// is token + k at -0.5 - k; the score of the token after position p is -(p + 1) / 8 with rank
// p + 1, its k-th alternative that token + k at that score - k.
import type { KvGroup } from '../kv/kv-cache-manager.ts';
import type { ModelRunner, RunnerInfo } from '../runner.ts';
import { TOP_LOGPROBS_STRIDE, type RunnerResult, type ScheduledSequence, type SchedulerOutput } from '../scheduler-output.ts';

/** The token a sequence samples next. */
export type TokenScript = (entry: ScheduledSequence) => number;

/** Output tokens are ids 100 .. 100 + SCRIPTED_TOKEN_RANGE - 1, within the test models' vocabularies. */
const SCRIPTED_TOKEN_RANGE = 390;
/** Requests seen n-th and m-th sample tokens REQUEST_STRIDE × (m − n) apart at the same output index. */
const REQUEST_STRIDE = 20;

/** The default script's token: the n-th request the runner sees (from 0) counts 100 + 20n, 100 + 20n + 1, ... */
export function scriptedTokenId(requestOrdinal: number, outputIndex: number): number {
  return 100 + ((REQUEST_STRIDE * requestOrdinal + outputIndex) % SCRIPTED_TOKEN_RANGE);
}

/** A prompt of its own for each request id: pseudo-random ids in [10, 100), seeded by the id's FNV-1a hash. */
export function distinctPrompt(requestId: string, numTokens: number): number[] {
  let state = 0x811c9dc5;
  for (let i = 0; i < requestId.length; i++) state = Math.imul(state ^ requestId.charCodeAt(i), 0x01000193) >>> 0;
  return Array.from({ length: numTokens }, () => {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    return 10 + ((state >>> 0) % 90);
  });
}

export class FakeRunner implements ModelRunner {
  readonly info: RunnerInfo;
  readonly steps: SchedulerOutput[] = [];
  /** Makes the next execute() reject with this message. */
  failNextWith: string | null = null;
  /** Awaited at the start of every step, so a test can hold the engine between steps. */
  beforeStep: (() => Promise<void>) | null = null;
  closed = false;
  private readonly slots: Int32Array;
  private readonly groups: readonly KvGroup[];
  private readonly script: TokenScript;
  /** Request id -> the order in which this runner first scheduled it. */
  private readonly requestOrdinals = new Map<string, number>();

  constructor(info: RunnerInfo, script?: TokenScript) {
    this.info = info;
    this.script = script ?? ((entry) => scriptedTokenId(this.ordinalOf(entry.requestId), entry.numOutputTokens));
    this.slots = new Int32Array(info.numKvBlocks * info.blockSizeTokens).fill(-1);
    this.groups = info.kvCacheGroups ?? [{ slidingWindowTokens: null }];
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
        for (let group = 0; group < this.groups.length; group++) this.slots[this.slotOf(entry, group, position)] = entry.tokenIds[position];
        if (entry.scoresPrompt && position + 1 < entry.tokenIds.length) {
          const token = firstTokenIndex + position - entry.startPosition;
          const logprob = -(position + 1) / 8;
          result.promptLogprobs[token] = logprob;
          result.promptRanks[token] = position + 1;
          writeTopRow(result.promptTopTokenIds, result.promptTopLogprobs, token, entry.tokenIds[position + 1], logprob, entry.sampling.numPromptLogprobs ?? 0);
        }
      }
      firstTokenIndex += entry.numScheduledTokens;
      this.groups.forEach(({ slidingWindowTokens: window }, group) => {
        // What the chunk's first token and every later one attend to in this group's layers.
        const first = window === null ? 0 : Math.max(0, entry.startPosition - window + 1);
        for (let position = first; position < end; position++) {
          const cached = this.slots[this.slotOf(entry, group, position)];
          if (cached !== entry.tokenIds[position]) {
            throw new Error(`${entry.requestId}: group ${group}'s KV slot of position ${position} holds ${cached}, not ${entry.tokenIds[position]}`);
          }
        }
      });
      if (!entry.sample) continue;
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

  /** The tokens the default script gives a request this runner has scheduled, from output index 0. */
  scriptedTokenIds(requestId: string, numTokens: number): number[] {
    const ordinal = this.requestOrdinals.get(requestId);
    if (ordinal === undefined) throw new Error(`${requestId} was never scheduled`);
    return Array.from({ length: numTokens }, (_, i) => scriptedTokenId(ordinal, i));
  }

  private ordinalOf(requestId: string): number {
    let ordinal = this.requestOrdinals.get(requestId);
    if (ordinal === undefined) this.requestOrdinals.set(requestId, (ordinal = this.requestOrdinals.size));
    return ordinal;
  }

  private slotOf(entry: ScheduledSequence, group: number, position: number): number {
    const { blockSizeTokens } = this.info;
    const blockId = entry.blockTables[group][Math.floor(position / blockSizeTokens)];
    if (blockId === undefined || blockId < 0) throw new Error(`${entry.requestId}: group ${group} has no block for position ${position}`);
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
