// Turns a growing list of token ids into text deltas without ever splitting a character. With a
// byte-level vocabulary one character may span tokens, and a decode that ends mid-character
// ends in U+FFFD; those trailing replacement characters are held back until the bytes that
// complete them arrive (or the request ends). Decoding a short window of recent tokens, not the
// whole output, keeps each step cheap; the window starts a few tokens back so tokenizers whose
// decoding depends on the previous token (SentencePiece's leading space) stay exact.

import type { Tokenizer } from './tokenizer.ts';
import { Utf8Detokenizer } from './utf8-detokenizer.ts';

const REPLACEMENT_CHAR = '\uFFFD';
/** Tokens of already-emitted context kept at the window's start. */
const NUM_CONTEXT_TOKENS = 4;
/**
 * The window slides only once it holds this many tokens: sliding re-decodes the kept context,
 * so sliding on every push would decode twice per token.
 */
const MAX_WINDOW_TOKENS = 16;

export type DecodeFn = (tokenIds: readonly number[]) => string;

/** Turns a request's output tokens into text deltas that never split a character. */
export interface Detokenizer {
  /** Appends tokens; returns the newly complete text (possibly ''). */
  push(newTokenIds: readonly number[]): string;
  /** The request is over: whatever is held back is final, replacement characters included. */
  flush(): string;
}

/** The table-driven byte decoder where the vocabulary allows it, else windowed re-decoding; special tokens skipped. */
export function createDetokenizer(tokenizer: Tokenizer): Detokenizer {
  if (tokenizer.decodesAsUtf8Bytes) return new Utf8Detokenizer(tokenizer);
  return new IncrementalDetokenizer((tokenIds) => tokenizer.decode(tokenIds, { skipSpecialTokens: true }));
}

export class IncrementalDetokenizer implements Detokenizer {
  private readonly decode: DecodeFn;
  /** The recent tokens that are decoded together; older ones are dropped in place. */
  private readonly windowTokenIds: number[] = [];
  /** How much of the window's decoded text has been emitted. */
  private numEmittedChars = 0;

  constructor(decode: DecodeFn) {
    this.decode = decode;
  }

  /** Appends tokens; returns the newly complete text (possibly ''). */
  push(newTokenIds: readonly number[]): string {
    for (const id of newTokenIds) this.windowTokenIds.push(id);
    const text = this.decode(this.windowTokenIds);
    let stableLength = text.length;
    while (stableLength > this.numEmittedChars && text[stableLength - 1] === REPLACEMENT_CHAR) stableLength--;
    const delta = stableLength > this.numEmittedChars ? text.slice(this.numEmittedChars, stableLength) : '';
    this.numEmittedChars = Math.max(this.numEmittedChars, stableLength);
    if (stableLength === text.length) this.slideWindow();
    return delta;
  }

  /** The request is over: whatever is held back is final, replacement characters included. */
  flush(): string {
    const text = this.decode(this.windowTokenIds);
    const delta = text.slice(this.numEmittedChars);
    this.numEmittedChars = text.length;
    return delta;
  }

  /** Everything in the window is emitted and complete: once it is long, keep only its last few tokens as context. */
  private slideWindow() {
    if (this.windowTokenIds.length < MAX_WINDOW_TOKENS) return;
    const numDroppedTokens = this.windowTokenIds.length - NUM_CONTEXT_TOKENS;
    this.windowTokenIds.splice(0, numDroppedTokens);
    this.numEmittedChars = this.decode(this.windowTokenIds).length;
  }
}
