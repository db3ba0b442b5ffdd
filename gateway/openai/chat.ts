// POST /v1/chat/completions.
import { randomUUID } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import { affinityKeyOf } from '../../router/affinity.ts';
import { ApiError } from '../errors.ts';
import type { TokenLogprob } from '../generation.ts';
import type { GatewayMetrics } from '../metrics.ts';
import type { LoadedModel, ModelRegistry } from '../served-model.ts';
import type { ChatMessage } from '../tokenizer/chat-template.ts';
import { chatLogprobsOf, promptLogprobsOf } from './logprobs.ts';
import { choiceRequestsOf, rejectStreamedPromptLogprobs, resolveMaxTokens, samplingOf, stopStringsOf } from './prepare.ts';
import { respond, unixSeconds, type ResponseRenderer } from './respond.ts';
import { sseChoiceFramer, sseEvent } from './sse.ts';
import { chatRequestSchema, parseRequest, type ChatMessageInput, type ChatRequest } from './schemas.ts';

function textOf(content: ChatMessageInput['content']): string {
  if (content === null || content === undefined) return '';
  if (typeof content === 'string') return content;
  return content.map((part) => part.text).join('');
}

/** The prompt's token ids: the chat template rendered, then encoded with its special tokens as written. */
export function chatPromptTokenIds(model: LoadedModel, messages: readonly ChatMessageInput[], addGenerationPrompt: boolean): number[] {
  // "developer" is OpenAI's newer name for "system", which is what chat templates know.
  const chatMessages: ChatMessage[] = messages.map((message) => ({
    role: message.role === 'developer' ? 'system' : message.role,
    content: textOf(message.content),
  }));
  return templatePromptTokenIds(model, chatMessages, addGenerationPrompt, 'messages');
}

/** Messages already in the template's shape (the Responses API builds them); param names the request field at fault. */
export function templatePromptTokenIds(
  model: LoadedModel,
  chatMessages: readonly ChatMessage[],
  addGenerationPrompt: boolean,
  param: string,
): number[] {
  if (model.chatTemplate === null) {
    throw new ApiError(
      'chat_template_missing',
      `The model \`${model.name}\` has no chat template; use /v1/completions with a plain prompt.`,
      param,
    );
  }
  let prompt: string;
  try {
    prompt = model.chatTemplate.render(chatMessages, { addGenerationPrompt });
  } catch (err) {
    throw new ApiError('chat_template_error', `The chat template rejected the messages: ${(err as Error).message}`, param);
  }
  return model.tokenizer.encode(prompt, { addSpecialTokens: false });
}

function rejectUnsupportedChat(request: ChatRequest) {
  rejectStreamedPromptLogprobs(request);
  if (request.top_logprobs != null && request.logprobs !== true) {
    throw new ApiError('invalid_request', 'logprobs must be true when top_logprobs is set.', 'top_logprobs');
  }
  if (request.tools && request.tools.length > 0) {
    throw new ApiError('unsupported_parameter', 'tools are not supported yet.', 'tools');
  }
  if (request.response_format && request.response_format.type !== 'text') {
    throw new ApiError('unsupported_parameter', 'Only response_format {"type": "text"} is supported.', 'response_format');
  }
}

function chatRenderer(model: LoadedModel, promptTokenIds: readonly number[]): ResponseRenderer {
  const id = `chatcmpl-${randomUUID().replaceAll('-', '')}`;
  const created = unixSeconds();
  const envelope = { id, object: 'chat.completion.chunk', created, model: model.name };
  const frame = sseChoiceFramer(envelope);
  const logprobsOf = (entries: TokenLogprob[] | null) => (entries === null ? null : chatLogprobsOf(model.tokenizer, entries));
  const logprobsJson = (entries: TokenLogprob[] | null) => (entries === null ? 'null' : JSON.stringify(logprobsOf(entries)));
  return {
    openingEvent: (index) =>
      frame(`{"index":${index},"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}`),
    textEvent: (index, text, entries) =>
      frame(`{"index":${index},"delta":{"content":${JSON.stringify(text)}},"logprobs":${logprobsJson(entries)},"finish_reason":null}`),
    finishEvent: (index, finishReason, entries) =>
      frame(`{"index":${index},"delta":{},"logprobs":${logprobsJson(entries)},"finish_reason":"${finishReason}"}`),
    usageEvent: (usage) => sseEvent({ ...envelope, choices: [], usage }),
    response: (choices, usage, promptLogprobs) => ({
      id,
      object: 'chat.completion',
      created,
      model: model.name,
      choices: choices.map((choice, index) => ({
        index,
        message: { role: 'assistant', content: choice.text },
        logprobs: logprobsOf(choice.tokenLogprobs),
        finish_reason: choice.finishReason,
      })),
      usage,
      // vLLM puts a chat's prompt log-probabilities beside its choices.
      ...(promptLogprobs === null ? {} : { prompt_logprobs: promptLogprobsOf(model.tokenizer, promptTokenIds, promptLogprobs) }),
    }),
  };
}

export function registerChatRoute(app: FastifyInstance, registry: ModelRegistry, metrics: GatewayMetrics) {
  app.post('/v1/chat/completions', async (httpRequest, reply) => {
    const arrivalMs = performance.now();
    const request = parseRequest(chatRequestSchema, httpRequest.body);
    const model = registry.get(request.model);
    rejectUnsupportedChat(request);
    const promptTokenIds = chatPromptTokenIds(model, request.messages, true);
    const maxTokens = resolveMaxTokens(
      model,
      promptTokenIds.length,
      request.max_completion_tokens ?? request.max_tokens,
      request.max_completion_tokens != null ? 'max_completion_tokens' : 'max_tokens',
      'messages',
      null,
    );
    const generationRequest = {
      model,
      promptTokenIds,
      sampling: samplingOf(model, request, maxTokens, request.logprobs === true ? (request.top_logprobs ?? 0) : 0),
      stopStrings: stopStringsOf(request.stop),
      wantsLogprobs: request.logprobs === true,
      priority: request.priority ?? undefined,
      cacheSalt: request.cache_salt ?? undefined,
      affinityKey: affinityKeyOf(httpRequest.headers),
      arrivalMs,
      account: httpRequest.account,
    };
    return respond(
      reply,
      choiceRequestsOf(generationRequest, request.n ?? 1),
      chatRenderer(model, promptTokenIds),
      { stream: request.stream === true, includeUsage: request.stream_options?.include_usage === true },
      metrics,
    );
  });
}
