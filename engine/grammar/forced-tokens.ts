// Jump-forward: when a grammar forces the next bytes (a schema's next key, `": "`, a closing
// brace), they become tokens without sampling. The text comes from xgrammar after the tokens the
// matcher has accepted, one step behind the engine: it was computed with the mask the last token
// was drawn under. What that token did not already spell is the forced remainder; it is split
// greedily into the longest tokens that spell it, and its last piece is left to the sampler, so
// the model may still choose a token that runs past the forced text (`"` then `"Paris` rather
// than the forced `"` alone) and the tokenization stays close to the tokenizer's own.
import type { GrammarVocabulary } from './vocabulary.ts';

/** Tokens longer than this are never tried: forced text is mostly short keys and punctuation. */
const MAX_TOKEN_BYTES = 48;

function keyOf(bytes: Uint8Array, start = 0, end = bytes.length): string {
  return Buffer.from(bytes.buffer, bytes.byteOffset + start, end - start).toString('latin1');
}

export class ForcedTokenizer {
  private readonly tokenBytes: (Uint8Array | null)[];
  /** Bytes (as a latin1 string) -> the lowest id that spells them. */
  private readonly idOfBytes = new Map<string, number>();

  constructor(vocabulary: GrammarVocabulary) {
    this.tokenBytes = vocabulary.tokenBytes;
    this.tokenBytes.forEach((bytes, id) => {
      if (bytes === null || bytes.length === 0 || bytes.length > MAX_TOKEN_BYTES) return;
      const key = keyOf(bytes);
      if (!this.idOfBytes.has(key)) this.idOfBytes.set(key, id);
    });
  }

  /**
   * The tokens to emit without sampling after sampledTokenId, given the text the grammar forced
   * before it was drawn; empty when nothing more is forced.
   */
  forcedAfter(forcedText: string, sampledTokenId: number): number[] {
    const sampled = this.tokenBytes[sampledTokenId];
    if (sampled === null || sampled === undefined || forcedText === '') return [];
    // A character xgrammar could not hand over whole (cut mid-UTF-8) ends what is usable.
    const replacement = forcedText.indexOf('\uFFFD');
    const forced = Buffer.from(replacement === -1 ? forcedText : forcedText.slice(0, replacement), 'utf8');
    if (forced.length <= sampled.length || keyOf(forced, 0, sampled.length) !== keyOf(sampled)) return [];
    const pieces = this.tokenize(forced, sampled.length);
    return pieces.slice(0, -1);
  }

  /** The tokens to emit before anything is sampled, given the text a grammar forces from its start. */
  forcedStart(forcedText: string): number[] {
    const replacement = forcedText.indexOf('\uFFFD');
    const forced = Buffer.from(replacement === -1 ? forcedText : forcedText.slice(0, replacement), 'utf8');
    return this.tokenize(forced, 0).slice(0, -1);
  }

  /** Longest-match tokens spelling bytes[start..]; stops early at a byte no token spells. */
  private tokenize(bytes: Uint8Array, start: number): number[] {
    const tokenIds: number[] = [];
    let position = start;
    while (position < bytes.length) {
      let found = -1;
      let length = Math.min(MAX_TOKEN_BYTES, bytes.length - position);
      for (; length > 0; length--) {
        const id = this.idOfBytes.get(keyOf(bytes, position, position + length));
        if (id !== undefined) {
          found = id;
          break;
        }
      }
      if (found === -1) break;
      tokenIds.push(found);
      position += length;
    }
    return tokenIds;
  }
}
