// Log-probabilities in OpenAI's two shapes (chat and text completions), and prompt
// log-probabilities in vLLM's.
import type { PromptTokenLogprobs } from '../../engine/types.ts';
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

interface ChatTokenLogprob {
  token: string;
  logprob: number;
  bytes: number[];
}

export interface ChatLogprobs {
  content: (ChatTokenLogprob & { top_logprobs: ChatTokenLogprob[] })[];
}

function chatTokenLogprob(tokenizer: Tokenizer, tokenId: number, logprob: number): ChatTokenLogprob {
  const bytes = tokenizer.tokenBytes(tokenId);
  return { token: tokenText(bytes), logprob, bytes: Array.from(bytes) };
}

export function chatLogprobsOf(tokenizer: Tokenizer, tokenLogprobs: readonly TokenLogprob[]): ChatLogprobs {
  return {
    content: tokenLogprobs.map(({ tokenId, logprob, topTokenIds, topLogprobs }) => ({
      ...chatTokenLogprob(tokenizer, tokenId, logprob),
      top_logprobs: topTokenIds.map((topTokenId, i) => chatTokenLogprob(tokenizer, topTokenId, topLogprobs[i])),
    })),
  };
}

export interface CompletionLogprobs {
  tokens: string[];
  /** null only for an echoed prompt's first token, which nothing scores. */
  token_logprobs: (number | null)[];
  top_logprobs: (Record<string, number> | null)[];
  text_offset: number[];
}

/** Completions report each token's offset in the choice's text, so one instance follows one choice. */
export class CompletionLogprobsBuilder {
  private readonly tokenizer: Tokenizer;
  /** Alternatives per token (OpenAI's logprobs value). */
  private readonly numAlternatives: number;
  private numTextChars = 0;

  constructor(tokenizer: Tokenizer, numAlternatives: number) {
    this.tokenizer = tokenizer;
    this.numAlternatives = numAlternatives;
  }

  /**
   * echo with logprobs: the prompt's tokens open the choice, the first with null (nothing
   * scores it). Output offsets then count from the end of promptText, the echoed text.
   */
  prompt(promptText: string, promptTokenIds: readonly number[], promptLogprobs: readonly PromptTokenLogprobs[] | null): CompletionLogprobs {
    const logprobs: CompletionLogprobs = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
    for (const [i, tokenId] of promptTokenIds.entries()) {
      const scored = i === 0 ? undefined : promptLogprobs?.[i - 1];
      this.push(logprobs, tokenId, scored?.logprob ?? null, scored?.topTokenIds ?? [], scored?.topLogprobs ?? []);
    }
    this.numTextChars = promptText.length;
    return logprobs;
  }

  next(tokenLogprobs: readonly TokenLogprob[]): CompletionLogprobs {
    const logprobs: CompletionLogprobs = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
    for (const { tokenId, logprob, topTokenIds, topLogprobs } of tokenLogprobs) this.push(logprobs, tokenId, logprob, topTokenIds, topLogprobs);
    return logprobs;
  }

  private push(
    logprobs: CompletionLogprobs,
    tokenId: number,
    logprob: number | null,
    topTokenIds: readonly number[],
    topLogprobs: readonly number[],
  ) {
    const bytes = this.tokenizer.tokenBytes(tokenId);
    const token = tokenText(bytes);
    logprobs.tokens.push(token);
    logprobs.token_logprobs.push(logprob);
    if (logprob === null) {
      logprobs.top_logprobs.push(null);
    } else {
      // OpenAI: the likeliest alternatives, and always the sampled token.
      const top: Record<string, number> = {};
      const numTop = Math.min(this.numAlternatives, topTokenIds.length);
      for (let i = 0; i < numTop; i++) top[tokenText(this.tokenizer.tokenBytes(topTokenIds[i]))] = topLogprobs[i];
      top[token] = logprob;
      logprobs.top_logprobs.push(top);
    }
    logprobs.text_offset.push(this.numTextChars);
    // Special tokens are not part of the text.
    if (!this.tokenizer.specialTokenIds.has(tokenId)) this.numTextChars += lenientUtf8.decode(bytes).length;
  }
}

/** Log-probabilities of consecutive pieces of one choice, joined as one (non-streamed echo). */
export function concatCompletionLogprobs(first: CompletionLogprobs, second: CompletionLogprobs): CompletionLogprobs {
  return {
    tokens: first.tokens.concat(second.tokens),
    token_logprobs: first.token_logprobs.concat(second.token_logprobs),
    top_logprobs: first.top_logprobs.concat(second.top_logprobs),
    text_offset: first.text_offset.concat(second.text_offset),
  };
}

export interface PromptTokenLogprob {
  logprob: number;
  /** 1 for the likeliest token. */
  rank: number;
  decoded_token: string;
}

/**
 * vLLM's prompt_logprobs: null for the first prompt token (nothing scores it), then per token a
 * map from token id to its entry: the prompt's own token and the requested alternatives.
 */
export function promptLogprobsOf(
  tokenizer: Tokenizer,
  promptTokenIds: readonly number[],
  promptLogprobs: readonly PromptTokenLogprobs[],
  numAlternatives: number,
): (Record<number, PromptTokenLogprob> | null)[] {
  const entries: (Record<number, PromptTokenLogprob> | null)[] = [null];
  for (const [i, scored] of promptLogprobs.entries()) {
    const tokenId = promptTokenIds[i + 1];
    const entry: Record<number, PromptTokenLogprob> = {};
    const numTop = Math.min(numAlternatives, scored.topTokenIds.length);
    for (let rankIndex = 0; rankIndex < numTop; rankIndex++) {
      const topTokenId = scored.topTokenIds[rankIndex];
      entry[topTokenId] = { logprob: scored.topLogprobs[rankIndex], rank: rankIndex + 1, decoded_token: tokenText(tokenizer.tokenBytes(topTokenId)) };
    }
    entry[tokenId] = { logprob: scored.logprob, rank: scored.rank, decoded_token: tokenText(tokenizer.tokenBytes(tokenId)) };
    entries.push(entry);
  }
  return entries;
}
