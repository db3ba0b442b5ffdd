// Plain data that crosses the engine boundary: token ids in, token ids out.
import type { BlockHash } from './kv/block-hash.ts';
import type { EngineError } from './errors.ts';

/**
 * Bounds of the numeric sampling parameters that the engine's wire narrows (int32 fields, float
 * logits): the gateway checks each request against them before anything is narrowed (top_k
 * 2147483648 would arrive as -2147483648), and the engine again.
 */
export const INT32_MAX = 2 ** 31 - 1;
export const INT32_MIN = -(2 ** 31);
/**
 * vLLM's bound (0, 2]: a penalty of 1e308 is Infinity as a float, and a logit of 0 times it NaN.
 */
export const MAX_REPETITION_PENALTY = 2;

/** Unset fields take the checkpoint's generation_config.json defaults, then the engine's. */
export interface SamplingParams {
  temperature?: number;
  topP?: number;
  topK?: number;
  /** Drop tokens less likely than minP times the likeliest (after temperature); 0 disables. */
  minP?: number;
  /** OpenAI's penalties on tokens already in the output: once, and per occurrence. */
  presencePenalty?: number;
  frequencyPenalty?: number;
  /** vLLM's: logits of tokens in the prompt or the output are divided (positive) or multiplied by it; 1 disables. */
  repetitionPenalty?: number;
  /** Added to a token's logit before sampling; -Infinity bans it. */
  logitBias?: ReadonlyMap<number, number>;
  seed?: bigint;
  maxTokens?: number;
  /** No stop token or EOS ends the output before this many tokens. */
  minTokens?: number;
  stopTokenIds?: number[];
  ignoreEos?: boolean;
  /** The most likely alternatives reported with each output token, 0 to 20 (OpenAI's top_logprobs). */
  numTopLogprobs?: number;
  /**
   * Report the prompt tokens' log-probabilities with this many alternatives each, 0 to 20
   * (vLLM's prompt_logprobs); unset reports none. Such a request computes its whole prompt.
   */
  numPromptLogprobs?: number;
}

/**
 * What a structured output must match: plain data, compiled into a grammar by the engine
 * (engine/grammar/). The gateway checks the shape; the engine checks what its grammar engine
 * supports and answers `invalid_request` naming what it cannot honour, before any token.
 */
export type StructuredConstraint =
  /** A JSON Schema as JSON text; the output is one JSON value valid against it, on one line. */
  | { kind: 'json_schema'; schema: string }
  /** Any JSON object (OpenAI's JSON mode). */
  | { kind: 'json_object' }
  /** The whole output matches the regular expression. */
  | { kind: 'regex'; pattern: string }
  /** The output is exactly one of the strings. */
  | { kind: 'choice'; choices: string[] }
  /** An EBNF grammar (GBNF-style rules, `root` the start rule). */
  | { kind: 'grammar'; grammar: string }
  /** xgrammar's structural tag (JSON text): formats composed of tags, triggers, schemas and text. */
  | { kind: 'structural_tag'; structuralTag: string };

export interface StructuredOutput {
  constraint: StructuredConstraint;
  /**
   * The output is free text until it contains this string (a reasoning model's end of thinking,
   * `</think>`); the constraint applies to what follows it.
   */
  constrainAfter?: string;
  /**
   * Tokens the grammar forces are emitted without sampling (jump-forward). On by default; such a
   * token's logprob is 0 (certain under the grammar) with no alternatives, so a request that
   * reports logprobs turns it off.
   */
  jumpForward?: boolean;
  /**
   * Tokens output first, without sampling and unseen by the grammar, which applies after them:
   * a special token no grammar can spell (Mistral's [TOOL_CALLS] before forced calls), so the
   * output is token for token what the model writes itself. Not with constrainAfter.
   */
  prefixTokenIds?: readonly number[];
}

export interface GenerateRequest {
  requestId: string;
  promptTokenIds: number[];
  sampling: SamplingParams;
  /** Constrained decoding; unset: free text. */
  structuredOutput?: StructuredOutput;
  /** Lower runs first under the priority policy (vLLM's convention); 0 by default. */
  priority?: number;
  /** Only requests with the same salt share prefix-cache blocks (tenant isolation). */
  cacheSalt?: string;
  /** Ends the request with 'queue_timeout' if it has not started this long after it arrived. */
  queueTimeoutMs?: number;
  /** Ends the request with 'request_timeout' if it has not finished this long after it arrived. */
  timeoutMs?: number;
  /**
   * Speculative decoding: the most tokens proposed for it per step, 0 for none; the model's
   * speculative_config's num_speculative_tokens when absent (and nothing without one).
   */
  numSpeculativeTokens?: number;
  /** The client request's id (the gateway's x-request-id) for the worker's log lines; choices share it. */
  externalRequestId?: string;
}

export type FinishReason = 'stop' | 'length' | 'abort' | 'error';

/** A token's log-probability (under the raw logits), with the likeliest alternatives when asked for. */
export interface TokenLogprobs {
  logprob: number;
  /** Most likely first; ties to the lower id. */
  topTokenIds: number[];
  topLogprobs: number[];
}

