// Renders a checkpoint's Jinja chat template the way transformers' apply_chat_template does.
import { Template } from '@huggingface/jinja';
import type { TokenizerConfig } from './tokenizer-config.ts';

/** Snake case, as chat templates read it (transformers' message dicts). */
export interface ChatMessage {
  role: string;
  content: string;
  /** An assistant's function calls. */
  tool_calls?: readonly ChatToolCall[];
  /** A tool message: the call it answers, and that function's name when known. */
  tool_call_id?: string;
  name?: string;
}

export interface ChatToolCall {
  id: string;
  type: 'function';
  /** arguments: the parsed object when the call's arguments are JSON (templates apply tojson), else the text. */
  function: { name: string; arguments: unknown };
}

/**
 * Extra variables a template reads, as transformers' apply_chat_template(**kwargs) passes them
 * (vLLM's chat_template_kwargs): Qwen3's enable_thinking, gpt-oss's reasoning_effort.
 */
export type TemplateKwargs = Readonly<Record<string, unknown>>;

/** What a template reads besides the messages and whether to open the assistant's turn. */
export interface TemplateInputs {
  /** The request's tools, as transformers hands them to templates (OpenAI's function tool objects). */
  tools?: readonly object[];
  kwargs?: TemplateKwargs;
}

export interface RenderOptions extends TemplateInputs {
  addGenerationPrompt: boolean;
}

export interface ChatTemplate {
  render(messages: readonly ChatMessage[], options: RenderOptions): string;
}

/** Null when the checkpoint has no template; chat requests to it are then refused. */
export function loadChatTemplate(config: TokenizerConfig): ChatTemplate | null {
  if (config.chatTemplate === null) return null;
  const template = new Template(config.chatTemplate);
  const bosToken = config.bosToken ?? '';
  const eosToken = config.eosToken ?? '';
  return {
    render(messages, options) {
      // The kwargs come first: they may not replace the messages or the special tokens.
      return template.render({
        ...options.kwargs,
        messages,
        add_generation_prompt: options.addGenerationPrompt,
        bos_token: bosToken,
        eos_token: eosToken,
        ...(options.tools === undefined ? {} : { tools: options.tools }),
      });
    },
  };
}
