// A prompt's way from text to token ids, the same on the event loop and in a worker thread:
// render the chat template, refuse text that cannot fit before paying to tokenize it, encode.
import { ApiError } from '../errors.ts';
import type { ChatMessage, ChatTemplate, TemplateInputs } from './chat-template.ts';
import type { Tokenizer } from './tokenizer.ts';

export interface PromptModel {
  name: string;
  maxModelLen: number;
  tokenizer: Tokenizer;
  chatTemplate: ChatTemplate | null;
}

/**
 * vLLM's check before tokenizing: text longer than the context times the most text one token
 * covers cannot fit, whatever it says. No prompt that could fit is refused; null without a bound.
 */
export function maxPromptChars(model: PromptModel): number | null {
  const { maxTokenChars } = model.tokenizer;
  return maxTokenChars === null ? null : maxTokenChars * model.maxModelLen;
}

export function checkPromptChars(model: PromptModel, numChars: number) {
  const maxChars = maxPromptChars(model);
  if (maxChars === null || numChars <= maxChars) return;
  throw new ApiError(
    'context_length_exceeded',
    `The prompt has ${numChars} characters; this model's context of ${model.maxModelLen} tokens holds at most ` +
      `${maxChars} (${model.tokenizer.maxTokenChars} per token at the most). Please shorten the prompt.`,
    'input_text',
  );
}

/** param: the request field errors point at (`messages`, or the Responses API's `input`). */
export function renderChat(
  model: PromptModel, messages: readonly ChatMessage[], addGenerationPrompt: boolean, param = 'messages', inputs: TemplateInputs = {},
): string {
  if (model.chatTemplate === null) {
    throw new ApiError(
      'chat_template_missing',
      `The model \`${model.name}\` has no chat template; use /v1/completions with a plain prompt.`,
      param,
    );
  }
  try {
    return model.chatTemplate.render(messages, { addGenerationPrompt, ...inputs });
  } catch (err) {
    throw new ApiError('chat_template_error', `The chat template rejected the messages: ${(err as Error).message}`, param);
  }
}

/**
 * addSpecialTokens: what the checkpoint adds around a bare prompt; a rendered chat has its own.
 * fitContext: refuse text the context cannot hold; vLLM's /tokenize counts any text, as here without it.
 */
export function encodePrompt(model: PromptModel, text: string, addSpecialTokens: boolean, fitContext = true): number[] {
  if (fitContext) checkPromptChars(model, text.length);
  return model.tokenizer.encode(text, { addSpecialTokens });
}

/** The chat template rendered, then encoded with its special tokens as written. */
export function encodeChat(
  model: PromptModel, messages: readonly ChatMessage[], addGenerationPrompt: boolean, param = 'messages', fitContext = true, inputs: TemplateInputs = {},
): number[] {
  return encodePrompt(model, renderChat(model, messages, addGenerationPrompt, param, inputs), false, fitContext);
}
