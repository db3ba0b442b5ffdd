// Wire types of the OpenAI surface, validated with zod. Unknown fields are dropped, as OpenAI
// does; known fields with the wrong type or range name themselves in a 400.
import { z } from 'zod';
import { INT32_MAX, INT32_MIN, MAX_REPETITION_PENALTY } from '../../engine/types.ts';
import { ApiError } from '../errors.ts';
import { responseFormatSchema, structuredOutputsSchema } from './structured-outputs.ts';

const MAX_STOP_STRINGS = 4;
/** OpenAI's own limit on n. */
const MAX_CHOICES = 128;
/** Prompts in one completions request, as OpenAI's batch limit; prompts × n is bounded in prepare.ts. */
export const MAX_PROMPTS = 2048;
/** OpenAI's limit on top_logprobs; the engine reports at most this many alternatives. */
export const MAX_TOP_LOGPROBS = 20;

const stop = z.union([z.string(), z.array(z.string()).max(MAX_STOP_STRINGS)], {
  error: `expected a string or an array of at most ${MAX_STOP_STRINGS} strings`,
});

const tokenId = z.number().int().min(0).max(INT32_MAX);

/**
 * Every numeric parameter's range, checked here, before anything narrows it (the engine's wire
 * has int32 and float fields): out of range is a 400 naming the parameter (gateway/README.md).
 */
export const ranges = {
  /** Output tokens: also at most the context left after the prompt (prepare.ts). */
  maxTokens: z.number().int().min(1).max(INT32_MAX),
  temperature: z.number().min(0).max(2),
  topP: z.number().gt(0).max(1),
  /** Extension: -1 or 0 disables; at least the vocabulary's size keeps every token. */
  topK: z.number().int().min(-1).max(INT32_MAX),
  /** zod's int() is a safe integer (|seed| < 2^53, what JSON numbers hold exactly); the engine's are unsigned 64-bit, so a negative one wraps. */
  seed: z.number().int(),
};

/** Fields shared by chat and text completions (the Responses API picks from them); nullish because clients send explicit nulls. */
export const generationFields = {
  model: z.string(),
  max_tokens: ranges.maxTokens.nullish(),
  temperature: ranges.temperature.nullish(),
  top_p: ranges.topP.nullish(),
  /** Extension: -1 or 0 disables. */
  top_k: ranges.topK.nullish(),
  seed: ranges.seed.nullish(),
  stop: stop.nullish(),
  /** Extension. */
  stop_token_ids: z.array(tokenId).nullish(),
  /** Extension. */
  ignore_eos: z.boolean().nullish(),
  n: z.number().int().min(1).max(MAX_CHOICES).nullish(),
  stream: z.boolean().nullish(),
  stream_options: z
    .object({
      include_usage: z.boolean().nullish(),
      /** Extension (vLLM): usage in every chunk, not only the last. */
      continuous_usage_stats: z.boolean().nullish(),
    })
    .nullish(),
  /** Extension (vLLM): a matched stop string (or stop token's text) stays at the end of the text. */
  include_stop_str_in_output: z.boolean().nullish(),
  user: z.string().nullish(),
  presence_penalty: z.number().min(-2).max(2).nullish(),
  frequency_penalty: z.number().min(-2).max(2).nullish(),
  /** Token id (as a string key) to a bias in [-100, 100]; -100 bans the token. */
  logit_bias: z
    .record(z.string().regex(/^\d+$/, 'expected token ids as keys'), z.number().min(-100).max(100))
    .nullish(),
  /** Extension (vLLM). */
  min_p: z.number().min(0).max(1).nullish(),
  /** Extension (vLLM): > 1 discourages tokens already in the prompt or output; (0, 2] as vLLM's. */
  repetition_penalty: z.number().gt(0).max(MAX_REPETITION_PENALTY).nullish(),
  /** Extension (vLLM): at most max_tokens (prepare.ts). */
  min_tokens: z.number().int().min(0).max(INT32_MAX).nullish(),
  /** Extension (vLLM): alternatives reported with each prompt token; not with stream. */
  prompt_logprobs: z.number().int().min(0).max(MAX_TOP_LOGPROBS).nullish(),
  /** Extension (vLLM): only requests with the same salt share cached prefixes. */
  cache_salt: z.string().min(1).nullish(),
  /** Extension (vLLM): lower runs first when the model is served with scheduling_policy: priority. */
  priority: z.number().int().min(INT32_MIN).max(INT32_MAX).nullish(),
  /** Extension: speculative decoding's most proposals per step for this request (0: none); at most the model's. */
  num_speculative_tokens: z.number().int().min(0).max(16).nullish(),
};

const contentPart = z.object({
  type: z.literal('text', { error: 'only text content parts are supported' }),
  text: z.string(),
});

/** OpenAI's function names. */
export const FUNCTION_NAME = /^[a-zA-Z0-9_-]{1,64}$/;
/** OpenAI's limit on tools per request. */
const MAX_TOOLS = 128;

const messageToolCall = z.object({
  id: z.string().min(1),
  type: z.literal('function').nullish(),
  function: z.object({ name: z.string().min(1), arguments: z.string() }),
});

