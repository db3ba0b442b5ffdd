// POST /v1/chat/completions.
import { randomUUID } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import { affinityKeyOf } from '../../router/affinity.ts';
import { ApiError } from '../errors.ts';
import type { TokenLogprob } from '../generation.ts';
import type { LoadedModel } from '../served-model.ts';
import type { ChatMessage, ChatToolCall } from '../tokenizer/chat-template.ts';
import { OutputParser, type OutputEvent, type ParsedToolCall } from '../tool-calls/output-parser.ts';
import { planOutput, type OutputPlan } from '../tool-calls/plan.ts';
import { argumentsValueOf, checkToolChoice, checkTools, promptWithTools, type ToolChoice, type ToolDefinition, type ToolPlan } from '../tool-calls/tools.ts';
import type { OpenAIPluginOptions } from './index.ts';
import { chatLogprobsOf, promptLogprobsOf } from './logprobs.ts';
import { choiceRequestsOf, resolveMaxTokens, samplingOf, stopStringsOf, streamUsageOf } from './prepare.ts';
import { clientIsConnected, respond, unixSeconds, type ChunkUsage, type FinishReason, type ResponseRenderer } from './respond.ts';
import { sseChoiceFramer, sseEvent } from './sse.ts';
import { chatRequestSchema, parseRequest, type ChatMessageInput, type ChatRequest } from './schemas.ts';
import { constraintOf } from './structured-outputs.ts';

function textOf(content: ChatMessageInput['content']): string {
  if (content === null || content === undefined) return '';
  if (typeof content === 'string') return content;
  return content.map((part) => part.text).join('');
}

/**
 * The template's messages: text content, an assistant's calls (their arguments parsed, as
 * templates write them with tojson), a tool message's call id and its function's name; "developer"
 * is OpenAI's newer name for "system", which templates know.
 */
export function chatMessagesOf(messages: readonly ChatMessageInput[]): ChatMessage[] {
  const namesByCallId = new Map<string, string>();
  return messages.map((message, index) => {
    const chatMessage: ChatMessage = { role: message.role === 'developer' ? 'system' : message.role, content: textOf(message.content) };
    if (message.tool_calls != null && message.tool_calls.length > 0) {
      chatMessage.tool_calls = message.tool_calls.map((call): ChatToolCall => {
        namesByCallId.set(call.id, call.function.name);
        return { id: call.id, type: 'function', function: { name: call.function.name, arguments: argumentsValueOf(call.function.arguments) } };
      });
    }
    if (message.role === 'tool') {
      if (message.tool_call_id == null) throw new ApiError('invalid_request', "A tool message needs 'tool_call_id'.", `messages[${index}].tool_call_id`);
      chatMessage.tool_call_id = message.tool_call_id;
      const name = namesByCallId.get(message.tool_call_id) ?? message.name ?? undefined;
      if (name !== undefined) chatMessage.name = name;
    }
    return chatMessage;
  });
}

function toolPlanOf(request: ChatRequest): ToolPlan {
  if (request.functions && request.functions.length > 0) {
    throw new ApiError('unsupported_parameter', 'functions are not supported: use tools.', 'functions');
  }
  if (request.function_call != null) throw new ApiError('unsupported_parameter', 'function_call is not supported: use tool_choice.', 'function_call');
  const tools: ToolDefinition[] = (request.tools ?? []).map(({ function: fn }) => ({
    name: fn.name, description: fn.description ?? null, parameters: fn.parameters ?? null, strict: fn.strict === true,
  }));
  checkTools(tools, (index) => `tools[${index}].function.parameters`);
  const requested = request.tool_choice;
  // OpenAI's default: auto with tools, none without.
  const choice: ToolChoice = requested == null ? (tools.length > 0 ? 'auto' : 'none') : typeof requested === 'string' ? requested : { name: requested.function.name };
  checkToolChoice(choice, tools, 'tool_choice');
  return { tools, choice, parallel: request.parallel_tool_calls !== false };
}

function rejectUnsupportedChat(request: ChatRequest) {
  if (request.top_logprobs != null && request.logprobs !== true) {
    throw new ApiError('invalid_request', 'logprobs must be true when top_logprobs is set.', 'top_logprobs');
  }
}

function toolCallJson(call: ParsedToolCall) {
  return { id: call.id, type: 'function', function: { name: call.name, arguments: call.arguments } };
}

/** One chunk's delta for each parser event, as OpenAI streams them: a call's id and name first, then its argument pieces. */
function deltaOf(event: OutputEvent): object {
  switch (event.kind) {
    case 'content':
      return { content: event.text };
    case 'reasoning':
      return { reasoning_content: event.text };
    case 'call':
      return { tool_calls: [{ index: event.index, id: event.id, type: 'function', function: { name: event.name, arguments: '' } }] };
    case 'arguments':
      return { tool_calls: [{ index: event.index, function: { arguments: event.text } }] };
  }
}

