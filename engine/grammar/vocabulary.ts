// The vocabulary a grammar works over, read from the checkpoint the worker serves: every logit
// id's token as xgrammar takes it (the tokenizer's own string and how to decode it), and the
// bytes it stands for in the text (for jump-forward, which turns forced text back into tokens).
// Special tokens and padding ids (a config vocab_size above the tokenizer's) are empty strings to
// xgrammar, which then never lets a grammar emit one (stop tokens are named apart, by id).
// Sources, as the gateway's tokenizer loader takes them: tokenizer.json; a bundled tiktoken
// encoding named in tokenizer_config.json; a Llama 3 style tokenizer.model of base64 ranks.
// tiktoken's raw bytes become GPT-2's byte-level characters, which xgrammar decodes exactly.
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { get_encoding, type TiktokenEncoding } from 'tiktoken';

export type VocabType = 'byte_level' | 'byte_fallback' | 'raw';

export interface GrammarVocabulary {
  /** One entry per logit id: the token as xgrammar decodes it under vocabType; '' for special and padding ids. */
  encodedTokens: string[];
  vocabType: VocabType;
  /** The tokenizer prepends a space to the text it encodes (SentencePiece's dummy prefix). */
  prependSpace: boolean;
  /** Each id's bytes in the text; null for special and padding ids. */
  tokenBytes: (Uint8Array | null)[];
}

interface AddedToken {
  id: number;
  content: string;
  special: boolean;
}

/** GPT-2's byte-level alphabet: every byte as one printable character. */
export function byteLevelAlphabet(): string[] {
  const printable: number[] = [];
  for (let b = 33; b <= 126; b++) printable.push(b);
  for (let b = 161; b <= 172; b++) printable.push(b);
  for (let b = 174; b <= 255; b++) printable.push(b);
  let shifted = 0;
  return Array.from({ length: 256 }, (_, b) => String.fromCodePoint(printable.includes(b) ? b : 256 + shifted++));
}

const BYTE_LEVEL = (() => {
  const charOfByte = byteLevelAlphabet();
  return { charOfByte, byteOfChar: new Map(charOfByte.map((char, b) => [char, b])) };
})();
const utf8 = new TextEncoder();

function decodeToken(token: string, vocabType: VocabType): Uint8Array {
  if (vocabType === 'byte_level') return Uint8Array.from([...token], (char) => BYTE_LEVEL.byteOfChar.get(char) ?? 0);
  if (vocabType === 'byte_fallback') {
    const byte = /^<0x([0-9A-Fa-f]{2})>$/.exec(token);
    if (byte !== null) return Uint8Array.of(parseInt(byte[1], 16));
    return utf8.encode(token.replaceAll('\u2581', ' '));
  }
  return utf8.encode(token);
}

function vocabularyOf(tokens: (string | undefined)[], special: ReadonlySet<number>, vocabType: VocabType, prependSpace: boolean, vocabSize: number): GrammarVocabulary {
  const encodedTokens: string[] = [];
  const tokenBytes: (Uint8Array | null)[] = [];
  for (let id = 0; id < vocabSize; id++) {
    const token = tokens[id];
    const usable = token !== undefined && !special.has(id);
    encodedTokens.push(usable ? token : '');
    tokenBytes.push(usable ? decodeToken(token, vocabType) : null);
  }
  return { encodedTokens, vocabType, prependSpace, tokenBytes };
}

/** tokenizer_config.json's added tokens; special unless it says otherwise. */
function configAddedTokens(config: Record<string, unknown>): AddedToken[] {
  const decoder = config.added_tokens_decoder;
  if (typeof decoder !== 'object' || decoder === null) return [];
  return Object.entries(decoder as Record<string, { content?: unknown; special?: unknown }>)
    .filter(([, entry]) => typeof entry?.content === 'string')
    .map(([id, entry]) => ({ id: Number(id), content: entry.content as string, special: entry.special !== false }));
}

function decoderNames(decoder: unknown): string[] {
  if (typeof decoder !== 'object' || decoder === null) return [];
  const { type, decoders } = decoder as { type?: unknown; decoders?: unknown };
  return [...(typeof type === 'string' ? [type] : []), ...(Array.isArray(decoders) ? decoders.flatMap(decoderNames) : [])];
}

