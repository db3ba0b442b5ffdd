// Continuous batching over a paged KV cache, in the vLLM v1 shape. Each step hands out a token
// budget: first one step's worth to every running sequence (a decode token, or the next chunk
// of a prompt), then chunks of waiting prompts, oldest first, while sequences and budget last.
// A running sequence that cannot get a block preempts the most recently admitted one by
// recompute: its blocks are freed and it waits at the front of the queue, to recompute its
// prompt and output so far when it is readmitted.
import { BlockPool } from './kv/block-pool.ts';
import type { GenerationDefaults } from './generation-config.ts';
import { resolveSampling } from './sampling.ts';
import type { RunnerResult, ScheduledSequence, SchedulerOutput } from './scheduler-output.ts';
import { Sequence } from './sequence.ts';
import type { EngineError, FinishReason, GenerateRequest, RequestOutput, WorkerLoad } from './types.ts';

export interface SchedulerConfig {
  numKvBlocks: number;
  blockSizeTokens: number;
  maxModelLen: number;
  vocabSize: number;
  /** Most sequences running at once. */
  maxNumSeqs: number;
  /** Token budget of one step: decode tokens plus prompt chunks. */
  maxNumBatchedTokens: number;
  generationDefaults: GenerationDefaults;
}

export class Scheduler {
  private readonly config: SchedulerConfig;
  private readonly pool: BlockPool;
  /** Admission order; preempted sequences go back to the front. */
  private readonly waiting: Sequence[] = [];
  /** Admission order: the last one is the first to be preempted. */
  private readonly running: Sequence[] = [];
  private readonly sequences = new Map<string, Sequence>();

  constructor(config: SchedulerConfig) {
    // Every running sequence needs at least one token of each step's budget.
    if (config.maxNumBatchedTokens < config.maxNumSeqs) {
      throw new RangeError(
        `maxNumBatchedTokens (${config.maxNumBatchedTokens}) must be >= maxNumSeqs (${config.maxNumSeqs})`,
      );
    }
    this.config = config;
    this.pool = new BlockPool(config.numKvBlocks);
  }

  get hasUnfinished(): boolean {
    return this.sequences.size > 0;
  }

  load(): WorkerLoad {
    return {
      numRunning: this.running.length,
      numWaiting: this.waiting.length,
      numFreeBlocks: this.pool.numFreeBlocks,
      numTotalBlocks: this.pool.numTotalBlocks,
    };
  }

  /** Queues a request, or refuses one that could never run and says why. */
  add(request: GenerateRequest): EngineError | null {
    const { requestId, promptTokenIds } = request;
    const { maxModelLen, vocabSize, numKvBlocks, blockSizeTokens } = this.config;
    if (this.sequences.has(requestId)) {
      return { code: 'invalid_request', message: `Request ${requestId} is already in flight` };
    }
    if (promptTokenIds.length === 0) return { code: 'invalid_request', message: 'The prompt has no tokens' };
    for (const tokenId of promptTokenIds) {
      if (!(Number.isInteger(tokenId) && tokenId >= 0 && tokenId < vocabSize)) {
        return {
          code: 'invalid_request',
          message: `Expected token ids in [0, ${vocabSize}) but the prompt holds ${tokenId}`,
        };
      }
    }
    const numPromptTokens = promptTokenIds.length;
    if (numPromptTokens >= maxModelLen) {
      return {
        code: 'context_length_exceeded',
        message: `This model's maximum context length is ${maxModelLen} tokens, and the prompt has ${numPromptTokens}: no room is left for output`,
      };
    }
    const sampling = resolveSampling(request.sampling, this.config.generationDefaults, maxModelLen - numPromptTokens);
    if ('code' in sampling) return sampling;
    const numTokens = numPromptTokens + sampling.maxTokens;
    if (numTokens > maxModelLen) {
      return {
        code: 'context_length_exceeded',
        message: `This model's maximum context length is ${maxModelLen} tokens, but ${numTokens} were requested (${numPromptTokens} in the prompt, ${sampling.maxTokens} for the output)`,
      };
    }
    const numCacheTokens = numKvBlocks * blockSizeTokens;
    if (numTokens > numCacheTokens) {
      return {
        code: 'kv_cache_too_small',
        message: `The KV cache holds ${numCacheTokens} tokens, fewer than the ${numTokens} requested (${numPromptTokens} in the prompt, ${sampling.maxTokens} for the output)`,
      };
    }
    const sequence = new Sequence(requestId, promptTokenIds, sampling);
    this.sequences.set(requestId, sequence);
    this.waiting.push(sequence);
    return null;
  }

  /** Ends a request and frees its blocks now; null when it is not in flight. */
  abort(requestId: string): RequestOutput | null {
    const sequence = this.sequences.get(requestId);
    if (sequence === undefined) return null;
    this.finish(sequence);
    return this.outputOf(sequence, 'abort');
  }

