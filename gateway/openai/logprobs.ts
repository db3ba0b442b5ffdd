// Log-probabilities in OpenAI's two shapes. The engine reports the sampled token's log-probability
// only, so top_logprobs are empty (chat) or hold just the sampled token (completions).
import type { TokenLogprob } from '../generation.ts';
import type { Tokenizer } from '../tokenizer/tokenizer.ts';

const strictUtf8 = new TextDecoder('utf-8', { fatal: true });
const lenientUtf8 = new TextDecoder('utf-8', { fatal: false });

/** A token's text; a token that is only part of a character reads `bytes:\xe6\x9d` as OpenAI writes it. */
function tokenText(bytes: Uint8Array): string {
  try {
    return strictUtf8.decode(bytes);
  } catch {
    let text = 'bytes:';
    for (const byte of bytes) text += `\\x${byte.toString(16).padStart(2, '0')}`;
    return text;
  }
}

export interface ChatLogprobs {
  content: { token: string; logprob: number; bytes: number[]; top_logprobs: [] }[];
}

export function chatLogprobsOf(tokenizer: Tokenizer, tokenLogprobs: readonly TokenLogprob[]): ChatLogprobs {
  return {
    content: tokenLogprobs.map(({ tokenId, logprob }) => {
      const bytes = tokenizer.tokenBytes(tokenId);
      return { token: tokenText(bytes), logprob, bytes: Array.from(bytes), top_logprobs: [] };
    }),
  };
}

export interface CompletionLogprobs {
  tokens: string[];
  token_logprobs: number[];
  top_logprobs: Record<string, number>[];
  text_offset: number[];
}

/** Completions report each token's offset in the choice's text, so one instance follows one choice. */
export class CompletionLogprobsBuilder {
  private readonly tokenizer: Tokenizer;
  private numTextChars = 0;

  constructor(tokenizer: Tokenizer) {
    this.tokenizer = tokenizer;
  }

  next(tokenLogprobs: readonly TokenLogprob[]): CompletionLogprobs {
    const logprobs: CompletionLogprobs = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
    for (const { tokenId, logprob } of tokenLogprobs) {
      const bytes = this.tokenizer.tokenBytes(tokenId);
      const token = tokenText(bytes);
      logprobs.tokens.push(token);
      logprobs.token_logprobs.push(logprob);
      logprobs.top_logprobs.push({ [token]: logprob });
      logprobs.text_offset.push(this.numTextChars);
      // Special tokens are not part of the text.
      if (!this.tokenizer.specialTokenIds.has(tokenId)) this.numTextChars += lenientUtf8.decode(bytes).length;
    }
    return logprobs;
  }
}
