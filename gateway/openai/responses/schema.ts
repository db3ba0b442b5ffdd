// Wire types of POST /v1/responses and of WebSocket mode's response.create, validated with zod.
// Unknown fields are dropped, as OpenAI does. Fields OpenAI defines that Conduit cannot honour are
// refused by name (400 unsupported_parameter) where ignoring them would change what the client
// gets; those that only tune OpenAI's own service (service_tier, prompt_cache_key, ...) are ignored.
import { z } from 'zod';
import { ApiError } from '../../errors.ts';
import { FUNCTION_NAME, functionParameters, generationFields, MAX_TOP_LOGPROBS, parseRequest, ranges } from '../schemas.ts';
import { jsonSchemaFormat } from '../structured-outputs.ts';

/** The include value that asks for output log-probabilities; others name items Conduit never produces. */
export const INCLUDE_LOGPROBS = 'message.output_text.logprobs';
const MAX_METADATA_KEYS = 16;

const textPart = z.object({ type: z.enum(['input_text', 'output_text']), text: z.string() });
const refusalPart = z.object({ type: z.literal('refusal'), refusal: z.string() });
/** Parts OpenAI defines that a text model cannot read; refused by name when the conversation is built. */
const nonTextPart = z.object({ type: z.enum(['input_image', 'input_file', 'input_audio']) });
const contentPart = z.discriminatedUnion('type', [textPart, refusalPart, nonTextPart], {
  error: (issue) => (issue.code === 'invalid_union' ? 'expected a content part of type input_text, output_text or refusal' : undefined),
});

/** A string is one text part. */
const content = z.preprocess(
  (value) => (typeof value === 'string' ? [{ type: 'input_text', text: value }] : value),
  z.array(contentPart, { error: 'expected a string or an array of content parts' }),
);

const messageItem = z.object({
  type: z.literal('message'),
  role: z.enum(['user', 'assistant', 'system', 'developer']),
  content,
});
const functionCallItem = z.object({
  type: z.literal('function_call'),
  call_id: z.string().min(1),
  name: z.string().min(1),
  arguments: z.string(),
});
const functionCallOutputItem = z.object({
  type: z.literal('function_call_output'),
  call_id: z.string().min(1),
  output: content,
});

/** A reasoning item a client sends back (the agents SDK replays a whole turn's output): the model's own thoughts, not rendered again. */
const reasoningItem = z.object({ type: z.literal('reasoning') });

const SUPPORTED_ITEM_TYPES: ReadonlySet<string> = new Set(['message', 'function_call', 'function_call_output', 'reasoning']);

const inputItem = z.preprocess(
  // EasyInputMessage leaves `type` out.
  (value) => (isRecord(value) && value.type === undefined ? { ...value, type: 'message' } : value),
  z.discriminatedUnion('type', [messageItem, functionCallItem, functionCallOutputItem, reasoningItem]),
);
const inputItemsSchema = z.object({ input: z.array(inputItem) });

/** Responses' text.format: json_schema's fields sit beside its type. */
const textFormat = z.discriminatedUnion(
  'type',
  [z.object({ type: z.literal('text') }), z.object({ type: z.literal('json_object') }), jsonSchemaFormat.extend({ type: z.literal('json_schema') })],
  { error: 'expected a text.format of type text, json_object or json_schema' },
);

const functionTool = z.object({
  type: z.literal('function'),
  name: z.string().regex(FUNCTION_NAME, 'expected a name of letters, digits, _ and -, at most 64 characters'),
  description: z.string().nullish(),
  parameters: functionParameters.nullish(),
  strict: z.boolean().nullish(),
});
const functionToolsSchema = z.object({ tools: z.array(functionTool) });

const metadata = z
  .record(z.string().max(64), z.string().max(512, { error: 'expected values of at most 512 characters' }))
  .refine((record) => Object.keys(record).length <= MAX_METADATA_KEYS, { error: `expected at most ${MAX_METADATA_KEYS} keys` });

const {
  model, temperature, top_p, top_k, min_p, seed, stop, stop_token_ids, ignore_eos, presence_penalty, frequency_penalty,
  repetition_penalty, logit_bias, min_tokens, cache_salt, priority, num_speculative_tokens, user, stream,
} = generationFields;

