// One generation request against one worker, format-neutral: token ids go out, safe text
// deltas and one finish (or one error) come back. The OpenAI renderers (and later WebSocket
// and KServe) only format what this reports.
import { randomUUID } from 'node:crypto';
import type { EngineError } from '../engine/errors.ts';
import type { PromptTokenLogprobs, RequestOutput, SamplingParams, StructuredOutput } from '../engine/types.ts';
import { ApiError, fromEngineError, publicError } from './errors.ts';
import type { GenerationEnd, RequestTrace } from './logging.ts';
import type { GatewayMetrics } from './metrics.ts';
import type { LoadedModel } from './served-model.ts';
import { createDetokenizer } from './tokenizer/incremental-detokenizer.ts';
import { StopMatcher } from './tokenizer/stop-matcher.ts';

export interface GenerationRequest {
  model: LoadedModel;
  promptTokenIds: number[];
  sampling: SamplingParams;
  stopStrings: readonly string[];
  /** Report each output token's log-probability (and sampling.numTopLogprobs alternatives) along with the text. */
  wantsLogprobs: boolean;
  /** Lower runs first under the priority policy. */
  priority?: number;
  /** Only requests with the same salt share cached prefixes. */
  cacheSalt?: string;
  /** Speculative decoding: most tokens proposed per step (0: none); the model's setting when absent. */
  numSpeculativeTokens?: number;
  /** vLLM's include_stop_str_in_output: a matched stop string, or a stop token's text, ends the text. */
  includeStopStrInOutput?: boolean;
  /** What the output must match (a JSON schema, a regex, forced tool calls, ...); compiled by the worker. */
  structuredOutput?: StructuredOutput;
  /**
   * A conversation's key: its requests prefer the worker that served its previous turn (the
   * `x-session-id` header, router/affinity.ts; a Responses request's previous_response_id).
   */
  affinityKey?: string;
  /** The affinityKey of the conversation's next turn when it differs (a Responses turn's own id). */
  nextTurnKey?: string;
  /** performance.now() when the request arrived, for latency metrics. */
  arrivalMs: number;
  /** Who pays for the tokens (the caller's tokens-per-minute quota), told once when the generation ends. */
  account?: UsageAccount;
  /** The request's access-line record; its id goes to the worker with the request, for the worker's log. */
  trace?: RequestTrace;
}

export interface UsageAccount {
  /** Called once per generation, however it ended; the choices of one request share its prompt. */
  settle(numPromptTokens: number, numOutputTokens: number): void;
}

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  prompt_tokens_details: { cached_tokens: number };
  /**
   * With speculative decoding (OpenAI's Predicted Outputs fields): proposed tokens the model
   * accepted and rejected. Absent when none was proposed.
   */
  completion_tokens_details?: { accepted_prediction_tokens: number; rejected_prediction_tokens: number };
}

/** Speculative decoding's proposals over a generation: verified, and of them accepted. */
export interface DraftUsage {
  numDraftTokens: number;
  numAcceptedDraftTokens: number;
}

/** An output token's log-probability and its likeliest alternatives (empty unless asked for). */
export interface TokenLogprob {
  tokenId: number;
  logprob: number;
  topTokenIds: readonly number[];
  topLogprobs: readonly number[];
}

export interface GenerationFinish {
  finishReason: 'stop' | 'length';
  usage: Usage;
  /** Tokens not yet reported with text (held back, special, or cut by a stop); null without logprobs. */
  tokenLogprobs: TokenLogprob[] | null;
  /** With sampling.numPromptLogprobs: entry i scores prompt token i + 1; otherwise null. */
  promptLogprobs: PromptTokenLogprobs[] | null;
}

const noAlternatives: readonly number[] = [];

/** Usage of one prompt; choices that share it count it once. */
export function usageOf(numPromptTokens: number, numCachedTokens: number, numCompletionTokens: number, drafts?: DraftUsage): Usage {
  const usage: Usage = {
    prompt_tokens: numPromptTokens,
    completion_tokens: numCompletionTokens,
    total_tokens: numPromptTokens + numCompletionTokens,
    prompt_tokens_details: { cached_tokens: numCachedTokens },
  };
  if (drafts !== undefined && drafts.numDraftTokens > 0) {
    usage.completion_tokens_details = {
      accepted_prediction_tokens: drafts.numAcceptedDraftTokens,
      rejected_prediction_tokens: drafts.numDraftTokens - drafts.numAcceptedDraftTokens,
    };
  }
  return usage;
}

