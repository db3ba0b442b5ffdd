// Continuous batching over a paged KV cache with prefix caching, in the vLLM v1 shape. Each step
// hands out a token budget: first a decode token to every running sequence whose prompt is
// computed, then chunks of prompts (those partly computed and those waiting) in policy order
// (first come first served, or by priority), at most maxNumPartialPrefills of them and
// maxLongPartialPrefills long ones, while sequences and budget last. A waiting prompt starts after its cached prefix. A running
// sequence that cannot get a block preempts another by recompute: the most recently admitted
// (FCFS) or the lowest-priority, latest one; its blocks are freed (cached ones stay cached) and
// it waits to be readmitted.
import type { EngineError, EngineErrorCode } from './errors.ts';
import type { GenerationDefaults } from './generation-config.ts';
import { rootHash } from './kv/block-hash.ts';
import { KvCacheManager, type KvGroup } from './kv/kv-cache-manager.ts';
import { FcfsQueue, PriorityQueue, SequenceList, type WaitingQueue } from './queues.ts';
import { resolveSampling } from './sampling.ts';
import { TOP_LOGPROBS_STRIDE, type RunnerResult, type ScheduledSequence, type SchedulerOutput } from './scheduler-output.ts';
import { Sequence, type GrammarGate } from './sequence.ts';
import { MAX_SPECULATIVE_TOKENS } from './spec/proposer.ts';
import type { Speculator } from './spec/speculator.ts';
import type { FinishReason, GenerateRequest, KvEvent, SpecDecodeCounters, RequestOutput, TokenLogprobs, WorkerLoad } from './types.ts';

export type SchedulingPolicy = 'fcfs' | 'priority';

/** What the scheduler favours when prompts queue (vLLM's performance_mode). */
export type PerformanceMode = 'interactivity' | 'throughput';

export type PrefillLimits = Pick<
  SchedulerConfig,
  'maxNumPartialPrefills' | 'maxLongPartialPrefills' | 'longPrefillTokenThreshold' | 'maxPrefillTokensBesideDecodes' | 'prefillTokensPerDecodeRow' | 'backlogPromptTokens'
>;

/**
 * A mode's prefill limits. interactivity: one long prompt a step, short ones (an eighth of the
 * budget or less: each costs the step little) beside it as they come, and beside decodes, while
 * two or more prompts wait, at most 3/16 of the budget of prompt tokens (a chunk of a 256-token
 * prompt takes a step about a third as long as the whole; tools/scheduler-sim.ts measures the
 * choice), never fewer than
 * MIN_PREFILL_TOKENS_BESIDE_DECODES, or PREFILL_TOKENS_PER_DECODE_ROW per decode when that is more,
 * unless more than BACKLOG_STEPS budgets of prompt tokens wait;
 * throughput: every prompt the budget holds, as the scheduler
 * did before it had modes.
 */
export function prefillLimitsFor(mode: PerformanceMode, maxNumSeqs: number, maxNumBatchedTokens: number): PrefillLimits {
  if (mode === 'throughput') {
    return { maxNumPartialPrefills: maxNumSeqs, maxLongPartialPrefills: maxNumSeqs, longPrefillTokenThreshold: Math.floor(maxNumBatchedTokens / 8) };
  }
  return {
    maxNumPartialPrefills: maxNumSeqs,
    maxLongPartialPrefills: 1,
    longPrefillTokenThreshold: Math.floor(maxNumBatchedTokens / 8),
    maxPrefillTokensBesideDecodes: defaultPrefillTokensBesideDecodes(maxNumBatchedTokens),
    prefillTokensPerDecodeRow: PREFILL_TOKENS_PER_DECODE_ROW,
    backlogPromptTokens: BACKLOG_STEPS * maxNumBatchedTokens,
  };
}

/**
 * How many whole steps of prompt work make a backlog in the interactivity mode: while more prompt
 * tokens than this many budgets wait, a step takes its whole budget beside the decodes. Measured at
 * two values only (tools/README.md, "Sixth session": CPU-time replay, 256-token prompts, a 512
 * budget). At 1, the queue eight closed-loop clients leave (8 x 256 tokens, 4 budgets) was a
 * backlog: it drained in whole prompts, in lockstep, and brought the next prompts back together
 * (TTFT p50 1.46x the small chunks'). At 4 that queue is no backlog (p50 unchanged) and 32
 * clients' opening burst (8,192 tokens, 16 budgets) is: its last first token 0.80-0.90x. So 4 is
 * the fewest steps that leave a handful of clients' queue alone; more are unmeasured (a burst
 * would go in small chunks for longer before whole-budget steps start).
 */
export const BACKLOG_STEPS = 4;

/**
 * Prompt tokens the interactivity mode allows beside each decode while prompts contend, when
 * that is more than its 3/16 of the budget (from 13 decodes on at 96). Many decodes make a step
 * long whatever its chunk; a chunk fixed at 96 tokens then spreads a prompt over steps that are
 * mostly the decodes' rows, each a row of every stream again: a 32-client burst's last 2,048
 * prompt tokens took 21 steps beside ~28 decodes each. Beside 8 a row, the TTFT p99 came after
 * 33 steps and 513 decode rows instead of 42 and 758, and was lower in 8 of 9 interleaved pairs
 * (CPU-time replay, 128 requests: median pair 0.95x; ITL p99, TTFT p50 and tok/s the same). 12
 * a row kept 16 clients' streams in lockstep after their burst (simulated TTFT p50 284 ms, not 223).
 */
export const PREFILL_TOKENS_PER_DECODE_ROW = 8;

/**
 * The fewest prompt tokens the interactivity mode puts beside decodes: a step pays a fixed cost
 * (the weights' pass) worth some tens of tokens' compute, so smaller chunks would spend steps
 * on little progress (3/16 of a tiny budget would be 1-token chunks).
 */
export const MIN_PREFILL_TOKENS_BESIDE_DECODES = 32;

