// One turn made ready to run: the conversation it continues and adds to, the prompt rendered and
// tokenized, sampling resolved, and what its Response object echoes. Shared by the HTTP route and
// WebSocket mode; the caller resolves previous_response_id (from the store, or a connection's cache).
import { randomUUID } from 'node:crypto';
import { ApiError } from '../../errors.ts';
import type { GenerationRequest } from '../../generation.ts';
import type { IsWanted, PromptEncoder } from '../../prompt-encoder.ts';
import type { LoadedModel, ModelRegistry } from '../../served-model.ts';
import type { ChatMessage } from '../../tokenizer/chat-template.ts';
import { resolveMaxTokens, samplingOf, stopStringsOf } from '../prepare.ts';
import { unixSeconds } from '../respond.ts';
import { appendInput, promptMessages } from './conversation.ts';
import type { ResponseEcho } from './objects.ts';
import { INCLUDE_LOGPROBS, inputItemsOf, type ResponseCreateRequest } from './schema.ts';
import type { StoredResponse } from './store.ts';
import { fitConversation } from './truncation.ts';

export interface PreparedTurn {
  echo: ResponseEcho;
  model: LoadedModel;
  /** The conversation before this turn's output: the previous response's, then this turn's input. */
  messages: readonly ChatMessage[];
  generation: GenerationRequest;
  /** generate: false: the prompt is prefilled into the KV cache and the one token drawn is discarded. */
  isWarmUp: boolean;
}

export function newResponseId(): string {
  return `resp_${randomUUID().replaceAll('-', '')}`;
}

export function newItemId(): string {
  return `msg_${randomUUID().replaceAll('-', '')}`;
}

export function previousNotFound(previousResponseId: string): ApiError {
  return new ApiError('previous_response_not_found', `Previous response with id '${previousResponseId}' not found.`, 'previous_response_id');
}

/**
 * previous: the response previous_response_id names, already looked up (null without one).
 * isWanted: false once the client has gone (a large prompt waiting for a thread is dropped).
 */
export async function prepareTurn(
  registry: ModelRegistry,
  prompts: PromptEncoder,
  request: ResponseCreateRequest,
  previous: StoredResponse | null,
  arrivalMs: number,
  isWanted: IsWanted,
): Promise<PreparedTurn> {
  const model = registry.get(request.model);
  const items = inputItemsOf(request.input);
  if (items.length === 0 && previous === null) {
    throw new ApiError('invalid_request', "Missing required parameter: 'input'.", 'input');
  }
  const messages = appendInput(previous?.messages ?? [], items);
  const isWarmUp = request.generate === false;
  // A warm-up's prompt stops before the generation prompt, so the turn that continues it extends it.
  const encode = (kept: readonly ChatMessage[]) =>
    prompts.encodeChat(model, promptMessages(request.instructions, kept), !isWarmUp, { isWanted, param: 'input' });
  const requestedMaxTokens = isWarmUp ? 1 : request.max_output_tokens;
  // "auto" keeps room for the reply's limit: the request's, else the checkpoint's default, else one token.
  const promptTokenIds = request.truncation === 'auto'
    ? (await fitConversation(messages, encode, model.maxModelLen, requestedMaxTokens ?? model.defaultMaxTokens ?? 1)).promptTokenIds
    : await encode(messages);
  const maxTokens = resolveMaxTokens(model, promptTokenIds.length, requestedMaxTokens, 'max_output_tokens', 'input', null);
  const wantsLogprobs = request.include?.includes(INCLUDE_LOGPROBS) === true;
  const numTopLogprobs = wantsLogprobs ? (request.top_logprobs ?? 0) : 0;
  const id = newResponseId();
  return {
    echo: {
      id,
      createdAtSec: unixSeconds(),
      model: model.name,
      instructions: request.instructions ?? null,
      maxOutputTokens: request.max_output_tokens ?? null,
      truncation: request.truncation ?? 'disabled',
      previousResponseId: request.previous_response_id ?? null,
      // Whether the finished response goes into the shared store (a WebSocket caches it either way).
      store: request.store !== false,
      temperature: request.temperature ?? null,
      topP: request.top_p ?? null,
      topLogprobs: numTopLogprobs,
      toolChoice: request.tool_choice === 'none' ? 'none' : 'auto',
      user: request.user ?? null,
      metadata: request.metadata ?? {},
    },
    model,
    messages,
    generation: {
      model,
      promptTokenIds,
      // A warm-up samples nothing that is kept: only its cache salt matters, for which prefixes it may share.
      sampling: isWarmUp ? { maxTokens } : samplingOf(model, request, maxTokens, numTopLogprobs),
      stopStrings: isWarmUp ? [] : stopStringsOf(request.stop),
      wantsLogprobs: wantsLogprobs && !isWarmUp,
      priority: request.priority ?? undefined,
      cacheSalt: request.cache_salt ?? undefined,
      // A chained turn prefers the worker that served the one it continues (router/affinity.ts).
      affinityKey: request.previous_response_id ?? undefined,
      nextTurnKey: id,
      arrivalMs,
    },
    isWarmUp,
  };
}
