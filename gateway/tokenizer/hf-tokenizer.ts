// A checkpoint's tokenizer.json, run by @huggingface/tokenizers.
import { readFileSync } from 'node:fs';
import { Tokenizer as HfTokenizer } from '@huggingface/tokenizers';
import { ApiError } from '../errors.ts';
import type { Tokenizer } from './tokenizer.ts';
import type { TokenizerConfig } from './tokenizer-config.ts';

const NO_BYTES = new Uint8Array(0);
const BYTE_FALLBACK_TOKEN = /^<0x([0-9A-Fa-f]{2})>$/;
/** SentencePiece's visible space. */
const METASPACE = '\u2581';

/** Inverse of GPT-2's byte-to-printable-character map, in which byte-level vocabularies are written. */
function byteLevelCharToByte(): Map<string, number> {
  const printable = new Set<number>();
  for (const [from, to] of [[0x21, 0x7e], [0xa1, 0xac], [0xae, 0xff]]) for (let b = from; b <= to; b++) printable.add(b);
  const byteByChar = new Map<string, number>();
  let numShifted = 0;
  for (let byte = 0; byte < 256; byte++) {
    byteByChar.set(String.fromCodePoint(printable.has(byte) ? byte : 256 + numShifted++), byte);
  }
  return byteByChar;
}

function usesByteLevelDecoder(decoder: unknown): boolean {
  if (decoder === null || typeof decoder !== 'object') return false;
  const { type, decoders } = decoder as { type?: unknown; decoders?: unknown };
  return type === 'ByteLevel' || (Array.isArray(decoders) && decoders.some(usesByteLevelDecoder));
}

/** Normalizers that never make text shorter: the tokens then cover at least the text's length. */
function neverShortens(normalizer: unknown): boolean {
  if (normalizer === null || normalizer === undefined) return true;
  if (typeof normalizer !== 'object') return false;
  const { type, normalizers, pattern, content } = normalizer as { type?: unknown; normalizers?: unknown; pattern?: { String?: unknown }; content?: unknown };
  if (type === 'Sequence') return Array.isArray(normalizers) && normalizers.every(neverShortens);
  if (type === 'Prepend' || type === 'Lowercase') return true;
  // SentencePiece's ' ' -> '▁': a fixed string replaced by one at least as long.
  return type === 'Replace' && typeof pattern?.String === 'string' && typeof content === 'string' && content.length >= pattern.String.length;
}

/**
 * Byte-level and byte-fallback BPE cover every character of the text with tokens whose bytes
 * are its own; with a normalizer that never shortens and no added token that strips whitespace
 * around itself, the longest token bounds how much text one token covers. Else no bound.
 */
function maxTokenCharsOf(json: TokenizerJson, isByteLevel: boolean, tokenBytes: (id: number) => Uint8Array, vocabSize: number): number | null {
  const coversEveryByte = json.model?.type === 'BPE' && (isByteLevel || json.model.byte_fallback === true);
  const stripsAround = (json.added_tokens ?? []).some((token) => token.lstrip === true || token.rstrip === true);
  if (!coversEveryByte || stripsAround || !neverShortens(json.normalizer)) return null;
  let maxTokenBytes = 0;
  for (let id = 0; id < vocabSize; id++) maxTokenBytes = Math.max(maxTokenBytes, tokenBytes(id).length);
  return maxTokenBytes;
}

interface TokenizerJson {
  model?: { type?: string; byte_fallback?: boolean; unk_token?: unknown };
  normalizer?: unknown;
  decoder?: unknown;
  added_tokens?: { lstrip?: boolean; rstrip?: boolean }[];
}

class HuggingFaceTokenizer implements Tokenizer {
  readonly vocabSize: number;
  readonly bosTokenId: number | null;
  readonly eosTokenIds: readonly number[];
  readonly specialTokenIds: ReadonlySet<number>;
  readonly maxTokenChars: number | null;
  readonly decodesAsUtf8Bytes: boolean;
  private readonly hf: HfTokenizer;
  private readonly addedTokenIds: ReadonlySet<number>;
  /** Set for byte-level vocabularies; null for SentencePiece-style ones. */
  private readonly byteByChar: Map<string, number> | null;
  private readonly utf8 = new TextEncoder();
  /** The model's unknown token, when it names one. */
  private readonly unkToken: string | null;

