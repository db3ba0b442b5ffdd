// One turn made ready to run: the conversation it continues and adds to, the prompt rendered and
// tokenized, sampling resolved, and what its Response object echoes. Shared by the HTTP route and
// WebSocket mode; the caller resolves previous_response_id (from the store, or a connection's cache).
import { randomUUID } from 'node:crypto';
import { ApiError } from '../../errors.ts';
import type { GenerationRequest } from '../../generation.ts';
import { generationRequestOf, samplingOf, type RequestOrigin } from '../../generation-request.ts';
import type { IsWanted, PromptEncoder } from '../../prompt-encoder.ts';
import type { RegisteredModel, ModelRegistry } from '../../served-model.ts';
import type { ChatMessage } from '../../tokenizer/chat-template.ts';
import { planOutput, type OutputPlan } from '../../tool-calls/plan.ts';
import { checkToolChoice, checkTools, promptWithTools, type ToolChoice, type ToolDefinition, type ToolPlan } from '../../tool-calls/tools.ts';
import { resolveMaxTokens } from '../prepare.ts';
import { jsonSchemaConstraint } from '../structured-outputs.ts';
import { unixSeconds } from '../respond.ts';
import { appendInput, promptMessages } from './conversation.ts';
import type { ResponseEcho } from './objects.ts';
import { functionToolsOf, INCLUDE_LOGPROBS, inputItemsOf, type ResponseCreateRequest } from './schema.ts';
import type { StoredResponse } from './store.ts';
import { fitConversation } from './truncation.ts';

export interface PreparedTurn {
  echo: ResponseEcho;
  model: RegisteredModel;
  /** The conversation before this turn's output: the previous response's, then this turn's input. */
  messages: readonly ChatMessage[];
  generation: GenerationRequest;
  /** What the output is held to, and how it splits into reasoning, text and calls. */
  plan: OutputPlan;
  /** generate: false: the prompt is prefilled into the KV cache and the one token drawn is discarded. */
  isWarmUp: boolean;
}

function toolPlanOf(request: ResponseCreateRequest): { plan: ToolPlan; echo: object[] } {
  const given = functionToolsOf(request.tools);
  const tools: ToolDefinition[] = given.map((tool) => ({
    name: tool.name, description: tool.description ?? null, parameters: tool.parameters ?? null, strict: tool.strict === true,
  }));
  checkTools(tools, (index) => `tools[${index}].parameters`);
  const requested = request.tool_choice;
  const choice: ToolChoice = requested == null ? (tools.length > 0 ? 'auto' : 'none') : typeof requested === 'string' ? requested : { name: requested.name };
  checkToolChoice(choice, tools, 'tool_choice');
  const echo = given.map((tool, index) => ({
    type: 'function', name: tool.name, description: tool.description ?? null, parameters: tool.parameters ?? null, strict: tools[index].strict,
  }));
  return { plan: { tools, choice, parallel: request.parallel_tool_calls !== false }, echo };
}

/** text.format as a constraint; null for text. */
function textFormatConstraint(request: ResponseCreateRequest) {
  const format = request.text?.format;
  if (format == null || format.type === 'text') return null;
  if (format.type === 'json_object') return { kind: 'json_object' } as const;
  return jsonSchemaConstraint(format, 'text.format', 'text.format.schema');
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
  origin: RequestOrigin,
  isWanted: IsWanted,
): Promise<PreparedTurn> {
  const model = registry.get(request.model);
  const items = inputItemsOf(request.input);
  if (items.length === 0 && previous === null) {
    throw new ApiError('invalid_request', "Missing required parameter: 'input'.", 'input');
  }
  const messages = appendInput(previous?.messages ?? [], items);
  const isWarmUp = request.generate === false;
  const tools = toolPlanOf(request);
  const constraint = textFormatConstraint(request);
  const offeredTools = tools.plan.choice === 'none' ? [] : tools.plan.tools;
  // A warm-up's prompt stops before the generation prompt, so the turn that continues it extends it.
  const encode = (kept: readonly ChatMessage[]) => {
    const offered = promptWithTools(model.formats, promptMessages(request.instructions, kept), offeredTools);
    return prompts.encodeChat(model, offered.messages, !isWarmUp, { isWanted, param: 'input', tools: offered.tools });
  };
  const requestedMaxTokens = isWarmUp ? 1 : request.max_output_tokens;
  // "auto" keeps room for the reply's limit: the request's, else the checkpoint's default, else one token.
  const promptTokenIds = request.truncation === 'auto'
    ? (await fitConversation(messages, encode, model.maxModelLen, requestedMaxTokens ?? model.defaultMaxTokens ?? 1)).promptTokenIds
    : await encode(messages);
  const maxTokens = resolveMaxTokens(model, promptTokenIds.length, requestedMaxTokens, 'max_output_tokens', 'input', null);
  const wantsLogprobs = request.include?.includes(INCLUDE_LOGPROBS) === true;
  const numTopLogprobs = wantsLogprobs ? (request.top_logprobs ?? 0) : 0;
  const plan = planOutput(model, promptTokenIds, tools.plan, constraint, wantsLogprobs);
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
      toolChoice: request.tool_choice ?? 'auto',
      tools: tools.echo,
      parallelToolCalls: tools.plan.parallel,
      textFormat: request.text?.format ?? { type: 'text' },
      user: request.user ?? null,
      metadata: request.metadata ?? {},
    },
    model,
    messages,
    // A chained turn prefers the worker that served the one it continues (router/README.md, session affinity).
    generation: generationRequestOf({ ...origin, affinityKey: request.previous_response_id ?? undefined }, request, {
      model,
      promptTokenIds,
      // A warm-up samples nothing that is kept: only its cache salt matters, for which prefixes it may share.
      sampling: isWarmUp ? { maxTokens } : samplingOf(model, request, maxTokens, numTopLogprobs),
      stopStrings: isWarmUp ? [] : undefined,
      wantsLogprobs: wantsLogprobs && !isWarmUp,
      structuredOutput: isWarmUp ? undefined : plan.structuredOutput,
      nextTurnKey: id,
    }),
    plan,
    isWarmUp,
  };
}