/** 3/16 of the budget, at least MIN_PREFILL_TOKENS_BESIDE_DECODES, at most the budget. */
export function defaultPrefillTokensBesideDecodes(maxNumBatchedTokens: number): number {
  return Math.min(maxNumBatchedTokens, Math.max(MIN_PREFILL_TOKENS_BESIDE_DECODES, Math.floor((maxNumBatchedTokens * 3) / 16)));
}

export interface SchedulerConfig {
  numKvBlocks: number;
  blockSizeTokens: number;
  /** The model's KV-cache groups (one full-attention group when absent). */
  kvCacheGroups?: readonly KvGroup[];
  maxModelLen: number;
  vocabSize: number;
  /** Most sequences running at once. */
  maxNumSeqs: number;
  /** Token budget of one step: decode tokens plus prompt chunks. */
  maxNumBatchedTokens: number;
  /**
   * Most prompts computed in one step (vLLM's max_num_partial_prefills), and of them the most
   * that are long (max_long_partial_prefills): prompts with more than longPrefillTokenThreshold
   * tokens still to compute. A long prompt computed on its own gets its first token soonest; a
   * second one in its step would delay it by its whole compute. Short ones cost a step little.
   */
  maxNumPartialPrefills: number;
  maxLongPartialPrefills: number;
  longPrefillTokenThreshold: number;
  /**
   * Most prompt tokens in a step that also decodes while prompts contend, two or more with
   * tokens to compute (absent: the whole budget). A step is as long as its tokens: prompts
   * drained whole beside the decodes stall every stream for their compute and queue behind each
   * other, so a burst's streams advance in lockstep, end together, and their clients' next
   * prompts arrive together again (TTFT twice a prompt's step at 8 closed-loop clients). In
   * small chunks the decodes keep their pace, ends stay apart, and a new prompt meets a short
   * step. A lone prompt (none other waiting) is computed whole: it holds nobody back, and in
   * chunks its first token would wait for more steps, each with its fixed cost and the decodes'
   * rows. A prompt with no decodes beside it is computed whole too.
   */
  maxPrefillTokensBesideDecodes?: number;
  /**
   * Prompt tokens allowed beside each decode where maxPrefillTokensBesideDecodes applies, when
   * that is more (absent: none): with many decodes a step is long anyway, and a small fixed chunk
   * would spread a prompt over steps spent mostly on the decodes' rows.
   */
  prefillTokensPerDecodeRow?: number;
  /**
   * Prompt tokens still to compute (waiting and partly computed) above which the prompts are a
   * backlog (absent: never): beside the decodes a step then takes its whole budget, not
   * maxPrefillTokensBesideDecodes. Small chunks keep a step short for the next arrival, but
   * behind a backlog the next arrival waits for the queue anyway, and every step spent on a
   * small chunk pays the step's fixed cost and the decodes' rows again: a burst's last first
   * token comes when the queue is drained. Still one long prompt a step: two in a whole budget
   * drain the queue sooner yet, but start their streams, and so end them, in pairs and bunches,
   * and the clients' next prompts come back as another backlog (TTFT p50 5x at 32 clients).
   */
  backlogPromptTokens?: number;
  generationDefaults: GenerationDefaults;
  /** The served model's name, the root of its prefix-cache hashes. */
  modelName: string;
  enablePrefixCaching: boolean;
  policy: SchedulingPolicy;
  /** Speculative decoding (spec/): proposals verified with the decodes; null or absent: none. */
  speculator?: Speculator | null;
  /** Milliseconds on a monotonic clock; performance.now() unless a test brings its own. */
  now?: () => number;
}

/** What the scheduler has done since it last said, for the step's report. */
export interface SchedulerCounters {
  numPreempted: number;
  numPrefixQueriedTokens: number;
  numPrefixHitTokens: number;
  /** Speculative decoding's counters; null without speculation. */
  specDecode: SpecDecodeCounters | null;
}

const NO_TOKENS: readonly number[] = [];
const NONE_WITHHELD: readonly number[] = [];

interface Deadline {
  atMs: number;
  sequence: Sequence;
  code: 'queue_timeout' | 'request_timeout';
}

export class Scheduler {
  private readonly config: SchedulerConfig;
  private readonly kv: KvCacheManager;
  private readonly waiting: WaitingQueue<Sequence>;
  /** Admission order, readmissions at the back. */
  private readonly running = new SequenceList<Sequence>();
  private readonly sequences = new Map<string, Sequence>();
  private readonly deadlines: Deadline[] = [];
  private readonly now: () => number;
  /** Steps scheduled so far; a sequence's scheduledStep says whether it runs in the current one. */
  private numSteps = 0;
  private aloneSequence: Sequence | null = null;
  /** Reused every step: the running list's order, and the prompts it holds that are still being computed. */
  private readonly stepOrder: Sequence[] = [];
  private readonly prefilling: Sequence[] = [];
  /** Reused every step: the decodes that may verify proposals, and their entries in the step. */
  private readonly speculating: Sequence[] = [];
  private readonly speculatingEntries: ScheduledSequence[] = [];
  /** Reused: speculationCandidates()'s answer. */
  private readonly candidates: Sequence[] = [];
  private numArrivals = 0;
  private numQueuedPrefillTokens = 0;
  private numPreempted = 0;

  constructor(config: SchedulerConfig) {
    // Every running sequence needs at least one token of each step's budget.
    if (config.maxNumBatchedTokens < config.maxNumSeqs) {
      throw new RangeError(
        `maxNumBatchedTokens (${config.maxNumBatchedTokens}) must be >= maxNumSeqs (${config.maxNumSeqs})`,
      );
    }
    for (const [name, value, min] of [
      ['maxNumPartialPrefills', config.maxNumPartialPrefills, 1],
      ['maxLongPartialPrefills', config.maxLongPartialPrefills, 1],
      ['longPrefillTokenThreshold', config.longPrefillTokenThreshold, 0],
      ['maxPrefillTokensBesideDecodes', config.maxPrefillTokensBesideDecodes ?? 1, 1],
      ['prefillTokensPerDecodeRow', config.prefillTokensPerDecodeRow ?? 0, 0],
      ['backlogPromptTokens', config.backlogPromptTokens ?? 0, 0],
    ] as const) {
      if (!(Number.isInteger(value) && value >= min)) throw new RangeError(`${name} must be an integer >= ${min}, not ${value}`);
    }
    if (config.maxLongPartialPrefills > config.maxNumPartialPrefills) {
      throw new RangeError(`maxLongPartialPrefills (${config.maxLongPartialPrefills}) must be <= maxNumPartialPrefills (${config.maxNumPartialPrefills})`);
    }
    this.config = config;
    this.kv = new KvCacheManager(config.numKvBlocks, config.blockSizeTokens, config.kvCacheGroups);
    this.waiting = config.policy === 'priority' ? new PriorityQueue<Sequence>() : new FcfsQueue<Sequence>();
    this.now = config.now ?? (() => performance.now());
  }

