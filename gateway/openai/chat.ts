// POST /v1/chat/completions.
import { randomUUID } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import { affinityKeyOf } from '../../router/affinity.ts';
import { ApiError } from '../errors.ts';
import type { TokenLogprob } from '../generation.ts';
import type { LoadedModel } from '../served-model.ts';
import type { ChatMessage } from '../tokenizer/chat-template.ts';
import type { OpenAIPluginOptions } from './index.ts';
import { chatLogprobsOf, promptLogprobsOf } from './logprobs.ts';
import { choiceRequestsOf, resolveMaxTokens, samplingOf, stopStringsOf, streamUsageOf } from './prepare.ts';
import { clientIsConnected, respond, unixSeconds, type ResponseRenderer } from './respond.ts';
import { sseChoiceFramer, sseEvent } from './sse.ts';
import { chatRequestSchema, parseRequest, type ChatMessageInput, type ChatRequest } from './schemas.ts';

function textOf(content: ChatMessageInput['content']): string {
  if (content === null || content === undefined) return '';
  if (typeof content === 'string') return content;
  return content.map((part) => part.text).join('');
}

/** The template's messages: text content only; "developer" is OpenAI's newer name for "system", which templates know. */
export function chatMessagesOf(messages: readonly ChatMessageInput[]): ChatMessage[] {
  return messages.map((message) => ({ role: message.role === 'developer' ? 'system' : message.role, content: textOf(message.content) }));
}

/** Tool calling needs a parser of the model's tool-call format; none is built yet. */
function rejectToolCalls(request: ChatRequest) {
  if (request.tools && request.tools.length > 0) {
    throw new ApiError('unsupported_parameter', 'tools are not supported yet.', 'tools');
  }
  if (request.functions && request.functions.length > 0) {
    throw new ApiError('unsupported_parameter', 'functions are not supported yet.', 'functions');
  }
  // Without tools, "none" and "auto" both mean plain text; anything else asks for a call.
  for (const param of ['tool_choice', 'function_call'] as const) {
    const choice = request[param];
    if (choice != null && choice !== 'none' && choice !== 'auto') {
      throw new ApiError('unsupported_parameter', `${param} can only be "none" or "auto": tools are not supported yet.`, param);
    }
  }
}

function rejectUnsupportedChat(request: ChatRequest) {
  if (request.top_logprobs != null && request.logprobs !== true) {
    throw new ApiError('invalid_request', 'logprobs must be true when top_logprobs is set.', 'top_logprobs');
  }
  rejectToolCalls(request);
  if (request.response_format && request.response_format.type !== 'text') {
    throw new ApiError('unsupported_parameter', 'Only response_format {"type": "text"} is supported.', 'response_format');
  }
}

function chatRenderer(model: LoadedModel, promptTokenIds: readonly number[], numPromptLogprobs: number): ResponseRenderer {
  const id = `chatcmpl-${randomUUID().replaceAll('-', '')}`;
  const created = unixSeconds();
  const envelope = { id, object: 'chat.completion.chunk', created, model: model.name };
  const frame = sseChoiceFramer(envelope);
  const logprobsOf = (entries: TokenLogprob[] | null) => (entries === null ? null : chatLogprobsOf(model.tokenizer, entries));
  const logprobsJson = (entries: TokenLogprob[] | null) => (entries === null ? 'null' : JSON.stringify(logprobsOf(entries)));
  return {
    opensWithPromptLogprobs: false,
    openingEvent: (index, _promptLogprobs, usage) =>
      frame(`{"index":${index},"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}`, usage),
    textEvent: (index, text, entries, usage) =>
      frame(`{"index":${index},"delta":{"content":${JSON.stringify(text)}},"logprobs":${logprobsJson(entries)},"finish_reason":null}`, usage),
    finishEvent: (index, finishReason, entries, usage) =>
      frame(`{"index":${index},"delta":{},"logprobs":${logprobsJson(entries)},"finish_reason":"${finishReason}"}`, usage),
    usageEvent: (usage) => sseEvent({ ...envelope, choices: [], usage }),
    response: (choices, usage) => {
      const promptLogprobs = choices[0].promptLogprobs;
      return {
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
        ...(promptLogprobs === null
          ? {}
          : { prompt_logprobs: promptLogprobsOf(model.tokenizer, promptTokenIds, promptLogprobs, numPromptLogprobs) }),
      };
    },
  };
}

/** What the chat template reads besides the messages: chat_template_kwargs, and reasoning_effort (which wins). */
export function templateKwargsOf(request: Pick<ChatRequest, 'chat_template_kwargs' | 'reasoning_effort'>): Record<string, unknown> | undefined {
  if (request.chat_template_kwargs == null && request.reasoning_effort == null) return undefined;
  return { ...request.chat_template_kwargs, ...(request.reasoning_effort == null ? {} : { reasoning_effort: request.reasoning_effort }) };
}

export function registerChatRoute(app: FastifyInstance, { registry, metrics, streamLimits, prompts }: OpenAIPluginOptions) {
  app.post('/v1/chat/completions', async (httpRequest, reply) => {
    const arrivalMs = performance.now();
    const request = parseRequest(chatRequestSchema, httpRequest.body);
    const model = registry.get(request.model);
    rejectUnsupportedChat(request);
    const streamUsage = streamUsageOf(request);
    const promptTokenIds = await prompts.encodeChat(model, chatMessagesOf(request.messages), true, {
      isWanted: clientIsConnected(httpRequest),
      templateKwargs: templateKwargsOf(request),
    });
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
      includeStopStrInOutput: request.include_stop_str_in_output === true,
      affinityKey: affinityKeyOf(httpRequest.headers),
      arrivalMs,
      account: httpRequest.account,
      trace: httpRequest.trace,
    };
    return respond(
      reply,
      choiceRequestsOf(generationRequest, request.n ?? 1),
      chatRenderer(model, promptTokenIds, request.prompt_logprobs ?? 0),
      { stream: request.stream === true, ...streamUsage, limits: streamLimits },
      metrics,
    );
  });
}