  schedule(): SchedulerOutput {
    const scheduled: ScheduledSequence[] = [];
    const preemptedRequestIds: string[] = [];
    let tokenBudget = this.config.maxNumBatchedTokens;

    for (let index = 0; index < this.running.length && tokenBudget > 0; ) {
      const sequence = this.running[index];
      const numNewTokens = Math.min(sequence.numTokens - sequence.numComputedTokens, tokenBudget);
      let preemptedItself = false;
      while (!this.allocateSlots(sequence, numNewTokens)) {
        // Sequences before `index` are already scheduled, so the victim is this one or a later one.
        const victim = this.running.pop()!;
        this.preempt(victim);
        preemptedRequestIds.push(victim.requestId);
        if (victim === sequence) {
          preemptedItself = true;
          break;
        }
      }
      if (preemptedItself) break;
      scheduled.push(scheduledOf(sequence, numNewTokens));
      tokenBudget -= numNewTokens;
      index++;
    }

    // Admitting while preempting would hand the freed blocks straight to a newcomer.
    if (preemptedRequestIds.length === 0) {
      while (this.waiting.length > 0 && tokenBudget > 0 && this.running.length < this.config.maxNumSeqs) {
        const sequence = this.waiting[0];
        const numNewTokens = Math.min(sequence.numTokens - sequence.numComputedTokens, tokenBudget);
        if (!this.allocateSlots(sequence, numNewTokens)) break;
        this.waiting.shift();
        this.running.push(sequence);
        scheduled.push(scheduledOf(sequence, numNewTokens));
        tokenBudget -= numNewTokens;
      }
    }

    return {
      scheduled,
      numScheduledTokens: this.config.maxNumBatchedTokens - tokenBudget,
      preemptedRequestIds,
    };
  }

  /** Applies one step's sampled tokens; returns the news for every request that has some. */
  update(output: SchedulerOutput, result: RunnerResult): RequestOutput[] {
    const outputs: RequestOutput[] = [];
    for (let index = 0; index < output.scheduled.length; index++) {
      const entry = output.scheduled[index];
      const sequence = this.sequences.get(entry.requestId)!;
      sequence.numComputedTokens += entry.numScheduledTokens;
      if (!entry.sample) continue;
      const tokenId = result.sampledTokenIds[index];
      sequence.tokenIds.push(tokenId);
      const finishReason = this.finishReasonOf(sequence, tokenId);
      if (finishReason !== null) this.finish(sequence);
      const news = this.outputOf(sequence, finishReason);
      news.newTokenIds.push(tokenId);
      news.newLogprobs.push(result.sampledLogprobs[index]);
      if (finishReason === 'stop') news.stopTokenId = tokenId;
      outputs.push(news);
    }
    return outputs;
  }

  /** Ends every request of a step the runner could not execute. */
  failStep(output: SchedulerOutput, error: EngineError): RequestOutput[] {
    const outputs: RequestOutput[] = [];
    for (const entry of output.scheduled) {
      const sequence = this.sequences.get(entry.requestId);
      if (sequence === undefined) continue;
      this.finish(sequence);
      outputs.push({ ...this.outputOf(sequence, 'error'), error });
    }
    return outputs;
  }

  /** Gives the sequence blocks for its next numNewTokens tokens, or changes nothing and says no. */
  private allocateSlots(sequence: Sequence, numNewTokens: number): boolean {
    const numBlocksNeeded = Math.ceil((sequence.numComputedTokens + numNewTokens) / this.config.blockSizeTokens);
    const numNewBlocks = numBlocksNeeded - sequence.blockIds.length;
    return numNewBlocks <= 0 || this.pool.allocate(numNewBlocks, sequence.blockIds);
  }

  private preempt(sequence: Sequence): void {
    this.pool.free(sequence.blockIds);
    sequence.blockIds.length = 0;
    sequence.numComputedTokens = 0;
    this.waiting.unshift(sequence);
  }

  private finish(sequence: Sequence): void {
    this.pool.free(sequence.blockIds);
    sequence.blockIds.length = 0;
    this.sequences.delete(sequence.requestId);
    const runningIndex = this.running.indexOf(sequence);
    if (runningIndex >= 0) this.running.splice(runningIndex, 1);
    else this.waiting.splice(this.waiting.indexOf(sequence), 1);
  }

  private finishReasonOf(sequence: Sequence, tokenId: number): FinishReason | null {
    const { sampling } = sequence;
    if (!sampling.ignoreEos && this.config.generationDefaults.eosTokenIds.includes(tokenId)) return 'stop';
    if (sampling.stopTokenIds.includes(tokenId)) return 'stop';
    if (sequence.numOutputTokens >= sampling.maxTokens) return 'length';
    if (sequence.numTokens >= this.config.maxModelLen) return 'length';
    return null;
  }

  private outputOf(sequence: Sequence, finishReason: FinishReason | null): RequestOutput {
    return {
      requestId: sequence.requestId,
      newTokenIds: [],
      newLogprobs: [],
      finishReason,
      numPromptTokens: sequence.numPromptTokens,
      numOutputTokens: sequence.numOutputTokens,
    };
  }
}

function scheduledOf(sequence: Sequence, numScheduledTokens: number): ScheduledSequence {
  return {
    requestId: sequence.requestId,
    tokenIds: sequence.tokenIds,
    startPosition: sequence.numComputedTokens,
    numScheduledTokens,
    blockIds: sequence.blockIds,
    sample: sequence.numComputedTokens + numScheduledTokens === sequence.numTokens,
    numOutputTokens: sequence.numOutputTokens,
    sampling: sequence.sampling,
  };
}