export interface GenerationHandlers {
  /**
   * Text that is final: complete characters, no part of a stop string. Never empty. With
   * logprobs, the tokens that arrived since the last call; their text may still be held back.
   * numOutputTokens counts every token generated so far, held-back ones included.
   */
  onText(text: string, tokenLogprobs: TokenLogprob[] | null, numOutputTokens: number): void;
  /** With sampling.numPromptLogprobs: the prompt's log-probabilities, once, before any text. */
  onPromptLogprobs?(promptLogprobs: PromptTokenLogprobs[]): void;
  onFinish(finish: GenerationFinish): void;
  onError(error: ApiError): void;
}

export interface Generation {
  /** The client is gone: the worker drops the request and frees its blocks now. */
  abort(): void;
}

/** The worker failed, not the request, and the client has seen nothing: another worker may take it. */
function canRetryElsewhere(error: EngineError, isStarted: boolean): boolean {
  return !isStarted && error.code === 'engine_unavailable';
}

/** Throws an ApiError when no worker can take the request. */
export function startGeneration(request: GenerationRequest, handlers: GenerationHandlers, metrics: GatewayMetrics): Generation {
  const { model, promptTokenIds } = request;
  const firstRoute = model.router.route({
    promptTokenIds,
    cacheSalt: request.cacheSalt,
    affinityKey: request.affinityKey,
    nextTurnKey: request.nextTurnKey,
    usesPrefixCache: request.sampling.numPromptLogprobs === undefined,
  });
  if (firstRoute === null) {
    throw new ApiError('engine_unavailable', `The model \`${model.name}\` has no workers to serve it.`);
  }
  // A worker that fails the request before it starts hands it to the next one (route.retry).
  let route = firstRoute;
  const requestId = randomUUID();
  const { trace } = request;
  trace?.onStart(model.name, promptTokenIds);
  const observed = metrics.forModel(model.name);
  const detokenizer = createDetokenizer(model.tokenizer);
  const stopMatcher = new StopMatcher(request.stopStrings);
  let numOutputTokens = 0;
  let firstTokenMs = 0;
  let lastTokenMs = 0;
  let numCachedTokens = 0;
  const drafts: DraftUsage = { numDraftTokens: 0, numAcceptedDraftTokens: 0 };
  let promptLogprobs: PromptTokenLogprobs[] | null = null;
  let isFinished = false;
  let isStarted = false;
  let pendingLogprobs: TokenLogprob[] | null = request.wantsLogprobs ? [] : null;

  const takeLogprobs = () => {
    if (pendingLogprobs === null) return null;
    const taken = pendingLogprobs;
    pendingLogprobs = [];
    return taken;
  };
  const emit = (text: string) => {
    if (text === '') return;
    trace?.onText(text);
    handlers.onText(text, takeLogprobs(), numOutputTokens);
  };
  /** Every way a generation ends passes here once. */
  const end = (how: GenerationEnd) => {
    isFinished = true;
    request.account?.settle(promptTokenIds.length, numOutputTokens);
    route.finished();
    observed.ended(how);
    trace?.onEnd(numOutputTokens, how);
  };
  const finish = (finishReason: 'stop' | 'length') => {
    end(finishReason);
    const decodeSeconds = numOutputTokens === 0 ? 0 : (lastTokenMs - firstTokenMs) / 1000;
    observed.finished((performance.now() - request.arrivalMs) / 1000, decodeSeconds, promptTokenIds.length, numOutputTokens);
    handlers.onFinish({
      finishReason,
      usage: usageOf(promptTokenIds.length, numCachedTokens, numOutputTokens, drafts),
      tokenLogprobs: takeLogprobs(),
      promptLogprobs,
    });
  };
  const fail = (error: ApiError) => {
    end(error.code === 'request_aborted' ? 'abort' : 'error');
    handlers.onError(error);
  };
  const observeTokens = (output: RequestOutput) => {
    const numNewTokens = output.newTokenIds.length;
    if (numNewTokens === 0) return;
    const nowMs = performance.now();
    if (numOutputTokens === 0) {
      firstTokenMs = nowMs;
      const ttftMs = nowMs - request.arrivalMs;
      observed.firstToken(ttftMs / 1000);
      trace?.onFirstToken(ttftMs);
      // Tokens of the same step as the first: no gap between them.
      observed.interTokens(0, numNewTokens - 1);
    } else {
      observed.interTokens((nowMs - lastTokenMs) / 1000 / numNewTokens, numNewTokens);
    }
    // With the first sampled token (a grammar's forced start may come before it).
    if (output.queueTimeMs !== undefined && output.prefillTimeMs !== undefined) {
      observed.engineTimings(output.queueTimeMs / 1000, output.prefillTimeMs / 1000);
    }
    lastTokenMs = nowMs;
  };

  const handleOutput = (output: RequestOutput) => {
    if (output.error !== undefined || output.finishReason === 'error') {
      const error = output.error ?? { code: 'internal_error', message: 'The worker failed the request.' };
      const next = canRetryElsewhere(error, isStarted) ? route.retry() : null;
      if (next === null) fail(fromEngineError(error));
      else {
        route = next;
        submit();
      }
      return;
    }
    if (output.finishReason === 'abort') {
      fail(new ApiError('request_aborted', 'The worker ended the request before it finished.'));
      return;
    }
    if (!isStarted) {
      isStarted = true;
      route.started(output.numCachedTokens);
    }
    observeTokens(output);
    numOutputTokens += output.newTokenIds.length;
    numCachedTokens = output.numCachedTokens;
    if (output.numDraftTokens !== undefined) {
      drafts.numDraftTokens = output.numDraftTokens;
      drafts.numAcceptedDraftTokens = output.numAcceptedDraftTokens ?? 0;
    }
    if (output.promptLogprobs !== undefined && promptLogprobs === null) {
      promptLogprobs = output.promptLogprobs;
      handlers.onPromptLogprobs?.(promptLogprobs);
    }
    if (pendingLogprobs !== null) {
      for (const [i, tokenId] of output.newTokenIds.entries()) {
        const top = output.newTopLogprobs?.[i];
        pendingLogprobs.push({
          tokenId,
          logprob: output.newLogprobs[i],
          topTokenIds: top?.topTokenIds ?? noAlternatives,
          topLogprobs: top?.topLogprobs ?? noAlternatives,
        });
      }
    }
    // As vLLM: a stop token's text (say a stop_token_ids "\n") is not output unless asked for.
    const dropsStopToken = output.stopTokenId !== undefined && output.finishReason === 'stop' && !request.includeStopStrInOutput;
    let text = detokenizer.push(dropsStopToken ? output.newTokenIds.slice(0, -1) : output.newTokenIds);
    if (output.finishReason !== null) text += detokenizer.flush();
    const match = stopMatcher.push(text);
    emit(match.stop !== null && request.includeStopStrInOutput ? match.text + match.stop : match.text);
    if (match.stop !== null) {
      // The worker would go on to max_tokens; the stop string ended the request here.
      if (output.finishReason === null) route.worker.abort(requestId);
      finish('stop');
    } else if (output.finishReason !== null) {
      emit(stopMatcher.flush());
      finish(output.finishReason);
    }
  };

  const onOutput = (output: RequestOutput) => {
    if (isFinished) return;
    try {
      handleOutput(output);
    } catch (err) {
      // A bug here must cost one request, not the worker's blocks or the process.
      if (output.finishReason === null) route.worker.abort(requestId);
      if (!isFinished) fail(publicError('internal_error', `The gateway failed to process the output: ${(err as Error).stack}`));
    }
  };

  const submit = () => {
    try {
      route.worker.generate(
        {
          requestId,
          promptTokenIds,
          sampling: request.sampling,
          priority: request.priority,
          cacheSalt: request.cacheSalt,
          numSpeculativeTokens: request.numSpeculativeTokens,
          queueTimeoutMs: model.queueTimeoutMs,
          timeoutMs: model.requestTimeoutMs,
          externalRequestId: trace?.requestId,
          structuredOutput: request.structuredOutput,
        },
        onOutput,
      );
    } catch (err) {
      fail(publicError('engine_unavailable', `No worker could take the request: ${(err as Error).message}`));
    }
  };
  submit();

  return {
    abort() {
      if (isFinished) return;
      end('abort');
      route.worker.abort(requestId);
    },
  };
}
