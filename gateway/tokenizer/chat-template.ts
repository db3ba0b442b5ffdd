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

export interface RenderOptions {
  addGenerationPrompt: boolean;
  /** The request's tools, as transformers hands them to templates (OpenAI's function tool objects). */
  tools?: readonly object[];
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
      return template.render({
        messages,
        add_generation_prompt: options.addGenerationPrompt,
        bos_token: bosToken,
        eos_token: eosToken,
        ...(options.tools === undefined ? {} : { tools: options.tools }),
      });
    },
  };
}