function fromTokenizerJson(file: string, vocabSize: number): GrammarVocabulary {
  const json = JSON.parse(readFileSync(file, 'utf8')) as {
    model?: { type?: string; vocab?: unknown };
    added_tokens?: AddedToken[];
    decoder?: unknown;
    normalizer?: unknown;
    pre_tokenizer?: unknown;
  };
  const tokens: (string | undefined)[] = [];
  const vocab = json.model?.vocab;
  if (Array.isArray(vocab)) {
    // Unigram: [piece, score] in id order.
    vocab.forEach((entry, id) => (tokens[id] = Array.isArray(entry) ? String(entry[0]) : String(entry)));
  } else if (typeof vocab === 'object' && vocab !== null) {
    for (const [token, id] of Object.entries(vocab as Record<string, number>)) tokens[id] = token;
  } else {
    throw new Error(`${file}: model.vocab is missing`);
  }
  const special = new Set<number>();
  for (const added of json.added_tokens ?? []) {
    tokens[added.id] = added.content;
    if (added.special) special.add(added.id);
  }
  const decoders = decoderNames(json.decoder);
  const vocabType: VocabType = decoders.includes('ByteLevel') ? 'byte_level' : decoders.includes('ByteFallback') ? 'byte_fallback' : 'raw';
  const text = JSON.stringify([json.normalizer ?? null, json.pre_tokenizer ?? null]);
  const prependSpace = /"prepend":"\u2581"/.test(text) || /"prepend_scheme":"(first|always)"/.test(text) || /"add_prefix_space":true/.test(text) && vocabType !== 'byte_level';
  return vocabularyOf(tokens, special, vocabType, prependSpace, vocabSize);
}

/** Raw-byte tokens (tiktoken) as byte-level strings. */
function fromBytes(bytesById: (Uint8Array | undefined)[], added: AddedToken[], vocabSize: number): GrammarVocabulary {
  const tokens = bytesById.map((bytes) => (bytes === undefined ? undefined : Array.from(bytes, (b) => BYTE_LEVEL.charOfByte[b]).join('')));
  const special = new Set<number>();
  for (const token of added) {
    tokens[token.id] = token.content;
    if (token.special) special.add(token.id);
  }
  return vocabularyOf(tokens, special, 'byte_level', false, vocabSize);
}

function fromBundledTiktoken(name: string, added: AddedToken[], vocabSize: number): GrammarVocabulary {
  const encoding = get_encoding(name as TiktokenEncoding);
  const bytesById: Uint8Array[] = [];
  try {
    // Ordinary ranks run contiguously from 0; the first id that does not decode ends them.
    for (let id = 0; id < vocabSize; id++) bytesById[id] = encoding.decode_single_token_bytes(id);
  } catch {
    // past the ordinary ranks
  } finally {
    encoding.free();
  }
  return fromBytes(bytesById, added, vocabSize);
}

function fromRanksFile(file: string, added: AddedToken[], vocabSize: number): GrammarVocabulary {
  const bytesById: Uint8Array[] = [];
  for (const line of readFileSync(file, 'latin1').split('\n')) {
    const match = /^([A-Za-z0-9+/=]+) (\d+)$/.exec(line);
    if (match !== null) bytesById[Number(match[2])] = new Uint8Array(Buffer.from(match[1], 'base64'));
  }
  return fromBytes(bytesById, added, vocabSize);
}

/** The grammar vocabulary of a checkpoint, vocabSize (the model's logits) entries long. */
export function loadGrammarVocabulary(modelDir: string, vocabSize: number): GrammarVocabulary {
  const tokenizerJson = path.join(modelDir, 'tokenizer.json');
  if (existsSync(tokenizerJson)) return fromTokenizerJson(tokenizerJson, vocabSize);
  const configFile = path.join(modelDir, 'tokenizer_config.json');
  const config = existsSync(configFile) ? (JSON.parse(readFileSync(configFile, 'utf8')) as Record<string, unknown>) : {};
  const added = configAddedTokens(config);
  if (typeof config.tiktoken_encoding === 'string') return fromBundledTiktoken(config.tiktoken_encoding, added, vocabSize);
  const ranksFile = path.join(modelDir, 'tokenizer.model');
  if (existsSync(ranksFile)) return fromRanksFile(ranksFile, added, vocabSize);
  throw new Error(`${modelDir}: no tokenizer for structured outputs (expected tokenizer.json, a tiktoken_encoding in tokenizer_config.json, or a tokenizer.model ranks file)`);
}