  get hasUnfinished(): boolean {
    return this.sequences.size > 0;
  }

  load(): WorkerLoad {
    return {
      numRunning: this.running.size,
      numWaiting: this.waiting.size,
      numFreeBlocks: this.kv.numFreeBlocks,
      numTotalBlocks: this.kv.numTotalBlocks,
      numQueuedPrefillTokens: this.numQueuedPrefillTokens,
      numCachedBlocks: this.kv.numCachedBlocks,
    };
  }

  get kvUsage(): number {
    return this.kv.usage;
  }

  /** The prefix cache's changes since the last call. */
  takeKvEvents(): KvEvent[] {
    return this.kv.takeEvents();
  }

  /** The whole prefix cache as events, for a listener that starts now. */
  kvSnapshot(): KvEvent[] {
    return this.kv.snapshot();
  }

  /** Preemptions and prefix-cache lookups since the last call. */
  takeCounters(): SchedulerCounters {
    const counters = {
      numPreempted: this.numPreempted,
      numPrefixQueriedTokens: this.kv.stats.numQueriedTokens,
      numPrefixHitTokens: this.kv.stats.numHitTokens,
      specDecode: this.config.speculator?.takeCounters() ?? null,
    };
    this.numPreempted = 0;
    this.kv.stats.numQueriedTokens = 0;
    this.kv.stats.numHitTokens = 0;
    return counters;
  }

  /**
   * Queues a request, or refuses one that could never run and says why. arrivalMs (the
   * scheduler's clock): when the worker received it, if earlier than now; its queue time and
   * deadlines count from there. A request with a grammar computes its prompt while the grammar
   * compiles and samples once it is ready.
   */
  add(request: GenerateRequest, arrivalMs = this.now(), grammar: GrammarGate | null = null): EngineError | null {
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
    const priority = request.priority ?? 0;
    if (!Number.isSafeInteger(priority)) return { code: 'invalid_request', message: `Expected an integer priority but received ${priority}` };
    // As vLLM: a priority that the policy would ignore is the caller's mistake, not a no-op.
    if (priority !== 0 && this.config.policy !== 'priority') {
      return { code: 'invalid_request', message: `Got priority ${priority}, but the model is not served with scheduling_policy: priority` };
    }
    for (const [field, value] of [['queueTimeoutMs', request.queueTimeoutMs], ['timeoutMs', request.timeoutMs]] as const) {
      if (value !== undefined && !(Number.isFinite(value) && value > 0)) {
        return { code: 'invalid_request', message: `Expected a positive number of milliseconds for ${field} but received ${value}` };
      }
    }
    const numSpeculativeTokens = request.numSpeculativeTokens;
    if (numSpeculativeTokens !== undefined && !(Number.isInteger(numSpeculativeTokens) && numSpeculativeTokens >= 0 && numSpeculativeTokens <= MAX_SPECULATIVE_TOKENS)) {
      return { code: 'invalid_request', message: `Expected num_speculative_tokens in [0, ${MAX_SPECULATIVE_TOKENS}] but received ${numSpeculativeTokens}` };
    }
    const numPromptTokens = promptTokenIds.length;
    if (numPromptTokens >= maxModelLen) {
      return {
        code: 'context_length_exceeded',
        message: `This model's maximum context length is ${maxModelLen} tokens, and the prompt has ${numPromptTokens}: no room is left for output`,
      };
    }
    const sampling = resolveSampling(request.sampling, this.config.generationDefaults, maxModelLen - numPromptTokens, vocabSize);
    if ('code' in sampling) return sampling;
    const numTokens = numPromptTokens + sampling.maxTokens;
    if (numTokens > maxModelLen) {
      return {
        code: 'context_length_exceeded',
        message: `This model's maximum context length is ${maxModelLen} tokens, but ${numTokens} were requested (${numPromptTokens} in the prompt, ${sampling.maxTokens} for the output)`,
      };
    }
    const numBlocksNeeded = this.kv.maxBlocksFor(numTokens, this.config.maxNumBatchedTokens);
    if (numBlocksNeeded > numKvBlocks) {
      const holds = this.kv.groups.length === 1 ? `${numKvBlocks * blockSizeTokens} tokens` : `${numKvBlocks} blocks, fewer than the ${numBlocksNeeded} needed by`;
      return {
        code: 'kv_cache_too_small',
        message: `The KV cache holds ${holds}${this.kv.groups.length === 1 ? ', fewer than' : ''} the ${numTokens} requested (${numPromptTokens} in the prompt, ${sampling.maxTokens} for the output)`,
      };
    }
    // Prompt logprobs need the logits of every prompt position: such a request computes its
    // whole prompt, and so neither reuses nor offers cached blocks.
    const cached = this.config.enablePrefixCaching && sampling.numPromptLogprobs === null;
    // A constrained output proposes nothing: its grammar decides each token after the one before.
    const speculator = this.config.speculator ?? null;
    const speculationLimit = speculator === null || grammar !== null ? 0 : (numSpeculativeTokens ?? speculator.config.numSpeculativeTokens);
    const sequence = new Sequence({
      requestId,
      promptTokenIds,
      sampling,
      priority,
      arrivalIndex: this.numArrivals++,
      arrivalMs,
      cacheRoot: cached ? rootHash({ model: this.config.modelName, cacheSalt: request.cacheSalt }) : null,
      grammar,
      speculationLimit,
      acceptance: speculationLimit > 0 ? speculator!.newAcceptanceStats() : null,
    });
    this.sequences.set(requestId, sequence);
    this.pushWaiting(sequence, false);
    if (request.queueTimeoutMs !== undefined) this.addDeadline(arrivalMs + request.queueTimeoutMs, sequence, 'queue_timeout');
    if (request.timeoutMs !== undefined) this.addDeadline(arrivalMs + request.timeoutMs, sequence, 'request_timeout');
    return null;
  }