  constructor(hf: HfTokenizer, config: TokenizerConfig, json: TokenizerJson) {
    const isByteLevel = usesByteLevelDecoder(json.decoder);
    this.hf = hf;
    this.unkToken = typeof json.model?.unk_token === 'string' ? json.model.unk_token : null;
    let maxId = -1;
    for (const id of hf.get_vocab(true).values()) maxId = Math.max(maxId, id);
    this.vocabSize = maxId + 1;
    const idOf = (content: string | null) => (content === null ? undefined : hf.token_to_id(content));
    this.bosTokenId = idOf(config.bosToken) ?? null;
    const eosTokenId = idOf(config.eosToken);
    this.eosTokenIds = eosTokenId === undefined ? [] : [eosTokenId];
    const addedTokens = hf.get_added_tokens_decoder();
    this.addedTokenIds = new Set(addedTokens.keys());
    this.specialTokenIds = new Set([...addedTokens].filter(([, token]) => token.special).map(([id]) => id));
    this.byteByChar = isByteLevel ? byteLevelCharToByte() : null;
    this.maxTokenChars = maxTokenCharsOf(json, isByteLevel, (id) => this.tokenBytes(id), this.vocabSize);
    // A decoder sequence may rewrite text after the byte mapping (Replace, Strip); ByteLevel alone does not.
    this.decodesAsUtf8Bytes = (json.decoder as { type?: unknown } | null)?.type === 'ByteLevel';
  }

  encode(text: string, options: { addSpecialTokens: boolean }): number[] {
    const { ids, tokens } = this.hf.encode(text, { add_special_tokens: options.addSpecialTokens });
    // A vocabulary without an unknown token (WordLevel, WordPiece) leaves a piece it has no
    // word for without an id, where the Rust library refuses the text: refused here too.
    for (let i = 0; i < ids.length; i++) {
      if (typeof ids[i] !== 'number') throw this.unmappable(tokens[i]);
    }
    return ids;
  }

  private unmappable(piece: string): ApiError {
    const why = piece === this.unkToken
      ? `its unknown token ${JSON.stringify(piece)} is not in its vocabulary`
      : `it has no token for ${JSON.stringify(piece)} and no unknown token to stand for it`;
    return new ApiError('invalid_request', `The text cannot be tokenized: ${why}.`, null);
  }

  decode(tokenIds: readonly number[], options: { skipSpecialTokens: boolean }): string {
    const knownIds = tokenIds.filter((id) => id >= 0 && id < this.vocabSize);
    // The library refuses an empty list; nothing decodes to nothing.
    if (knownIds.length === 0) return '';
    // Clean-up rewrites text already streamed (" ." -> "."), so incremental decoding turns it off.
    return this.hf.decode(knownIds, { skip_special_tokens: options.skipSpecialTokens, clean_up_tokenization_spaces: false });
  }

  tokenBytes(tokenId: number): Uint8Array {
    const token = this.hf.id_to_token(tokenId);
    if (token === undefined) return NO_BYTES;
    if (this.addedTokenIds.has(tokenId)) return this.utf8.encode(token);
    if (this.byteByChar !== null) {
      const bytes = new Uint8Array(token.length);
      let numBytes = 0;
      for (const char of token) {
        const byte = this.byteByChar.get(char);
        if (byte === undefined) return this.utf8.encode(token);
        bytes[numBytes++] = byte;
      }
      return bytes.subarray(0, numBytes);
    }
    const byteFallback = BYTE_FALLBACK_TOKEN.exec(token);
    if (byteFallback !== null) return Uint8Array.of(parseInt(byteFallback[1], 16));
    return this.utf8.encode(token.replaceAll(METASPACE, ' '));
  }
}

export function loadHuggingFaceTokenizer(file: string, config: TokenizerConfig): Tokenizer {
  return huggingFaceTokenizerFromJson(JSON.parse(readFileSync(file, 'utf8')), config);
}

/** A tokenizer.json already parsed (or built: a GGUF file's embedded tokenizer). */
export function huggingFaceTokenizerFromJson(json: Record<string, unknown>, config: TokenizerConfig): Tokenizer {
  return new HuggingFaceTokenizer(new HfTokenizer(json, config.raw), config, json as TokenizerJson);
}
