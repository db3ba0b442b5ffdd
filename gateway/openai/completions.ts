// POST /v1/completions.
import { randomUUID } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import { affinityKeyOf } from '../../router/affinity.ts';
import type { PromptTokenLogprobs } from '../../engine/types.ts';
import { ApiError } from '../errors.ts';
import type { GenerationRequest, TokenLogprob } from '../generation.ts';
import type { IsWanted, PromptEncoder } from '../prompt-encoder.ts';
import type { LoadedModel } from '../served-model.ts';
import type { OpenAIPluginOptions } from './index.ts';
import { CompletionLogprobsBuilder, concatCompletionLogprobs, promptLogprobsOf, type CompletionLogprobs } from './logprobs.ts';
import {
  DEFAULT_COMPLETION_MAX_TOKENS,
  MAX_CHOICES_PER_REQUEST,
  checkTokenIds,
  choiceRequestsOf,
  resolveMaxTokens,
  samplingOf,
  stopStringsOf,
  streamUsageOf,
} from './prepare.ts';
import { clientIsConnected, respond, unixSeconds, type ResponseRenderer } from './respond.ts';
import { sseChoiceFramer, sseEvent } from './sse.ts';
import { completionRequestSchema, parseRequest, type CompletionRequest } from './schemas.ts';
import { constraintOf } from './structured-outputs.ts';

/** One prompt of a request: its token ids, and its text as echo writes it. */
interface CompletionPrompt {
  tokenIds: number[];
  /** The prompt as given, or decoded from its token ids; '' unless echo needs it. */
  text: string;
  /** Where errors about it point: `prompt`, or `prompt[i]` in a list. */
  param: string;
}

/** A string, token ids, or a list of either; token-id prompts echo as their decoded text. */
async function promptsOf(
  model: LoadedModel,
  prompt: CompletionRequest['prompt'],
  echo: boolean,
  prompts: PromptEncoder,
  isWanted: IsWanted,
): Promise<CompletionPrompt[]> {
  const fromText = async (text: string, param: string) => ({ tokenIds: await prompts.encodePrompt(model, text, true, { isWanted }), text, param });
  const fromTokenIds = (tokenIds: number[], param: string) => {
    checkTokenIds(model, tokenIds, param);
    return { tokenIds, text: echo ? model.tokenizer.decode(tokenIds, { skipSpecialTokens: false }) : '', param };
  };
  if (typeof prompt === 'string') return [await fromText(prompt, 'prompt')];
  if (prompt.length === 0 || typeof prompt[0] === 'number') return [fromTokenIds(prompt as number[], 'prompt')];
  return Promise.all(
    (prompt as (string | number[])[]).map((item, index) =>
      typeof item === 'string' ? fromText(item, `prompt[${index}]`) : fromTokenIds(item, `prompt[${index}]`),
    ),
  );
}

function numPromptsOf(prompt: CompletionRequest['prompt']): number {
  return typeof prompt === 'string' || prompt.length === 0 || typeof prompt[0] === 'number' ? 1 : prompt.length;
}

function rejectUnsupportedCompletion(request: CompletionRequest) {
  const numChoices = request.n ?? 1;
  const numPrompts = numPromptsOf(request.prompt);
  if (request.suffix) throw new ApiError('unsupported_parameter', 'suffix is not supported.', 'suffix');
  if (request.best_of != null) {
    if (request.best_of > 1) throw new ApiError('unsupported_parameter', 'Only best_of=1 is supported.', 'best_of');
    // OpenAI: best_of is how many are generated, n how many are returned.
    if (request.best_of < numChoices) throw new ApiError('invalid_request', `best_of (${request.best_of}) must be at least n (${numChoices}).`, 'best_of');
  }
  if (numPrompts * numChoices > MAX_CHOICES_PER_REQUEST) {
    throw new ApiError(
      'invalid_request',
      `${numPrompts} prompts × n = ${numChoices} is ${numPrompts * numChoices} choices; at most ${MAX_CHOICES_PER_REQUEST} fit in one request.`,
      'n',
    );
  }
}

interface CompletionRendering {
  echo: boolean;
  /** OpenAI's logprobs value; null without logprobs. */
  numLogprobs: number | null;
  /** vLLM's prompt_logprobs value; null without. */
  numPromptLogprobs: number | null;
}