export interface PromptTokenLogprobs extends TokenLogprobs {
  /** 1 + the tokens ranked before this one (a larger logit, or an equal one with a lower id). */
  rank: number;
}

/** One step's worth of news about one request. */
export interface RequestOutput {
  requestId: string;
  newTokenIds: number[];
  /** Log-probabilities of newTokenIds, same length. */
  newLogprobs: number[];
  /** With numTopLogprobs > 0: the alternatives of each new token, same length. */
  newTopLogprobs?: TokenLogprobs[];
  /**
   * With numPromptLogprobs set, in the first output: entry i scores prompt token i + 1 given
   * the tokens before it (the first prompt token has no score).
   */
  promptLogprobs?: PromptTokenLogprobs[];
  finishReason: FinishReason | null;
  /**
   * The stop token that ended the request, when finishReason is 'stop'. It is also the last of
   * newTokenIds and counts in numOutputTokens (as OpenAI usage counts EOS); renderers leave its
   * text out.
   */
  stopTokenId?: number;
  numPromptTokens: number;
  /** Prompt tokens whose KV came from the prefix cache (usage's prompt_tokens_details.cached_tokens). */
  numCachedTokens: number;
  numOutputTokens: number;
  error?: EngineError;
  /**
   * With the first sampled token, on the worker's clock: from arrival to first scheduled (vLLM's
   * queue time), and from first scheduled to the first token (its prefill time). Tokens a grammar
   * forces from its start may be output before it.
   */
  queueTimeMs?: number;
  prefillTimeMs?: number;
  /**
   * Speculative decoding, so far in the request: tokens proposed and verified, and of them
   * accepted (usage's completion_tokens_details: accepted and rejected prediction tokens).
   * Absent while none was verified.
   */
  numDraftTokens?: number;
  numAcceptedDraftTokens?: number;
}

/** A worker's load, as routers weigh it: pushed with every step. */
export interface WorkerLoad {
  numRunning: number;
  numWaiting: number;
  numFreeBlocks: number;
  numTotalBlocks: number;
  /** Prompt tokens the waiting requests still have to compute. */
  numQueuedPrefillTokens: number;
  /** Blocks the prefix cache names by hash: a router's index of the KV events counts as many. */
  numCachedBlocks: number;
}

/** What the prefix cache learned, for the router's index (vLLM's KV events). */
export type KvEvent =
  | { kind: 'stored'; blockHashes: BlockHash[] }
  | { kind: 'removed'; blockHashes: BlockHash[] }
  /** Every block the listener knew of is gone (a new stream starts with it). */
  | { kind: 'cleared' };

/** What one engine step did, beside each request's news. */
export interface StepStats {
  numScheduledTokens: number;
  numScheduledSeqs: number;
  /** Sequences preempted by this step's scheduling. */
  numPreempted: number;
  /** Scheduling and bookkeeping around the forward pass, and the forward pass itself. */
  scheduleMs: number;
  forwardMs: number;
  /** Prefix-cache lookups at admission this step: prompt tokens queried and found. */
  numPrefixQueriedTokens: number;
  numPrefixHitTokens: number;
  kvUsage: number;
  /** The worker process's resident set size, sampled at most once a second. */
  residentMemoryBytes: number;
  /** Speculative decoding's proposals this step (vLLM's spec_decode counters); absent in a step that verified none. */
  specDecode?: SpecDecodeCounters;
}

/** Speculative decoding's counters over some steps (vLLM's spec_decode metrics). */
export interface SpecDecodeCounters {
  /** Verifications of at least one proposal. */
  numDrafts: number;
  numDraftTokens: number;
  numAcceptedTokens: number;
  /** [position]: proposals accepted at each position (0-based) of their draft. */
  numAcceptedTokensPerPosition: number[];
}

/** Everything a worker reports between two steps: each listener gets it once per step. */
export interface StepReport {
  events: KvEvent[];
  load: WorkerLoad;
  /** Null for a report without a step (a listener's first, or an idle worker's change). */
  stats: StepStats | null;
}

/** Takes a worker's reports, in-process (Engine.onReport) or over its stream (GrpcEngineClient.onReport). */
export type ReportListener = (report: StepReport) => void;

export interface WorkerModelInfo {
  modelName: string;
  maxModelLen: number;
  vocabSize: number;
  blockSizeTokens: number;
  eosTokenIds: number[];
  /** How its KV events name blocks (kv/block-hash.ts HASH_SCHEME): a router must hash the same way. */
  blockHashScheme: string;
}

/** How the gateway (or any client) talks to one engine worker, local or remote. */
export interface EngineClient {
  readonly address: string;
  /** Streams outputs for one request; the last one has a finishReason. */
  generate(request: GenerateRequest, onOutput: (output: RequestOutput) => void): void;
  abort(requestId: string): void;
  /** The load the worker last reported with a step; null while it is unreachable. */
  readonly load: WorkerLoad | null;
  /** Calls listener with every step report (the first of a connection lists the whole prefix cache). */
  onReport(listener: (report: StepReport) => void): () => void;
  health(): Promise<{ serving: boolean; model: WorkerModelInfo; load: WorkerLoad }>;
  close(): void;
}