function chatRenderer(model: LoadedModel, promptTokenIds: readonly number[], numPromptLogprobs: number, plan: OutputPlan, numChoices: number): ResponseRenderer {
  const id = `chatcmpl-${randomUUID().replaceAll('-', '')}`;
  const created = unixSeconds();
  const envelope = { id, object: 'chat.completion.chunk', created, model: model.name };
  const frame = sseChoiceFramer(envelope);
  const logprobsOf = (entries: TokenLogprob[] | null) => (entries === null ? null : chatLogprobsOf(model.tokenizer, entries));
  const logprobsJson = (entries: TokenLogprob[] | null) => (entries === null ? 'null' : JSON.stringify(logprobsOf(entries)));
  const isReasoningModel = plan.parser.reasoning !== null;
  const parsers = Array.from({ length: numChoices }, () => new OutputParser(plan.parser));
  /** A finished output that made calls ends with tool_calls (stop for a named tool_choice); one cut off stays length. */
  const finishReasonOf = (parser: OutputParser, finishReason: FinishReason): FinishReason | 'tool_calls' =>
    finishReason === 'stop' && parser.toolCalls.length > 0 ? plan.callsFinishReason : finishReason;
  /** The chunks of some parser events; the logprobs of the tokens behind them ride on the first. */
  const framesOf = (index: number, events: OutputEvent[], entries: TokenLogprob[] | null, usage: ChunkUsage | null) => {
    let frames = '';
    for (const [i, event] of events.entries()) {
      const logprobs = i === 0 ? logprobsJson(entries) : 'null';
      frames += frame(`{"index":${index},"delta":${JSON.stringify(deltaOf(event))},"logprobs":${logprobs},"finish_reason":null}`, usage);
    }
    return frames;
  };
  return {
    opensWithPromptLogprobs: false,
    openingEvent: (index, _promptLogprobs, usage) =>
      frame(`{"index":${index},"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}`, usage),
    textEvent: (index, text, entries, usage) => framesOf(index, parsers[index].push(text), entries, usage),
    finishEvent: (index, finishReason, entries, usage) => {
      const parser = parsers[index];
      const frames = framesOf(index, parser.finish(), null, usage);
      return frames + frame(`{"index":${index},"delta":{},"logprobs":${logprobsJson(entries)},"finish_reason":"${finishReasonOf(parser, finishReason)}"}`, usage);
    },
    usageEvent: (usage) => sseEvent({ ...envelope, choices: [], usage }),
    response: (choices, usage) => {
      const promptLogprobs = choices[0].promptLogprobs;
      return {
        id,
        object: 'chat.completion',
        created,
        model: model.name,
        choices: choices.map((choice, index) => {
          const parser = new OutputParser(plan.parser);
          parser.push(choice.text);
          parser.finish();
          const hasCalls = parser.toolCalls.length > 0;
          return {
            index,
            message: {
              role: 'assistant',
              // As OpenAI: no content (null) beside calls unless the model wrote some.
              content: hasCalls && parser.content === '' ? null : parser.content,
              ...(isReasoningModel ? { reasoning_content: parser.reasoning === '' ? null : parser.reasoning } : {}),
              ...(hasCalls ? { tool_calls: parser.toolCalls.map(toolCallJson) } : {}),
            },
            logprobs: logprobsOf(choice.tokenLogprobs),
            finish_reason: finishReasonOf(parser, choice.finishReason),
          };
        }),
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
    const toolPlan = toolPlanOf(request);
    const constraint = constraintOf(request.response_format, request.structured_outputs);
    const offered = promptWithTools(model.formats, chatMessagesOf(request.messages), toolPlan.choice === 'none' ? [] : toolPlan.tools);
    const promptTokenIds = await prompts.encodeChat(model, offered.messages, true, {
      isWanted: clientIsConnected(httpRequest),
      tools: offered.tools,
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
    const wantsLogprobs = request.logprobs === true;
    const plan = planOutput(model, promptTokenIds, toolPlan, constraint, wantsLogprobs);
    const generationRequest = {
      model,
      promptTokenIds,
      sampling: samplingOf(model, request, maxTokens, wantsLogprobs ? (request.top_logprobs ?? 0) : 0),
      stopStrings: stopStringsOf(request.stop),
      wantsLogprobs,
      priority: request.priority ?? undefined,
      cacheSalt: request.cache_salt ?? undefined,
      numSpeculativeTokens: request.num_speculative_tokens ?? undefined,
      includeStopStrInOutput: request.include_stop_str_in_output === true,
      structuredOutput: plan.structuredOutput,
      affinityKey: affinityKeyOf(httpRequest.headers),
      arrivalMs,
      account: httpRequest.account,
      trace: httpRequest.trace,
    };
    const numChoices = request.n ?? 1;
    return respond(
      reply,
      choiceRequestsOf(generationRequest, numChoices),
      chatRenderer(model, promptTokenIds, request.prompt_logprobs ?? 0, plan, numChoices),
      { stream: request.stream === true, ...streamUsage, limits: streamLimits },
      metrics,
    );
  });
}