export const responseCreateSchema = z.object({
  model,
  input: z.union([z.string(), z.array(z.unknown())], { error: 'expected a string or an array of input items' }).nullish(),
  instructions: z.string().nullish(),
  max_output_tokens: ranges.maxTokens.nullish(),
  store: z.boolean().nullish(),
  previous_response_id: z.string().min(1).nullish(),
  metadata: metadata.nullish(),
  user,
  stream,
  temperature,
  top_p,
  include: z.array(z.string()).nullish(),
  top_logprobs: z.number().int().min(0).max(MAX_TOP_LOGPROBS).nullish(),
  /** "auto" drops the conversation's oldest items to fit the context; "disabled" (the default) refuses it. */
  truncation: z.enum(['auto', 'disabled']).nullish(),
  /** WebSocket mode: false warms the KV cache with the prompt and answers without generating. */
  generate: z.boolean().nullish(),
  /** Function tools; other kinds (web search, files, ...) are refused by name (see functionTools). */
  tools: z.array(z.object({ type: z.string() }).passthrough()).max(128).nullish(),
  tool_choice: z
    .union([z.enum(['none', 'auto', 'required']), z.object({ type: z.literal('function'), name: z.string() })], {
      error: 'expected "none", "auto", "required" or {"type": "function", "name": ...}',
    })
    .nullish(),
  parallel_tool_calls: z.boolean().nullish(),
  // Refused when set (see rejectUnsupported).
  reasoning: z.object({ effort: z.string().nullish(), summary: z.string().nullish(), generate_summary: z.string().nullish() }).nullish(),
  text: z.object({ format: textFormat.nullish() }).nullish(),
  background: z.boolean().nullish(),
  conversation: z.unknown().optional(),
  prompt: z.unknown().optional(),
  context_management: z.array(z.unknown()).nullish(),
  moderation: z.unknown().optional(),
  // vLLM's sampling extensions, as the chat route takes them.
  top_k,
  min_p,
  seed,
  stop,
  stop_token_ids,
  ignore_eos,
  presence_penalty,
  frequency_penalty,
  repetition_penalty,
  logit_bias,
  min_tokens,
  cache_salt,
  priority,
  num_speculative_tokens,
});

export type ResponseCreateRequest = z.infer<typeof responseCreateSchema>;
export type InputItem = z.infer<typeof inputItem>;
export type ContentPart = z.infer<typeof contentPart>;

function isRecord(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}

function unsupported(param: string, message: string): never {
  throw new ApiError('unsupported_parameter', message, param);
}

/** The request's tools, which must be function tools: OpenAI's hosted tools (web search, files, ...) run in OpenAI's service. */
export function functionToolsOf(tools: ResponseCreateRequest['tools']): z.infer<typeof functionTool>[] {
  if (tools == null) return [];
  for (const [index, tool] of tools.entries()) {
    if (tool.type !== 'function') unsupported(`tools[${index}].type`, `Tools of type '${tool.type}' are not supported; Conduit runs function tools.`);
  }
  return parseRequest(functionToolsSchema, { tools }).tools;
}

/** Fields that, honoured by OpenAI, would change the answer in ways Conduit cannot. */
function rejectUnsupported(request: ResponseCreateRequest) {
  if (request.reasoning != null && (request.reasoning.effort != null || request.reasoning.summary != null || request.reasoning.generate_summary != null)) {
    unsupported('reasoning', 'reasoning is not supported with this model.');
  }
  if (request.background === true) unsupported('background', 'Background responses are not supported.');
  if (request.conversation != null) unsupported('conversation', 'Conversations are not supported; chain responses with previous_response_id.');
  if (request.prompt != null) unsupported('prompt', 'Prompt templates are not supported.');
  if (request.context_management != null && request.context_management.length > 0) {
    unsupported('context_management', 'Context management (compaction) is not supported.');
  }
  if (request.moderation != null) unsupported('moderation', 'Moderation is not supported.');
  if (request.top_logprobs != null && request.top_logprobs > 0 && !request.include?.includes(INCLUDE_LOGPROBS)) {
    throw new ApiError('invalid_request', `top_logprobs needs include: ["${INCLUDE_LOGPROBS}"].`, 'top_logprobs');
  }
}

/** The validated body; throws an ApiError naming the field at fault. */
export function parseResponseCreate(body: unknown): ResponseCreateRequest {
  const request = parseRequest(responseCreateSchema, body);
  rejectUnsupported(request);
  return request;
}

/** The request's input as items (a string is one user message); throws naming the item at fault. */
export function inputItemsOf(input: ResponseCreateRequest['input']): InputItem[] {
  if (input === null || input === undefined) return [];
  if (typeof input === 'string') return [{ type: 'message', role: 'user', content: [{ type: 'input_text', text: input }] }];
  for (const [index, item] of input.entries()) {
    const type = isRecord(item) ? (item.type ?? 'message') : undefined;
    if (typeof type === 'string' && !SUPPORTED_ITEM_TYPES.has(type)) {
      unsupported(`input[${index}].type`, `Input items of type '${type}' are not supported; Conduit reads message, function_call and function_call_output items.`);
    }
  }
  return parseRequest(inputItemsSchema, { input }).input;
}
