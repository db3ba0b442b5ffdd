// Prompts to token ids without holding the event loop: a small prompt is rendered and tokenized
// right here (a couple of milliseconds at most), a large one in the offload pool. Either way
// text that cannot fit the context is refused by its length before anyone pays to tokenize it.
import type { OffloadPool } from './offload/pool.ts';
import { numbersOf, utf8Of } from './offload/sliced-copy.ts';
import type { RegisteredModel } from './served-model.ts';
import type { ChatMessage, TemplateInputs, TemplateKwargs } from './tokenizer/chat-template.ts';
import { checkPromptChars, encodePrompt, renderChat } from './tokenizer/prompt.ts';

/** Tokenized on the loop up to this: about 2 ms at Hugging Face tokenizers' 1 µs per character. */
export const MAX_INLINE_PROMPT_CHARS = 2048;
/** Rendered on the loop up to this many messages: about 1.3 ms at 20 µs per message. */
export const MAX_INLINE_MESSAGES = 64;

/** False once the request's client has gone: queued work for it is dropped. */
export type IsWanted = () => boolean;

export interface EncodeOptions {
  isWanted?: IsWanted;
  /** The request field errors point at: `messages` by default, the Responses API's `input`. */
  param?: string;
  /**
   * Refuse text the context cannot hold (the default). vLLM's /tokenize counts any text: its
   * size is bounded by the body limit, not the context.
   */
  fitContext?: boolean;
  /** A chat's tools, for a template that renders them (tool-calls/tools.ts). */
  tools?: readonly object[];
  /** Variables the chat template reads besides the messages (chat_template_kwargs, reasoning_effort). */
  templateKwargs?: TemplateKwargs;
}

export class PromptEncoder {
  private readonly pool: OffloadPool;

  constructor(pool: OffloadPool) {
    this.pool = pool;
  }

  /** addSpecialTokens: what the checkpoint adds around a bare prompt (a rendered chat has its own). */
  async encodePrompt(model: RegisteredModel, text: string, addSpecialTokens: boolean, options: EncodeOptions = {}): Promise<number[]> {
    const { isWanted, fitContext = true } = options;
    if (fitContext) checkPromptChars(model, text.length);
    if (text.length <= MAX_INLINE_PROMPT_CHARS) return encodePrompt(model, text, addSpecialTokens, fitContext);
    const textBytes = await utf8Of(text);
    const job = { kind: 'encodePrompt', model: refOf(model), textBytes, addSpecialTokens, fitContext } as const;
    return numbersOf(await this.pool.run(job, { isWanted, transfer: [textBytes.buffer as ArrayBuffer] }));
  }

  async encodeChat(model: RegisteredModel, messages: readonly ChatMessage[], addGenerationPrompt: boolean, options: EncodeOptions = {}): Promise<number[]> {
    const { isWanted, param = 'messages', fitContext = true, tools, templateKwargs } = options;
    const inputs: TemplateInputs = { tools: tools as object[] | undefined, kwargs: templateKwargs };
    if (messages.length > MAX_INLINE_MESSAGES && model.chatTemplate !== null) {
      const job = { kind: 'encodeChat', model: refOf(model), messages: messages as ChatMessage[], addGenerationPrompt, param, fitContext, inputs } as const;
      return numbersOf(await this.pool.run(job, { isWanted }));
    }
    // Rendering a few messages is cheap however long they are; tokenizing them may not be.
    const prompt = renderChat(model, messages, addGenerationPrompt, param, inputs);
    return this.encodePrompt(model, prompt, false, { isWanted, fitContext });
  }
}

function refOf(model: RegisteredModel) {
  return { name: model.name, modelDir: model.modelDir, maxModelLen: model.maxModelLen };
}
