// One request's state inside the scheduler. There is no prefill or decode phase: a sequence
// has numTokens known tokens (prompt, then output) of which numComputedTokens have their KV in
// the cache, and every step closes some of that gap.
import type { BlockHash } from './kv/block-hash.ts';
import type { KvSequence } from './kv/kv-cache-manager.ts';
import type { Queued } from './queues.ts';
import type { ResolvedSampling } from './sampling.ts';
import type { AcceptanceStats } from './spec/adaptive.ts';
import type { PromptTokenLogprobs } from './types.ts';

/** The distinct tokens the penalties weigh: the prompt's, and each output token's count. */
export interface PenaltyHistory {
  readonly promptTokenIds: ReadonlySet<number>;
  readonly outputCounts: Map<number, number>;
}

/** What the scheduler needs of a structured output's grammar (engine/grammar/). */
export interface GrammarGate {
  /** Compiled, with its matcher open: until then the sequence computes its prompt but does not sample. */
  readonly isReady: boolean;
  /** Tokens that end the output under the grammar: sampling one finishes the request with 'stop'. */
  readonly stopTokenIds: readonly number[];
  /**
   * Compiling, and its first mask comes right after the compile: a pass may sample it before
   * isReady, its sampler waiting for that mask (only a sequence alone: nobody else's step waits).
   */
  readonly maySampleCompiling: boolean;
}

export interface SequenceInit {
  requestId: string;
  promptTokenIds: readonly number[];
  sampling: ResolvedSampling;
  priority: number;
  arrivalIndex: number;
  arrivalMs: number;
  /** Null: the sequence neither reuses nor offers cached blocks. */
  cacheRoot: BlockHash | null;
  /** A structured output's grammar; null for free text. */
  grammar: GrammarGate | null;
  /** Most proposals it verifies per step (0: it never speculates); acceptance stats when it may. */
  speculationLimit?: number;
  acceptance?: AcceptanceStats | null;
}

export class Sequence implements KvSequence, Queued {
  readonly requestId: string;
  readonly numPromptTokens: number;
  /** Prompt tokens, then output tokens as they are sampled. */
  readonly tokenIds: number[];
  readonly sampling: ResolvedSampling;
  readonly priority: number;
  readonly arrivalIndex: number;
  readonly arrivalMs: number;
  readonly cacheRoot: BlockHash | null;
  readonly grammar: GrammarGate | null;
  /**
   * Per KV-cache group, position-ordered KV blocks: block i holds positions [i * blockSize,
   * (i + 1) * blockSize), NO_BLOCK where a sliding window has left it (kv-cache-manager.ts).
   */
  readonly blockTables: number[][] = [[]];
  readonly blockHashes: BlockHash[] = [];
  numComputedTokens = 0;
  /** The only sequence in flight, as of the scheduler's last step (a step of it alone waits for no one else). */
  isAlone = false;
  /** Prompt tokens found in the prefix cache when the sequence was first admitted. */
  numCachedTokens = 0;
  /** What it adds to the scheduler's queued prefill tokens while it waits: its tokens the cache lacked when it was queued. */
  numQueuedPrefillTokens = 0;
  /** Admitted at least once (a waiting sequence that was admitted before was preempted). */
  wasAdmitted = false;
  /** When it was first admitted (the scheduler's clock); its first output token reports the wait. */
  firstScheduledMs = 0;
  /** The scheduler's step that last scheduled it. */
  scheduledStep = 0;
  /** In the running list (else in the waiting queue). */
  isRunning = false;
  /**
   * Readmitted after a preemption and not yet caught up with its known tokens: not preempted
   * again while another victim exists (vllm #25538).
   */
  isRecomputing = false;
  /** What the penalties look at; null when none applies. */
  readonly penaltyHistory: PenaltyHistory | null;
  /**
   * With prompt logprobs: entry i scores prompt token i + 1, filled chunk by chunk (a
   * recomputation after a preemption skips what is here); null without.
   */
  readonly promptLogprobs: PromptTokenLogprobs[] | null;
  /** The first output carried promptLogprobs. */
  hasSentPromptLogprobs = false;
  /** A token has been sampled (the first one's output reports the queue and prefill times). */
  hasSampled = false;
  /** Most proposals it verifies in one step, whatever else limits it; 0 when it never speculates. */
  readonly speculationLimit: number;
  /** How its proposals fared (spec/adaptive.ts); null when it never speculates. */
  readonly acceptance: AcceptanceStats | null;
  /** This step's limit on its proposals (speculationLimit, cut by max_tokens, min_tokens, the context). */
  maxDraftTokens = 0;
  /** This step's proposal, and the part of it the step verifies (its last query tokens). */
  readonly proposal: number[] = [];
  readonly draftTokenIds: number[] = [];
  /** Over the request: proposals verified, and of them accepted. */
  numDraftTokens = 0;
  numAcceptedDraftTokens = 0;
  prev: Sequence | null = null;
  next: Sequence | null = null;
  heapIndex = -1;

  constructor(init: SequenceInit) {
    this.requestId = init.requestId;
    this.numPromptTokens = init.promptTokenIds.length;
    this.tokenIds = init.promptTokenIds.slice();
    this.sampling = init.sampling;
    this.priority = init.priority;
    this.arrivalIndex = init.arrivalIndex;
    this.arrivalMs = init.arrivalMs;
    this.cacheRoot = init.cacheRoot;
    this.grammar = init.grammar;
    this.speculationLimit = init.speculationLimit ?? 0;
    this.acceptance = init.acceptance ?? null;
    const { presencePenalty, frequencyPenalty, repetitionPenalty } = init.sampling;
    const penalized = presencePenalty !== 0 || frequencyPenalty !== 0 || repetitionPenalty !== 1;
    this.penaltyHistory = penalized ? { promptTokenIds: new Set(init.promptTokenIds), outputCounts: new Map() } : null;
    this.promptLogprobs = init.sampling.numPromptLogprobs === null ? null : [];
  }

  get numTokens(): number {
    return this.tokenIds.length;
  }

  get numOutputTokens(): number {
    return this.tokenIds.length - this.numPromptTokens;
  }

  /** Tokens a step may compute now: all it knows, but the last while its grammar compiles (that one samples). */
  get numSchedulableTokens(): number {
    const gap = this.tokenIds.length - this.numComputedTokens;
    if (this.grammar === null || this.grammar.isReady) return gap;
    return this.grammar.maySampleCompiling && this.isAlone ? gap : gap - 1;
  }

  appendOutputToken(tokenId: number): void {
    this.tokenIds.push(tokenId);
    const counts = this.penaltyHistory?.outputCounts;
    counts?.set(tokenId, (counts.get(tokenId) ?? 0) + 1);
  }
}
