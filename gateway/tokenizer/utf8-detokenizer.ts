// Streaming detokenization for vocabularies whose decoding is plain UTF-8 over the tokens' bytes
// (byte-level BPE, tiktoken). A token is emitted by table lookup: its bytes are decoded once per
// tokenizer, and a token that is whole UTF-8 on its own is its own text whenever no partial
// character is pending. Only tokens around a split character go through the UTF-8 decoder, with
// the bytes of the incomplete trailing character held back. The text streamed equals decoding
// every token at once: a held-back sequence is always cut at a lead byte, where no UTF-8
// sequence can continue across the cut.
import type { Detokenizer } from './incremental-detokenizer.ts';
import type { Tokenizer } from './tokenizer.ts';

/** Bytes at most in one UTF-8 character, and so in a held-back partial one (less one). */
const MAX_CHAR_BYTES = 4;

/** What a tokenizer's tokens decode to, filled as tokens are first seen. */
interface TokenTexts {
  /** The token's text when its bytes are whole UTF-8 on their own, null when they are not. */
  readonly wholeText: (string | null | undefined)[];
  readonly bytes: (Uint8Array | undefined)[];
}

const textsByTokenizer = new WeakMap<Tokenizer, TokenTexts>();
const strictUtf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });
// Stateless (never `stream: true`), so one instance serves every stream.
const lossyUtf8 = new TextDecoder('utf-8', { fatal: false, ignoreBOM: true });

function textsOf(tokenizer: Tokenizer): TokenTexts {
  let texts = textsByTokenizer.get(tokenizer);
  if (texts === undefined) {
    // Preallocated so that the first token seen, whatever its id, leaves a fast, non-sparse array.
    texts = { wholeText: new Array(tokenizer.vocabSize), bytes: new Array(tokenizer.vocabSize) };
    textsByTokenizer.set(tokenizer, texts);
  }
  return texts;
}

/** Bytes a UTF-8 sequence that starts with this byte needs; 1 for ASCII and for bytes no sequence starts with. */
function sequenceLength(leadByte: number): number {
  if (leadByte < 0xc2) return 1;
  if (leadByte < 0xe0) return 2;
  if (leadByte < 0xf0) return 3;
  return leadByte < 0xf5 ? 4 : 1;
}

/** Where an incomplete character at the end of bytes[0, length) begins, or length when there is none. */
function completeLength(bytes: Uint8Array, length: number): number {
  for (let i = length - 1; i >= 0 && i > length - MAX_CHAR_BYTES; i--) {
    if ((bytes[i] & 0xc0) === 0x80) continue;
    return length - i < sequenceLength(bytes[i]) ? i : length;
  }
  return length;
}

export class Utf8Detokenizer implements Detokenizer {
  private readonly tokenizer: Tokenizer;
  private readonly texts: TokenTexts;
  /** Bytes not yet decoded: the start of a character whose remaining bytes have not arrived. */
  private pending = new Uint8Array(64);
  private numPendingBytes = 0;

  constructor(tokenizer: Tokenizer) {
    this.tokenizer = tokenizer;
    this.texts = textsOf(tokenizer);
  }

  /** Appends tokens; returns the newly complete text (possibly ''). Special tokens decode to nothing. */
  push(newTokenIds: readonly number[]): string {
    let text = '';
    for (const tokenId of newTokenIds) {
      if (this.tokenizer.specialTokenIds.has(tokenId)) continue;
      if (this.numPendingBytes === 0) {
        const wholeText = this.wholeTextOf(tokenId);
        if (wholeText !== null) {
          text += wholeText;
          continue;
        }
      }
      text += this.decodeThrough(this.bytesOf(tokenId));
    }
    return text;
  }

  /** The request is over: bytes that never completed a character decode to U+FFFD. */
  flush(): string {
    const text = lossyUtf8.decode(this.pending.subarray(0, this.numPendingBytes));
    this.numPendingBytes = 0;
    return text;
  }

  /** Appends bytes to the pending ones and decodes all but an incomplete last character. */
  private decodeThrough(bytes: Uint8Array): string {
    const numBytes = this.numPendingBytes + bytes.length;
    if (numBytes > this.pending.length) {
      const grown = new Uint8Array(Math.max(numBytes, 2 * this.pending.length));
      grown.set(this.pending.subarray(0, this.numPendingBytes));
      this.pending = grown;
    }
    this.pending.set(bytes, this.numPendingBytes);
    const numCompleteBytes = completeLength(this.pending, numBytes);
    const text = lossyUtf8.decode(this.pending.subarray(0, numCompleteBytes));
    this.pending.copyWithin(0, numCompleteBytes, numBytes);
    this.numPendingBytes = numBytes - numCompleteBytes;
    return text;
  }

  private bytesOf(tokenId: number): Uint8Array {
    let bytes = this.texts.bytes[tokenId];
    if (bytes === undefined) {
      bytes = this.tokenizer.tokenBytes(tokenId);
      if (tokenId >= 0 && tokenId < this.tokenizer.vocabSize) this.texts.bytes[tokenId] = bytes;
    }
    return bytes;
  }

  private wholeTextOf(tokenId: number): string | null {
    let wholeText = this.texts.wholeText[tokenId];
    if (wholeText === undefined) {
      const bytes = this.bytesOf(tokenId);
      try {
        wholeText = completeLength(bytes, bytes.length) === bytes.length ? strictUtf8.decode(bytes) : null;
      } catch {
        wholeText = null;
      }
      if (tokenId >= 0 && tokenId < this.tokenizer.vocabSize) this.texts.wholeText[tokenId] = wholeText;
    }
    return wholeText;
  }
}