  /** Ends a request and frees its blocks now; null when it is not in flight. */
  abort(requestId: string): RequestOutput | null {
    const sequence = this.sequences.get(requestId);
    if (sequence === undefined) return null;
    this.finish(sequence);
    return this.outputOf(sequence, 'abort');
  }

  /**
   * Outputs tokens a request's grammar forces before anything is sampled (they are computed with
   * the prompt); null when the request is gone or has output other than numOutputTokensBefore
   * tokens (a prefix forced before them).
   */
  forceOutput(requestId: string, tokenIds: readonly number[], numOutputTokensBefore = 0): RequestOutput | null {
    const sequence = this.sequences.get(requestId);
    if (sequence === undefined || sequence.numOutputTokens !== numOutputTokensBefore) return null;
    const news = this.outputOf(sequence, null);
    const numTokensBefore = sequence.numTokens;
    this.appendForcedTokens(sequence, tokenIds, news);
    if (news.finishReason === null && !sequence.isRunning) {
      // Waiting still: the tokens add to what its admission must compute.
      const numAdded = sequence.numTokens - numTokensBefore;
      sequence.numQueuedPrefillTokens += numAdded;
      this.numQueuedPrefillTokens += numAdded;
    }
    return news;
  }

  /** Ends a request with an error (its grammar failed) and frees its blocks now; null when it is not in flight. */
  fail(requestId: string, error: EngineError): RequestOutput | null {
    const sequence = this.sequences.get(requestId);
    if (sequence === undefined) return null;
    this.finish(sequence);
    return { ...this.outputOf(sequence, 'error'), error };
  }

  /** Ends the requests whose deadlines have passed (between steps only). */
  expire(): RequestOutput[] {
    const outputs: RequestOutput[] = [];
    const nowMs = this.now();
    while (this.deadlines.length > 0 && this.deadlines[0].atMs <= nowMs) {
      const { sequence, code, atMs } = popDeadline(this.deadlines);
      // Lazily deleted: the request may have finished, or started before its queue deadline.
      if (this.sequences.get(sequence.requestId) !== sequence) continue;
      if (code === 'queue_timeout' && sequence.wasAdmitted) continue;
      this.finish(sequence);
      const waitedMs = Math.round(atMs - sequence.arrivalMs);
      const message =
        code === 'queue_timeout'
          ? `The request waited ${waitedMs} ms in the queue without starting, its queue deadline`
          : `The request did not finish within its deadline of ${waitedMs} ms`;
      outputs.push({ ...this.outputOf(sequence, 'error'), error: { code, message } });
    }
    return outputs;
  }

  schedule(): SchedulerOutput {
    const scheduled: ScheduledSequence[] = [];
    const preemptedRequestIds: string[] = [];
    const step = ++this.numSteps;
    let tokenBudget = this.config.maxNumBatchedTokens;
    this.markAlone();

    // Decodes first, in admission order: one token each, so that no prompt holds them back.
    // Prompts still being computed wait for the prefill pass below; a sequence whose prompt is
    // computed and whose grammar still compiles has nothing to do this step. A preemption takes
    // sequences out of the running list, so the walk is over a copy of it.
    const order = this.stepOrder;
    for (let sequence = this.running.first; sequence !== null; sequence = this.running.after(sequence)) order.push(sequence);
    const prefilling = this.prefilling;
    for (const sequence of order) {
      if (!sequence.isRunning) continue;
      const numSchedulableTokens = sequence.numSchedulableTokens;
      if (numSchedulableTokens === 0) continue;
      if (numSchedulableTokens > 1) {
        prefilling.push(sequence);
      } else if (this.allocateOrPreempt(sequence, 1, step, preemptedRequestIds)) {
        const entry = this.scheduleChunk(sequence, 1, step);
        scheduled.push(entry);
        tokenBudget -= 1;
        if (sequence.speculationLimit > 0) {
          this.speculating.push(sequence);
          this.speculatingEntries.push(entry);
        }
      }
    }
    order.length = 0;
    tokenBudget -= this.addProposals(scheduled.length, tokenBudget);
    const { maxPrefillTokensBesideDecodes, prefillTokensPerDecodeRow, backlogPromptTokens } = this.config;
    // Chunks only while prompts contend: a lone prompt taken whole holds nobody back; nor while
    // they are a backlog, which only the whole budget drains soonest.
    const numPendingPrompts = prefilling.length + this.waiting.size;
    const isBacklog = backlogPromptTokens !== undefined && this.numPendingPromptTokens(prefilling) > backlogPromptTokens;
    const chunksSmall = scheduled.length > 0 && maxPrefillTokensBesideDecodes !== undefined && numPendingPrompts > 1 && !isBacklog;
    const numPrefillTokensBesideDecodes = Math.max(maxPrefillTokensBesideDecodes ?? 0, (prefillTokensPerDecodeRow ?? 0) * scheduled.length);
    const numWithheldTokens = chunksSmall ? Math.max(0, tokenBudget - numPrefillTokensBesideDecodes) : 0;
    tokenBudget -= numWithheldTokens;

    // Then prompts, in policy order (arrival, or priority then arrival): those partly computed
    // and those waiting, at most maxNumPartialPrefills of them, of which maxLongPartialPrefills
    // long ones. A long prompt that finds no room waits for the next step; one at the head of
    // the queue holds the queue (FCFS), one partly computed lets the next prompt go.
    prefilling.sort(this.config.policy === 'priority' ? byPriority : byArrival);
    const { maxNumPartialPrefills, maxLongPartialPrefills, longPrefillTokenThreshold } = this.config;
    let numPrefills = 0;
    let numLongPrefills = 0;
    let next = 0;
    let isHeadBlocked = false;
    while (tokenBudget > 0 && numPrefills < maxNumPartialPrefills) {
      while (next < prefilling.length && !prefilling[next].isRunning) next++;
      const running = next < prefilling.length ? prefilling[next] : null;
      // Admitting while preempting would hand the freed blocks straight to a newcomer.
      const canAdmit = !isHeadBlocked && preemptedRequestIds.length === 0 && this.running.size < this.config.maxNumSeqs;
      const waiting = canAdmit ? this.waiting.peek() : null;
      if (running === null && waiting === null) break;
      const canTakeLong = numLongPrefills < maxLongPartialPrefills;
      let sequence: Sequence;
      let numNewTokens: number;
      if (running === null || (waiting !== null && this.runsBefore(waiting, running))) {
        sequence = waiting!;
        const numAdmittedTokens = this.admit(sequence, tokenBudget, canTakeLong);
        // Its blocks are not free, or it is long and the step has its long prompts: it keeps
        // its place and those after it wait (FCFS), but prompts already running go on.
        if (numAdmittedTokens === null) {
          isHeadBlocked = true;
          continue;
        }
        // Admitted with nothing to compute yet: its grammar holds back the last prompt token.
        if (numAdmittedTokens === 0) continue;
        numNewTokens = numAdmittedTokens;
      } else {
        sequence = running;
        next++;
        if (!canTakeLong && sequence.numTokens - sequence.numComputedTokens > longPrefillTokenThreshold) continue;
        numNewTokens = Math.min(sequence.numSchedulableTokens, tokenBudget);
        if (!this.allocateOrPreempt(sequence, numNewTokens, step, preemptedRequestIds)) continue;
      }
      if (sequence.numTokens - sequence.numComputedTokens > longPrefillTokenThreshold) numLongPrefills++;
      scheduled.push(this.scheduleChunk(sequence, numNewTokens, step));
      tokenBudget -= numNewTokens;
      numPrefills++;
    }
    prefilling.length = 0;

    return {
      scheduled,
      numScheduledTokens: this.config.maxNumBatchedTokens - numWithheldTokens - tokenBudget,
      preemptedRequestIds,
    };
  }

