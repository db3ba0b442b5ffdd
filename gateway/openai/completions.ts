// POST /v1/completions.
import { randomUUID } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import { ApiError } from '../errors.ts';
import type { GatewayMetrics } from '../metrics.ts';
import type { LoadedModel, ModelRegistry } from '../served-model.ts';
import {
  DEFAULT_COMPLETION_MAX_TOKENS,
  checkTokenIds,
  choiceRequestsOf,
  rejectUnsupported,
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
  rejectUnsupported(request);
  if (request.echo === true) throw new ApiError('unsupported_parameter', 'echo is not supported yet.', 'echo');
  if (request.logprobs != null) throw new ApiError('unsupported_parameter', 'logprobs is not supported yet.', 'logprobs');
  if (request.suffix) throw new ApiError('unsupported_parameter', 'suffix is not supported.', 'suffix');
  if ((request.best_of ?? 1) !== 1) throw new ApiError('unsupported_parameter', 'Only best_of=1 is supported.', 'best_of');
}

function completionRenderer(modelName: string): ResponseRenderer {
  const id = `cmpl-${randomUUID().replaceAll('-', '')}`;
  const created = unixSeconds();
  const envelope = { id, object: 'text_completion', created, model: modelName };
  const frame = sseChoiceFramer(envelope);
  return {
    openingEvent: () => null,
    textEvent: (index, text) => frame(`{"index":${index},"text":${JSON.stringify(text)},"logprobs":null,"finish_reason":null}`),
    finishEvent: (index, finishReason) => frame(`{"index":${index},"text":"","logprobs":null,"finish_reason":"${finishReason}"}`),
    usageEvent: (usage) => sseEvent({ ...envelope, choices: [], usage }),
    response: (choices, usage) => ({
      ...envelope,
      choices: choices.map((choice, index) => ({ index, text: choice.text, logprobs: null, finish_reason: choice.finishReason })),
      usage,
    }),
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
      sampling: samplingOf(request, maxTokens),
      stopStrings: stopStringsOf(request.stop),
      arrivalMs,
    };
    return respond(
      reply,
      choiceRequestsOf(generationRequest, request.n ?? 1),
      completionRenderer(model.name),
      { stream: request.stream === true, includeUsage: request.stream_options?.include_usage === true },
      metrics,
    );
  });
}
