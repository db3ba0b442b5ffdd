// Tokenizers backed by tiktoken: a bundled OpenAI encoding named in tokenizer_config.json, or
// a Llama 3 style `tokenizer.model` ranks file (one "base64-token rank" per line). Encoding runs
// in tiktoken's WASM; decoding runs here over a table of each token's bytes, so unknown ids are
// skipped rather than trapping inside WASM.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { Tiktoken, get_encoding, type TiktokenEncoding } from 'tiktoken';
import type { Tokenizer } from './tokenizer.ts';
import type { TokenizerConfig } from './tokenizer-config.ts';

/** The pre-tokenizer split of Llama 3's tiktoken tokenizer. */
export const LLAMA3_SPLIT_PATTERN =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const BUNDLED_ENCODINGS: readonly TiktokenEncoding[] = ['gpt2', 'r50k_base', 'p50k_base', 'p50k_edit', 'cl100k_base', 'o200k_base'];
const NUM_BYTE_VALUES = 256;
const NO_BYTES = new Uint8Array(0);

class TiktokenTokenizer implements Tokenizer {
  readonly vocabSize: number;
  readonly bosTokenId: number | null;
  readonly eosTokenIds: readonly number[];
  readonly specialTokenIds: ReadonlySet<number>;
  readonly maxTokenChars: number;
  readonly decodesAsUtf8Bytes = true;
  private readonly encoding: Tiktoken;
  private readonly bytesById: readonly (Uint8Array | undefined)[];
  private readonly addBosToken: boolean;
  private readonly utf8 = new TextDecoder('utf-8', { fatal: false });
  /** Reused across decode calls; grows to the longest decode seen. */
  private scratch = new Uint8Array(1024);

  constructor(
    encoding: Tiktoken,
    bytesById: (Uint8Array | undefined)[],
    specialIdsByContent: Map<string, number>,
    bundledSpecials: Record<string, number>,
    config: TokenizerConfig,
  ) {
    this.encoding = encoding;
    this.bytesById = bytesById;
    this.vocabSize = bytesById.length;
    const idOf = (content: string | null) => (content === null ? undefined : specialIdsByContent.get(content));
    this.bosTokenId = idOf(config.bosToken) ?? null;
    const eosTokenId = idOf(config.eosToken);
    this.eosTokenIds = eosTokenId === undefined ? [] : [eosTokenId];
    // Output text skips the encoding's own specials and the checkpoint's added tokens marked special.
    this.specialTokenIds = new Set([
      ...Object.values(bundledSpecials),
      ...config.addedTokens.filter((token) => token.special).map((token) => token.id),
      ...this.eosTokenIds,
    ]);
    this.addBosToken = config.addBosToken && this.bosTokenId !== null;
    // Byte-level BPE covers every byte of the text exactly once (special tokens as written), and
    // a byte decodes to at most one UTF-16 code unit: a token's bytes bound its text.
    let maxTokenBytes = 0;
    for (const bytes of bytesById) maxTokenBytes = Math.max(maxTokenBytes, bytes?.length ?? 0);
    this.maxTokenChars = maxTokenBytes;
  }

  encode(text: string, options: { addSpecialTokens: boolean }): number[] {
    const ids = Array.from(this.encoding.encode(text, 'all'));
    if (options.addSpecialTokens && this.addBosToken) ids.unshift(this.bosTokenId as number);
    return ids;
  }

  decode(tokenIds: readonly number[], options: { skipSpecialTokens: boolean }): string {
    let numBytes = 0;
    for (const id of tokenIds) numBytes += this.bytesOf(id, options.skipSpecialTokens)?.length ?? 0;
    if (numBytes > this.scratch.length) this.scratch = new Uint8Array(Math.max(numBytes, this.scratch.length * 2));
    let offset = 0;
    for (const id of tokenIds) {
      const bytes = this.bytesOf(id, options.skipSpecialTokens);
      if (bytes === undefined) continue;
      this.scratch.set(bytes, offset);
      offset += bytes.length;
    }
    return this.utf8.decode(this.scratch.subarray(0, offset));
  }