  /** Notes the sequence in flight alone, if one is (Sequence.isAlone). */
  private markAlone(): void {
    const alone = this.running.size + this.waiting.size === 1 ? (this.running.first ?? this.waiting.peek()) : null;
    if (alone === this.aloneSequence) return;
    if (this.aloneSequence !== null) this.aloneSequence.isAlone = false;
    if (alone !== null) alone.isAlone = true;
    this.aloneSequence = alone;
  }

  /**
   * Applies one step's sampled tokens, and after each the tokens its grammar forces (forced,
   * indexed like output.scheduled: jump-forward, emitted without sampling with logprob 0), except
   * the samples of the scheduled indices in withheld; returns the news for every request that has
   * some.
   */
  update(
    output: SchedulerOutput,
    result: RunnerResult,
    forced: ReadonlyArray<readonly number[] | undefined> | null = null,
    withheld: readonly number[] = NONE_WITHHELD,
  ): RequestOutput[] {
    const outputs: RequestOutput[] = [];
    const sampleStride = result.sampleStride ?? 1;
    let firstTokenIndex = 0;
    for (let index = 0; index < output.scheduled.length; index++) {
      const entry = output.scheduled[index];
      const sequence = this.sequences.get(entry.requestId)!;
      if (entry.scoresPrompt) collectPromptLogprobs(sequence, entry, result, firstTokenIndex);
      firstTokenIndex += entry.numScheduledTokens;
      const drafts = entry.draftTokenIds;
      sequence.numComputedTokens += entry.numScheduledTokens - drafts.length;
      if (sequence.numComputedTokens === sequence.numTokens) sequence.isRecomputing = false;
      // A sample withheld (its grammar failed: the mask constrained nothing) is not output; the
      // request ends with the grammar's error before its next step.
      if (!entry.sample || (withheld.length > 0 && withheld.includes(index))) continue;
      // The samples in order, each accepting the proposal it equals, up to the first that
      // differs (or the one after the last proposal), or the first that finishes the request.
      const news = this.outputOf(sequence, null);
      const { numTopLogprobs } = sequence.sampling;
      if (numTopLogprobs > 0) news.newTopLogprobs = [];
      let finishReason: FinishReason | null = null;
      let numAccepted = 0;
      for (let row = index * sampleStride; ; row++) {
        const tokenId = result.sampledTokenIds[row];
        sequence.appendOutputToken(tokenId);
        news.newTokenIds.push(tokenId);
        news.newLogprobs.push(result.sampledLogprobs[row]);
        if (numTopLogprobs > 0) {
          news.newTopLogprobs!.push(topRowOf(result.sampledLogprobs[row], result.topTokenIds, result.topLogprobs, row * TOP_LOGPROBS_STRIDE, numTopLogprobs));
        }
        finishReason = this.finishReasonOf(sequence, tokenId);
        if (finishReason === 'stop') news.stopTokenId = tokenId;
        if (finishReason !== null || numAccepted === drafts.length || tokenId !== drafts[numAccepted]) break;
        numAccepted++;
      }
      this.settleProposals(sequence, entry, numAccepted, finishReason === null);
      if (finishReason !== null) this.finish(sequence);
      news.finishReason = finishReason;
      news.numOutputTokens = sequence.numOutputTokens;
      if (sequence.numDraftTokens > 0) {
        news.numDraftTokens = sequence.numDraftTokens;
        news.numAcceptedDraftTokens = sequence.numAcceptedDraftTokens;
      }
      if (sequence.promptLogprobs !== null && !sequence.hasSentPromptLogprobs) {
        news.promptLogprobs = sequence.promptLogprobs;
        sequence.hasSentPromptLogprobs = true;
      }
      const forcedTokenIds = forced?.[index];
      if (finishReason === null && forcedTokenIds !== undefined) this.appendForcedTokens(sequence, forcedTokenIds, news);
      if (!sequence.hasSampled) {
        sequence.hasSampled = true;
        news.queueTimeMs = sequence.firstScheduledMs - sequence.arrivalMs;
        news.prefillTimeMs = this.now() - sequence.firstScheduledMs;
      }
      outputs.push(news);
    }
    // Named after the steps' accepted proposals: a failed step never reaches here.
    this.kv.commitStep();
    return outputs;
  }

