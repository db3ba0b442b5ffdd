// Renders a checkpoint's Jinja chat template the way transformers' apply_chat_template does.
import { Template } from '@huggingface/jinja';
import type { TokenizerConfig } from './tokenizer-config.ts';

export interface ChatMessage {
  role: string;
  content: string;
}

export interface ChatTemplate {
  render(messages: readonly ChatMessage[], options: { addGenerationPrompt: boolean }): string;
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
      });
    },
  };
}