const message = z.object({
  role: z.enum(['system', 'developer', 'user', 'assistant', 'tool']),
  content: z.union([z.string(), z.array(contentPart)], { error: 'expected a string or an array of text parts' }).nullish(),
  name: z.string().nullish(),
  /** An assistant's calls. */
  tool_calls: z.array(messageToolCall).nullish(),
  /** A tool message: the call it answers. */
  tool_call_id: z.string().nullish(),
});

export const functionParameters = z.record(z.string(), z.unknown());

const chatTool = z.object({
  type: z.literal('function', { error: 'only tools of type function are supported' }),
  function: z.object({
    name: z.string().regex(FUNCTION_NAME, 'expected a name of letters, digits, _ and -, at most 64 characters'),
    description: z.string().nullish(),
    parameters: functionParameters.nullish(),
    strict: z.boolean().nullish(),
  }),
});

const chatToolChoice = z.union(
  [z.enum(['none', 'auto', 'required']), z.object({ type: z.literal('function'), function: z.object({ name: z.string() }) })],
  { error: 'expected "none", "auto", "required" or {"type": "function", "function": {"name": ...}}' },
);

export const chatRequestSchema = z.object({
  ...generationFields,
  messages: z.array(message).min(1),
  max_completion_tokens: ranges.maxTokens.nullish(),
  logprobs: z.boolean().nullish(),
  top_logprobs: z.number().int().min(0).max(MAX_TOP_LOGPROBS).nullish(),
  tools: z.array(chatTool).max(MAX_TOOLS).nullish(),
  tool_choice: chatToolChoice.nullish(),
  parallel_tool_calls: z.boolean().nullish(),
  /** OpenAI's older spelling of tools and tool_choice. */
  functions: z.array(z.unknown()).nullish(),
  function_call: z.unknown().nullish(),
  response_format: responseFormatSchema.nullish(),
  /** Extension (vLLM): json, regex, choice, grammar, ... */
  structured_outputs: structuredOutputsSchema.nullish(),
  /** OpenAI's reasoning models' effort; the chat template reads it (gpt-oss: "Reasoning: high"). */
  reasoning_effort: z.enum(['minimal', 'low', 'medium', 'high']).nullish(),
  /** Extension (vLLM, transformers' apply_chat_template kwargs): variables the chat template reads, such as Qwen3's enable_thinking. */
  chat_template_kwargs: z.record(z.string(), z.unknown()).nullish(),
});

export const completionRequestSchema = z.object({
  ...generationFields,
  prompt: z.union(
    [
      z.string(),
      z.array(tokenId),
      z.array(z.string()).min(1).max(MAX_PROMPTS),
      z.array(z.array(tokenId)).min(1).max(MAX_PROMPTS),
    ],
    { error: `expected a string, an array of token ids, or an array of up to ${MAX_PROMPTS} strings or token-id arrays` },
  ),
  /** The prompt's text before the completion (with logprobs: the prompt tokens' too). */
  echo: z.boolean().nullish(),
  logprobs: z.number().int().min(0).max(MAX_TOP_LOGPROBS).nullish(),
  suffix: z.string().nullish(),
  best_of: z.number().int().min(1).nullish(),
  /** Extension (vLLM, as chat's): json_object or json_schema. */
  response_format: responseFormatSchema.nullish(),
  /** Extension (vLLM): json, regex, choice, grammar, ... */
  structured_outputs: structuredOutputsSchema.nullish(),
});

export const tokenizeRequestSchema = z.union(
  [
    z.object({
      model: z.string(),
      prompt: z.string(),
      add_special_tokens: z.boolean().default(true),
    }),
    z.object({
      model: z.string(),
      messages: z.array(message).min(1),
      add_generation_prompt: z.boolean().default(true),
    }),
  ],
  { error: 'expected {model, prompt} or {model, messages}' },
);

export const detokenizeRequestSchema = z.object({
  model: z.string(),
  tokens: z.array(tokenId),
});

export type ChatRequest = z.infer<typeof chatRequestSchema>;
export type CompletionRequest = z.infer<typeof completionRequestSchema>;
export type ChatMessageInput = z.infer<typeof message>;

/** OpenAI writes paths as `messages[0].content`. */
function formatParam(path: readonly PropertyKey[]): string {
  let param = '';
  for (const key of path) param += typeof key === 'number' ? `[${key}]` : param === '' ? String(key) : `.${String(key)}`;
  return param;
}

export function parseRequest<T>(schema: z.ZodType<T>, body: unknown): T {
  if (body === null || typeof body !== 'object' || Array.isArray(body)) {
    throw new ApiError('invalid_request', 'The request body must be a JSON object.');
  }
  const result = schema.safeParse(body, { reportInput: true });
  if (result.success) return result.data;
  const issue = result.error.issues[0];
  const param = formatParam(issue.path);
  if (issue.code === 'invalid_type' && issue.input === undefined) {
    throw new ApiError('invalid_request', `Missing required parameter: '${param}'.`, param);
  }
  const where = param === '' ? 'the request' : `'${param}'`;
  throw new ApiError('invalid_request', `Invalid value for ${where}: ${issue.message}.`, param === '' ? null : param);
}