  /**
   * After a speculating sequence's samples: the accepted proposals' KV is what plain decoding
   * would have computed, so it counts as computed and its full blocks join the prefix cache;
   * the rejected proposals' slots are given back at once (their blocks were never named). Its
   * acceptance is recorded, or, when it had a proposal it did not verify, how that guess fared.
   */
  private settleProposals(sequence: Sequence, entry: ScheduledSequence, numAccepted: number, goesOn: boolean): void {
    const numDrafts = entry.draftTokenIds.length;
    const speculator = this.config.speculator;
    if (speculator == null || sequence.acceptance === null) return;
    if (numDrafts > 0) {
      // Every proposal verified was accepted: the proposer's next guess, if it had one, meets the
      // token sampled after them, which is what plain decoding emits there. Measuring it keeps a
      // sequence whose count was cut short from never showing how far its guesses go on.
      const nextGuessTokenId = numAccepted === numDrafts && sequence.proposal.length > numDrafts ? sequence.proposal[numDrafts] : null;
      const nextGuessAccepted = nextGuessTokenId === null ? null : nextGuessTokenId === sequence.tokenIds[sequence.numTokens - 1];
      speculator.recordVerification(sequence.acceptance, numDrafts, numAccepted, nextGuessAccepted);
      sequence.numDraftTokens += numDrafts;
      sequence.numAcceptedDraftTokens += numAccepted;
      this.kv.cacheScheduledBlocks(sequence, sequence.numComputedTokens + numAccepted);
      sequence.numComputedTokens += numAccepted;
      if (goesOn) this.kv.trimSlots(sequence, sequence.numTokens);
    } else if (sequence.proposal.length > 0 && entry.numOutputTokens + 1 <= sequence.numOutputTokens) {
      speculator.recordUnverifiedGuess(sequence.acceptance, sequence.proposal[0], sequence.tokenIds[sequence.numPromptTokens + entry.numOutputTokens]);
    }
    // Truncating an array is a runtime call even when it is empty (~30 ns): at batch 32 every
    // step would pay it per sequence though nothing was proposed.
    if (sequence.proposal.length !== 0) sequence.proposal.length = 0;
  }

  /** Forced tokens up to the output's limits; the last one may finish the request by length. */
  private appendForcedTokens(sequence: Sequence, tokenIds: readonly number[], news: RequestOutput): void {
    for (const tokenId of tokenIds) {
      sequence.appendOutputToken(tokenId);
      news.newTokenIds.push(tokenId);
      news.newLogprobs.push(0);
      if (news.newTopLogprobs !== undefined) news.newTopLogprobs.push({ logprob: 0, topTokenIds: [], topLogprobs: [] });
      const finishReason = this.lengthLimitOf(sequence);
      if (finishReason === null) continue;
      this.finish(sequence);
      news.finishReason = finishReason;
      news.numOutputTokens = sequence.numOutputTokens;
      break;
    }
    news.numOutputTokens = sequence.numOutputTokens;
  }

  /** Ends every request of a step the runner could not execute; the blocks it named hold no KV. */
  failStep(output: SchedulerOutput, error: EngineError): RequestOutput[] {
    this.kv.forgetStep();
    const outputs: RequestOutput[] = [];
    for (const entry of output.scheduled) {
      const sequence = this.sequences.get(entry.requestId);
      if (sequence === undefined) continue;
      this.finish(sequence);
      outputs.push({ ...this.outputOf(sequence, 'error'), error });
    }
    return outputs;
  }

  /** Prompt tokens still to compute: those waiting (less their cached prefixes) and those partly computed. */
  private numPendingPromptTokens(prefilling: readonly Sequence[]): number {
    let numTokens = this.numQueuedPrefillTokens;
    for (const sequence of prefilling) numTokens += sequence.numTokens - sequence.numComputedTokens;
    return numTokens;
  }

  /**
   * Admits the waiting head: its cached prefix, then blocks for its first chunk; returns that
   * chunk's tokens, or null when its blocks are not free, or when it is long and canTakeLong is
   * false (it stays at the head). A preempted sequence is readmitted only with blocks for
   * everything it must recompute, so it never needs a block, and never preempts, before it has
   * caught up; except on a model with sliding-window layers, whose groups need far fewer blocks
   * as a sequence advances than up front (every position's block at once would refuse a long
   * conversation that fits).
   */
  private admit(sequence: Sequence, tokenBudget: number, canTakeLong: boolean): number | null {
    const prefix = this.kv.findCachedPrefix(sequence);
    const numPrefixTokens = prefix.numBlocks * this.config.blockSizeTokens;
    const numToCompute = sequence.numTokens - numPrefixTokens;
    if (!canTakeLong && numToCompute > this.config.longPrefillTokenThreshold) return null;
    // A grammar still compiling holds back the last token (the one that samples); such a
    // sequence may be admitted with nothing to compute yet, which keeps the queue moving.
    const numHeldBack = sequence.numSchedulableTokens < sequence.numTokens - sequence.numComputedTokens ? 1 : 0;
    const numNewTokens = Math.min(numToCompute - numHeldBack, tokenBudget);
    const upFront = sequence.wasAdmitted && !this.kv.hasSlidingWindows;
    if (!this.kv.allocateSlots(sequence, upFront ? numToCompute : numNewTokens, prefix)) return null;
    this.kv.recordLookup(sequence.numTokens, numPrefixTokens);
    this.waiting.remove(sequence);
    this.numQueuedPrefillTokens -= sequence.numQueuedPrefillTokens;
    this.running.pushBack(sequence);
    sequence.isRunning = true;
    if (sequence.wasAdmitted) {
      sequence.isRecomputing = true;
    } else {
      sequence.wasAdmitted = true;
      sequence.firstScheduledMs = this.now();
      sequence.numCachedTokens = numPrefixTokens;
    }
    return numNewTokens;
  }

