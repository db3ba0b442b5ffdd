// POST /v1/completions.
import { randomUUID } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import { affinityKeyOf } from '../../router/affinity.ts';
import { ApiError } from '../errors.ts';
import type { TokenLogprob } from '../generation.ts';
import type { GatewayMetrics } from '../metrics.ts';
import type { LoadedModel, ModelRegistry } from '../served-model.ts';
import { CompletionLogprobsBuilder, promptLogprobsOf } from './logprobs.ts';
import {
  DEFAULT_COMPLETION_MAX_TOKENS,
  checkTokenIds,
  choiceRequestsOf,
  rejectStreamedPromptLogprobs,
  resolveMaxTokens,
  samplingOf,
  stopStringsOf,
} from './prepare.ts';
import { respond, unixSeconds, type ResponseRenderer } from './respond.ts';
import { sseChoiceFramer, sseEvent } from './sse.ts';
import { completionRequestSchema, parseRequest, type CompletionRequest } from './schemas.ts';

/** A string, a list of token ids, or (as clients often send) a list holding one string. */
function promptTokenIdsOf(model: LoadedModel, prompt: CompletionRequest['prompt']): number[] {
  if (typeof prompt === 'string') return model.tokenizer.encode(prompt, { addSpecialTokens: true });
  if (prompt.length > 0 && prompt.every((item) => typeof item === 'string')) {
    if (prompt.length > 1) {
      throw new ApiError('unsupported_parameter', 'Batched prompts are not supported; send one prompt per request.', 'prompt');
    }
    return model.tokenizer.encode(prompt[0], { addSpecialTokens: true });
  }
  const tokenIds = prompt as number[];
  checkTokenIds(model, tokenIds, 'prompt');
  return tokenIds;
}

function rejectUnsupportedCompletion(request: CompletionRequest) {
  rejectStreamedPromptLogprobs(request);
  if (request.echo === true) throw new ApiError('unsupported_parameter', 'echo is not supported yet.', 'echo');
  if (request.suffix) throw new ApiError('unsupported_parameter', 'suffix is not supported.', 'suffix');
  if ((request.best_of ?? 1) !== 1) throw new ApiError('unsupported_parameter', 'Only best_of=1 is supported.', 'best_of');
}

function completionRenderer(model: LoadedModel, promptTokenIds: readonly number[], numChoices: number): ResponseRenderer {
  const id = `cmpl-${randomUUID().replaceAll('-', '')}`;
  const created = unixSeconds();
  const envelope = { id, object: 'text_completion', created, model: model.name };
  const frame = sseChoiceFramer(envelope);
  const logprobsBuilders = Array.from({ length: numChoices }, () => new CompletionLogprobsBuilder(model.tokenizer));
  const logprobsOf = (index: number, entries: TokenLogprob[] | null) =>
    entries === null ? null : logprobsBuilders[index].next(entries);
  const logprobsJson = (index: number, entries: TokenLogprob[] | null) =>
    entries === null ? 'null' : JSON.stringify(logprobsOf(index, entries));
  return {
    openingEvent: () => null,
    textEvent: (index, text, entries) =>
      frame(`{"index":${index},"text":${JSON.stringify(text)},"logprobs":${logprobsJson(index, entries)},"finish_reason":null}`),
    finishEvent: (index, finishReason, entries) =>
      frame(`{"index":${index},"text":"","logprobs":${logprobsJson(index, entries)},"finish_reason":"${finishReason}"}`),
    usageEvent: (usage) => sseEvent({ ...envelope, choices: [], usage }),
    response: (choices, usage, promptLogprobs) => {
      // vLLM puts a completion's prompt log-probabilities in every choice.
      const promptFields =
        promptLogprobs === null ? {} : { prompt_logprobs: promptLogprobsOf(model.tokenizer, promptTokenIds, promptLogprobs) };
      return {
        ...envelope,
        choices: choices.map((choice, index) => ({
          index,
          text: choice.text,
          logprobs: logprobsOf(index, choice.tokenLogprobs),
          finish_reason: choice.finishReason,
          ...promptFields,
        })),
        usage,
      };
    },
  };
}

export function registerCompletionsRoute(app: FastifyInstance, registry: ModelRegistry, metrics: GatewayMetrics) {
  app.post('/v1/completions', async (httpRequest, reply) => {
    const arrivalMs = performance.now();
    const request = parseRequest(completionRequestSchema, httpRequest.body);
    const model = registry.get(request.model);
    rejectUnsupportedCompletion(request);
    const promptTokenIds = promptTokenIdsOf(model, request.prompt);
    const maxTokens = resolveMaxTokens(
      model,
      promptTokenIds.length,
      request.max_tokens,
      'max_tokens',
      'prompt',
      DEFAULT_COMPLETION_MAX_TOKENS,
    );
    const generationRequest = {
      model,
      promptTokenIds,
      sampling: samplingOf(model, request, maxTokens, request.logprobs ?? 0),
      stopStrings: stopStringsOf(request.stop),
      wantsLogprobs: request.logprobs != null,
      priority: request.priority ?? undefined,
      cacheSalt: request.cache_salt ?? undefined,
      affinityKey: affinityKeyOf(httpRequest.headers),
      arrivalMs,
      account: httpRequest.account,
    };
    return respond(
      reply,
      choiceRequestsOf(generationRequest, request.n ?? 1),
      completionRenderer(model, promptTokenIds, request.n ?? 1),
      { stream: request.stream === true, includeUsage: request.stream_options?.include_usage === true },
      metrics,
    );
  });
}
