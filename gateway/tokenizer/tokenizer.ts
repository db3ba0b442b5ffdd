// What the gateway needs from any tokenizer, whichever library backs it.

export interface Tokenizer {
  /** Ids run from 0 to vocabSize - 1, special tokens included. */
  readonly vocabSize: number;
  readonly bosTokenId: number | null;
  readonly eosTokenIds: readonly number[];
  readonly specialTokenIds: ReadonlySet<number>;
  /**
   * The most UTF-16 code units of text that one token can stand for, or null when the
   * tokenizer gives no such bound (a normalizer that drops characters, a token that swallows
   * whitespace). Text longer than this times n cannot encode to n tokens or fewer.
   */
  readonly maxTokenChars: number | null;
  /**
   * Special tokens written in the text (e.g. a rendered chat template's `<|im_start|>`) encode
   * as themselves. addSpecialTokens adds what the checkpoint adds around a bare prompt (BOS).
   * Text it cannot map (a word-level vocabulary with no unknown token) throws an ApiError
   * (invalid_request) naming the first piece it could not.
   */
  encode(text: string, options: { addSpecialTokens: boolean }): number[];
  /**
   * An incomplete UTF-8 character at the end decodes to U+FFFD; the incremental detokenizer
   * relies on that to hold such bytes back. Ids outside the vocabulary decode to nothing.
   */
  decode(tokenIds: readonly number[], options: { skipSpecialTokens: boolean }): string;
  /**
   * Set when decode() is the UTF-8 decoding of the tokens' concatenated tokenBytes, special
   * tokens skipped (byte-level BPE, tiktoken): streams then decode by table lookup.
   */
  readonly decodesAsUtf8Bytes: boolean;
  /** The bytes one token stands for, possibly part of a character; empty outside the vocabulary. */
  tokenBytes(tokenId: number): Uint8Array;
}