  tokenBytes(tokenId: number): Uint8Array {
    return this.bytesById[tokenId] ?? NO_BYTES;
  }

  private bytesOf(id: number, skipSpecialTokens: boolean): Uint8Array | undefined {
    if (skipSpecialTokens && this.specialTokenIds.has(id)) return undefined;
    return this.bytesById[id];
  }
}

/** Added tokens encode atomically, like Hugging Face's added tokens; the bundled ones stay. */
function specialTokensOf(config: TokenizerConfig, bundled: Record<string, number>): Map<string, number> {
  const idsByContent = new Map(Object.entries(bundled));
  for (const token of config.addedTokens) idsByContent.set(token.content, token.id);
  return idsByContent;
}

function addSpecialBytes(bytesById: (Uint8Array | undefined)[], specialIdsByContent: Map<string, number>) {
  const utf8 = new TextEncoder();
  for (const [content, id] of specialIdsByContent) bytesById[id] = utf8.encode(content);
}

export function isBundledEncoding(name: string): name is TiktokenEncoding {
  return (BUNDLED_ENCODINGS as readonly string[]).includes(name);
}

export function loadBundledTiktoken(encodingName: TiktokenEncoding, config: TokenizerConfig): Tokenizer {
  const bundledSpecials = (bundledRegistry()[encodingName] as { special_tokens: Record<string, number> }).special_tokens;
  const specialIdsByContent = specialTokensOf(config, bundledSpecials);
  const encoding = get_encoding(encodingName, Object.fromEntries(specialIdsByContent));
  const bytesById: (Uint8Array | undefined)[] = [];
  // Ordinary ranks run contiguously from 0 in every bundled encoding; the first id that does
  // not decode ends them.
  for (let id = 0; ; id++) {
    try {
      bytesById[id] = encoding.decode_single_token_bytes(id);
    } catch {
      break;
    }
  }
  addSpecialBytes(bytesById, specialIdsByContent);
  return new TiktokenTokenizer(encoding, bytesById, specialIdsByContent, bundledSpecials, config);
}

function bundledRegistry(): Record<string, unknown> {
  return createRequire(import.meta.url)('tiktoken/registry.json');
}

/** Parses a Llama 3 style ranks file; each line is a base64 token and its rank. */
export function loadTiktokenRanksFile(file: string, config: TokenizerConfig): Tokenizer {
  const text = readFileSync(file, 'latin1');
  const bytesById: (Uint8Array | undefined)[] = [];
  const seenByteValues = new Uint8Array(NUM_BYTE_VALUES);
  let numSingleBytes = 0;
  const lines = text.split('\n');
  for (const [lineIndex, line] of lines.entries()) {
    if (line === '') continue;
    const match = /^([A-Za-z0-9+/=]+) (\d+)$/.exec(line);
    if (match === null) {
      throw new Error(
        `${file}:${lineIndex + 1}: not a tiktoken ranks line ("<base64 token> <rank>"); ` +
          'a SentencePiece tokenizer.model needs a tokenizer.json next to it',
      );
    }
    const bytes = Buffer.from(match[1], 'base64');
    const rank = Number(match[2]);
    bytesById[rank] = new Uint8Array(bytes);
    if (bytes.length === 1 && seenByteValues[bytes[0]] === 0) {
      seenByteValues[bytes[0]] = 1;
      numSingleBytes++;
    }
  }
  // tiktoken's BPE starts from single bytes; a missing one would trap inside WASM on encode.
  if (numSingleBytes !== NUM_BYTE_VALUES) {
    throw new Error(`${file}: has ${numSingleBytes} of the ${NUM_BYTE_VALUES} single-byte tokens a byte-level BPE needs`);
  }
  const specialIdsByContent = specialTokensOf(config, {});
  const encoding = new Tiktoken(
    lines.filter((line) => line !== '').join('\n'),
    Object.fromEntries(specialIdsByContent),
    LLAMA3_SPLIT_PATTERN,
  );
  addSpecialBytes(bytesById, specialIdsByContent);
  return new TiktokenTokenizer(encoding, bytesById, specialIdsByContent, {}, config);
}