  private scheduleChunk(sequence: Sequence, numNewTokens: number, step: number): ScheduledSequence {
    sequence.scheduledStep = step;
    this.kv.cacheScheduledBlocks(sequence, sequence.numComputedTokens + numNewTokens);
    return {
      requestId: sequence.requestId,
      tokenIds: sequence.tokenIds,
      startPosition: sequence.numComputedTokens,
      numScheduledTokens: numNewTokens,
      blockTables: sequence.blockTables,
      blockIds: sequence.blockTables[0],
      sample: sequence.numComputedTokens + numNewTokens === sequence.numTokens,
      numOutputTokens: sequence.numOutputTokens,
      sampling: sequence.sampling,
      penaltyHistory: sequence.penaltyHistory,
      bannedTokenIds: sequence.numOutputTokens < sequence.sampling.minTokens ? this.stopTokenIdsOf(sequence) : NO_TOKENS,
      scoresPrompt: scoresPrompt(sequence, numNewTokens),
      grammar: sequence.grammar,
      draftTokenIds: NO_TOKENS,
    };
  }

  /**
   * Extends the step's decodes that speculate with the proposals the speculator picks, each
   * within the blocks free now (a proposal never preempts anyone); returns the tokens they take.
   * A sequence's limit keeps every sample it might emit within max_tokens and the context, and
   * on one side of min_tokens (the sampler applies one set of bans to all its rows).
   */
  private addProposals(numScheduledSeqs: number, tokenBudget: number): number {
    const sequences = this.speculating;
    const entries = this.speculatingEntries;
    const speculator = this.config.speculator;
    if (sequences.length === 0 || speculator == null || !speculator.mayPropose(numScheduledSeqs)) {
      // A compute-bound step (the usual one at a large batch) proposes nothing: no per-sequence work.
      sequences.length = 0;
      entries.length = 0;
      return 0;
    }
    for (const sequence of sequences) {
      sequence.maxDraftTokens = this.draftLimitOf(sequence);
      if (sequence.draftTokenIds.length !== 0) sequence.draftTokenIds.length = 0;
    }
    const numChosen = speculator.choose(sequences, numScheduledSeqs, tokenBudget);
    let numDraftTokens = 0;
    for (let i = 0; i < sequences.length; i++) {
      const sequence = sequences[i];
      const numDrafts = numChosen[i];
      if (numDrafts === 0 || !this.kv.allocateSlots(sequence, 1 + numDrafts)) continue;
      for (let d = 0; d < numDrafts; d++) sequence.draftTokenIds.push(sequence.proposal[d]);
      entries[i].numScheduledTokens = 1 + numDrafts;
      entries[i].draftTokenIds = sequence.draftTokenIds;
      numDraftTokens += numDrafts;
    }
    sequences.length = 0;
    entries.length = 0;
    return numDraftTokens;
  }

  /** The most proposals the sequence may verify in its next decode. */
  private draftLimitOf(sequence: Sequence): number {
    const { maxTokens, minTokens } = sequence.sampling;
    const numOutputTokens = sequence.numOutputTokens;
    let limit = Math.min(sequence.speculationLimit, maxTokens - numOutputTokens - 1, this.config.maxModelLen - sequence.numTokens - 1);
    if (numOutputTokens < minTokens) limit = Math.min(limit, minTokens - numOutputTokens - 1);
    return Math.max(0, limit);
  }

  /**
   * The running sequences whose next step is a decode that may speculate, each with its
   * maxDraftTokens set: what a proposer that works ahead of the step (a draft model) prepares
   * for. The step's own choice (addProposals) may still leave some out.
   */
  speculationCandidates(): readonly Sequence[] {
    const candidates = this.candidates;
    candidates.length = 0;
    for (let sequence = this.running.first; sequence !== null; sequence = this.running.after(sequence)) {
      if (sequence.speculationLimit === 0 || sequence.numSchedulableTokens !== 1) continue;
      sequence.maxDraftTokens = this.draftLimitOf(sequence);
      if (sequence.maxDraftTokens > 0) candidates.push(sequence);
    }
    return candidates;
  }

  /**
   * Blocks for the sequence's next numNewTokens tokens, preempting others (or itself) while the
   * pool is short; false when it was preempted itself.
   */
  private allocateOrPreempt(sequence: Sequence, numNewTokens: number, step: number, preemptedRequestIds: string[]): boolean {
    while (!this.kv.allocateSlots(sequence, numNewTokens)) {
      const victim = this.pickVictim(sequence, step);
      this.preempt(victim);
      preemptedRequestIds.push(victim.requestId);
      if (victim === sequence) return false;
    }
    return true;
  }

  /**
   * The running sequence to preempt so that `needy` gets blocks: among those not yet scheduled
   * this step (it included), the most recently admitted (FCFS) or the lowest-priority, latest
   * one, sparing any that is still catching up after its own preemption while another will do.
   */
  private pickVictim(needy: Sequence, step: number): Sequence {
    let victim: Sequence = needy;
    for (let sequence = this.running.first; sequence !== null; sequence = this.running.after(sequence)) {
      if (sequence.scheduledStep === step || sequence === needy || sequence.isRecomputing) continue;
      if (this.preemptsBefore(sequence, victim)) victim = sequence;
    }
    return victim;
  }

  /** Whether a runs before b in the policy's order: arrival, or priority then arrival. */
  private runsBefore(a: Sequence, b: Sequence): boolean {
    return this.config.policy === 'priority' ? byPriority(a, b) < 0 : a.arrivalIndex < b.arrivalIndex;
  }