function completionRenderer(
  model: LoadedModel,
  prompts: readonly CompletionPrompt[],
  numChoicesPerPrompt: number,
  rendering: CompletionRendering,
): ResponseRenderer {
  const id = `cmpl-${randomUUID().replaceAll('-', '')}`;
  const created = unixSeconds();
  const envelope = { id, object: 'text_completion', created, model: model.name };
  const frame = sseChoiceFramer(envelope);
  const numChoices = prompts.length * numChoicesPerPrompt;
  const promptOf = (index: number) => prompts[Math.floor(index / numChoicesPerPrompt)];
  const logprobsBuilders = Array.from({ length: numChoices }, () => new CompletionLogprobsBuilder(model.tokenizer, rendering.numLogprobs ?? 0));
  const logprobsOf = (index: number, entries: TokenLogprob[] | null) => (entries === null ? null : logprobsBuilders[index].next(entries));
  const logprobsJson = (index: number, entries: TokenLogprob[] | null) =>
    entries === null ? 'null' : JSON.stringify(logprobsOf(index, entries));
  const echoLogprobsOf = (index: number, promptLogprobs: PromptTokenLogprobs[] | null): CompletionLogprobs | null => {
    if (rendering.numLogprobs === null) return null;
    const prompt = promptOf(index);
    return logprobsBuilders[index].prompt(prompt.text, prompt.tokenIds, promptLogprobs);
  };
  return {
    opensWithPromptLogprobs: rendering.echo && rendering.numLogprobs !== null,
    openingEvent: (index, promptLogprobs, usage) => {
      if (!rendering.echo) return null;
      const echoLogprobs = JSON.stringify(echoLogprobsOf(index, promptLogprobs));
      return frame(`{"index":${index},"text":${JSON.stringify(promptOf(index).text)},"logprobs":${echoLogprobs},"finish_reason":null}`, usage);
    },
    textEvent: (index, text, entries, usage) =>
      frame(`{"index":${index},"text":${JSON.stringify(text)},"logprobs":${logprobsJson(index, entries)},"finish_reason":null}`, usage),
    finishEvent: (index, finishReason, entries, usage) =>
      frame(`{"index":${index},"text":"","logprobs":${logprobsJson(index, entries)},"finish_reason":"${finishReason}"}`, usage),
    usageEvent: (usage) => sseEvent({ ...envelope, choices: [], usage }),
    response: (choices, usage) => ({
      ...envelope,
      choices: choices.map((choice, index) => {
        const prompt = promptOf(index);
        const echoLogprobs = rendering.echo ? echoLogprobsOf(index, choice.promptLogprobs) : null;
        const outputLogprobs = logprobsOf(index, choice.tokenLogprobs);
        return {
          index,
          text: rendering.echo ? prompt.text + choice.text : choice.text,
          logprobs: echoLogprobs !== null && outputLogprobs !== null ? concatCompletionLogprobs(echoLogprobs, outputLogprobs) : outputLogprobs,
          finish_reason: choice.finishReason,
          // vLLM puts a completion's prompt log-probabilities in every choice.
          ...(rendering.numPromptLogprobs === null || choice.promptLogprobs === null
            ? {}
            : { prompt_logprobs: promptLogprobsOf(model.tokenizer, prompt.tokenIds, choice.promptLogprobs, rendering.numPromptLogprobs) }),
        };
      }),
      usage,
    }),
  };
}

export function registerCompletionsRoute(app: FastifyInstance, { registry, metrics, streamLimits, prompts: promptEncoder }: OpenAIPluginOptions) {
  app.post('/v1/completions', async (httpRequest, reply) => {
    const arrivalMs = performance.now();
    const request = parseRequest(completionRequestSchema, httpRequest.body);
    const model = registry.get(request.model);
    const streamUsage = streamUsageOf(request);
    rejectUnsupportedCompletion(request);
    const prompts = await promptsOf(model, request.prompt, request.echo === true, promptEncoder, clientIsConnected(httpRequest));
    const numChoicesPerPrompt = request.n ?? 1;
    const isStream = request.stream === true;
    const echoesLogprobs = request.echo === true && request.logprobs != null;
    const constraint = constraintOf(request.response_format, request.structured_outputs);
    const structuredOutput = constraint === null ? undefined : { constraint, jumpForward: request.logprobs == null };
    const choiceRequests = prompts.flatMap((prompt): GenerationRequest[] => {
      const maxTokens = resolveMaxTokens(
        model,
        prompt.tokenIds.length,
        request.max_tokens,
        'max_tokens',
        prompt.param,
        DEFAULT_COMPLETION_MAX_TOKENS,
      );
      const generationRequest = {
        model,
        promptTokenIds: prompt.tokenIds,
        sampling: samplingOf(model, request, maxTokens, request.logprobs ?? 0, echoesLogprobs ? request.logprobs! : null),
        stopStrings: stopStringsOf(request.stop),
        wantsLogprobs: request.logprobs != null,
        priority: request.priority ?? undefined,
        cacheSalt: request.cache_salt ?? undefined,
        numSpeculativeTokens: request.num_speculative_tokens ?? undefined,
        includeStopStrInOutput: request.include_stop_str_in_output === true,
        structuredOutput,
        affinityKey: affinityKeyOf(httpRequest.headers),
        arrivalMs,
        account: httpRequest.account,
        trace: httpRequest.trace,
      };
      return choiceRequestsOf(generationRequest, numChoicesPerPrompt, echoesLogprobs && isStream);
    });
    return respond(
      reply,
      choiceRequests,
      completionRenderer(model, prompts, numChoicesPerPrompt, {
        echo: request.echo === true,
        numLogprobs: request.logprobs ?? null,
        numPromptLogprobs: request.prompt_logprobs ?? null,
      }),
      { stream: isStream, ...streamUsage, numChoicesPerPrompt, limits: streamLimits },
      metrics,
    );
  });
}