  private preemptsBefore(a: Sequence, b: Sequence): boolean {
    if (this.config.policy === 'priority' && a.priority !== b.priority) return a.priority > b.priority;
    return a.arrivalIndex > b.arrivalIndex;
  }

  private preempt(sequence: Sequence): void {
    this.kv.free(sequence);
    sequence.numComputedTokens = 0;
    sequence.isRecomputing = false;
    this.running.remove(sequence);
    sequence.isRunning = false;
    this.pushWaiting(sequence, true);
    this.numPreempted++;
  }

  private pushWaiting(sequence: Sequence, preempted: boolean): void {
    if (preempted) this.waiting.pushPreempted(sequence);
    else this.waiting.push(sequence);
    // Only what it must compute: a router that counted whole prompts saw the worker holding a
    // conversation's history as far busier than it is, and sent the next turn elsewhere.
    const numCachedTokens = this.kv.findCachedPrefix(sequence).numBlocks * this.config.blockSizeTokens;
    sequence.numQueuedPrefillTokens = sequence.numTokens - numCachedTokens;
    this.numQueuedPrefillTokens += sequence.numQueuedPrefillTokens;
  }

  private finish(sequence: Sequence): void {
    this.kv.free(sequence);
    this.config.speculator?.finish(sequence);
    this.sequences.delete(sequence.requestId);
    if (sequence.isRunning) {
      this.running.remove(sequence);
    } else {
      this.waiting.remove(sequence);
      this.numQueuedPrefillTokens -= sequence.numQueuedPrefillTokens;
    }
  }

  private addDeadline(atMs: number, sequence: Sequence, code: EngineErrorCode & Deadline['code']): void {
    pushDeadline(this.deadlines, { atMs, sequence, code });
  }

  /** The tokens that would end the sequence: min_tokens bans them until it has enough. */
  private stopTokenIdsOf(sequence: Sequence): readonly number[] {
    const { sampling } = sequence;
    return sampling.ignoreEos ? sampling.stopTokenIds : [...this.config.generationDefaults.eosTokenIds, ...sampling.stopTokenIds];
  }

  private finishReasonOf(sequence: Sequence, tokenId: number): FinishReason | null {
    const { sampling } = sequence;
    // A grammar that has accepted its stop token is complete, whatever min_tokens or ignore_eos say.
    if (sequence.grammar?.stopTokenIds.includes(tokenId)) return 'stop';
    if (sequence.numOutputTokens > sampling.minTokens) {
      if (!sampling.ignoreEos && this.config.generationDefaults.eosTokenIds.includes(tokenId)) return 'stop';
      if (sampling.stopTokenIds.includes(tokenId)) return 'stop';
    }
    return this.lengthLimitOf(sequence);
  }

  private lengthLimitOf(sequence: Sequence): FinishReason | null {
    if (sequence.numOutputTokens >= sequence.sampling.maxTokens) return 'length';
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
      numCachedTokens: sequence.numCachedTokens,
      numOutputTokens: sequence.numOutputTokens,
    };
  }
}

function byArrival(a: Sequence, b: Sequence): number {
  return a.arrivalIndex - b.arrivalIndex;
}

function byPriority(a: Sequence, b: Sequence): number {
  return a.priority - b.priority || a.arrivalIndex - b.arrivalIndex;
}

/** Prompt positions score the token after them: the last prompt position predicts the output. */
function numScoredPositions(sequence: Sequence): number {
  return Math.max(0, sequence.numPromptTokens - 1);
}

/** Whether a chunk of numNewTokens from numComputedTokens on reaches prompt positions not yet scored. */
function scoresPrompt(sequence: Sequence, numNewTokens: number): boolean {
  const scored = sequence.promptLogprobs;
  if (scored === null || scored.length === numScoredPositions(sequence)) return false;
  return sequence.numComputedTokens <= scored.length && scored.length < sequence.numComputedTokens + numNewTokens;
}

/** Appends the scores of the chunk's positions that are not yet scored; entry is from this step. */
function collectPromptLogprobs(sequence: Sequence, entry: ScheduledSequence, result: RunnerResult, firstTokenIndex: number): void {
  const scored = sequence.promptLogprobs!;
  const numTop = sequence.sampling.numPromptLogprobs!;
  const end = Math.min(entry.startPosition + entry.numScheduledTokens, numScoredPositions(sequence));
  for (let position = scored.length; position < end; position++) {
    const token = firstTokenIndex + position - entry.startPosition;
    const top = topRowOf(result.promptLogprobs[token], result.promptTopTokenIds, result.promptTopLogprobs, token * TOP_LOGPROBS_STRIDE, numTop);
    scored.push({ ...top, rank: result.promptRanks[token] });
  }
}

function topRowOf(logprob: number, ids: Int32Array, logprobs: Float32Array, rowStart: number, numTop: number): TokenLogprobs {
  return {
    logprob,
    topTokenIds: Array.from(ids.subarray(rowStart, rowStart + numTop)),
    topLogprobs: Array.from(logprobs.subarray(rowStart, rowStart + numTop)),
  };
}

/** A binary min-heap of deadlines by time. */
function pushDeadline(heap: Deadline[], deadline: Deadline): void {
  let index = heap.length;
  heap.push(deadline);
  while (index > 0) {
    const parent = (index - 1) >> 1;
    if (heap[parent].atMs <= deadline.atMs) break;
    heap[index] = heap[parent];
    index = parent;
  }
  heap[index] = deadline;
}

function popDeadline(heap: Deadline[]): Deadline {
  const top = heap[0];
  const last = heap.pop()!;
  if (heap.length === 0) return top;
  let index = 0;
  for (;;) {
    let child = 2 * index + 1;
    if (child >= heap.length) break;
    if (child + 1 < heap.length && heap[child + 1].atMs < heap[child].atMs) child++;
    if (heap[child].atMs >= last.atMs) break;
    heap[index] = heap[child];
    index = child;
  }
  heap[index] = last;
  return top;
}
