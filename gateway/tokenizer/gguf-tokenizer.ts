// The tokenizer a GGUF file embeds (tokenizer.ggml.*, as llama.cpp's llama-vocab.cpp reads it)
// rebuilt as the tokenizer.json Hugging Face would ship, and run by the same backend:
// `gpt2` byte-level BPE (vocabulary, merges, the pre-tokenizer tokenizer.ggml.pre names) and
// `llama` SentencePiece BPE (pieces with scores, byte fallback; merges derived from the scores,
// as transformers' GGUF loader derives them). Special tokens come from token types; BOS, EOS,
// add_bos_token and the chat template from their keys.
import type { GgufMetadata } from '../../gguf.ts';
import { huggingFaceTokenizerFromJson } from './hf-tokenizer.ts';
import type { Tokenizer } from './tokenizer.ts';
import type { AddedToken, TokenizerConfig } from './tokenizer-config.ts';

/** llama_token_type */
const TOKEN_TYPE = { normal: 1, unknown: 2, control: 3, userDefined: 4, unused: 5, byte: 6 } as const;

/** Pre-tokenizer regexes by tokenizer.ggml.pre (llama.cpp's llama-vocab.cpp, the models' tokenizer.json). */
const PRE_TOKENIZER_REGEXES: Readonly<Record<string, string | null>> = {
  // GPT-2's own regex, which ByteLevel applies itself.
  'gpt-2': null,
  default: null,
  'llama-bpe': "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
  qwen2: "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};
const METASPACE = '\u2581';

export interface LoadedGgufTokenizer {
  tokenizer: Tokenizer;
  config: TokenizerConfig;
}

function byteLevelPreTokenizer(meta: GgufMetadata): Record<string, unknown> {
  const pre = meta.string('tokenizer.ggml.pre', 'default');
  if (!(pre in PRE_TOKENIZER_REGEXES)) meta.fail('tokenizer.ggml.pre', `one of ${Object.keys(PRE_TOKENIZER_REGEXES).join(', ')}`);
  const regex = PRE_TOKENIZER_REGEXES[pre];
  if (regex === null) return { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true };
  return {
    type: 'Sequence',
    pretokenizers: [
      { type: 'Split', pattern: { Regex: regex }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
    ],
  };
}

/** SentencePiece BPE merges: every split of a piece into two pieces, the better-scored pieces first. */
function mergesFromScores(tokens: readonly string[], scores: readonly number[], types: readonly number[]): string[] {
  const ids = new Map<string, number>();
  tokens.forEach((token, id) => {
    if (types[id] === TOKEN_TYPE.normal) ids.set(token, id);
  });
  const merges: { left: string; right: string; score: number; id: number }[] = [];
  for (const [piece, id] of ids) {
    const chars = [...piece];
    for (let split = 1; split < chars.length; split++) {
      const left = chars.slice(0, split).join('');
      const right = chars.slice(split).join('');
      if (ids.has(left) && ids.has(right)) merges.push({ left, right, score: scores[id], id });
    }
  }
  merges.sort((a, b) => b.score - a.score || a.id - b.id || ids.get(a.left)! - ids.get(b.left)!);
  return merges.map(({ left, right }) => `${left} ${right}`);
}

export function loadGgufTokenizer(meta: GgufMetadata): LoadedGgufTokenizer {
  const model = meta.string('tokenizer.ggml.model');
  const tokens = meta.strings('tokenizer.ggml.tokens');
  if (tokens === null) meta.fail('tokenizer.ggml.tokens', 'an array of strings');
  const types = meta.numbers('tokenizer.ggml.token_type') ?? tokens.map(() => TOKEN_TYPE.normal);
  if (types.length !== tokens.length) meta.fail('tokenizer.ggml.token_type', `${tokens.length} entries, one per token`);
  const idOrNull = (key: string) => (meta.has(key) ? meta.number(key) : null);
  const bosId = idOrNull('tokenizer.ggml.bos_token_id');
  const eosId = idOrNull('tokenizer.ggml.eos_token_id');
  const unkId = idOrNull('tokenizer.ggml.unknown_token_id');
  for (const [key, id] of [['bos', bosId], ['eos', eosId], ['unknown', unkId]] as const) {
    if (id !== null && (id < 0 || id >= tokens.length)) meta.fail(`tokenizer.ggml.${key}_token_id`, `a token id below ${tokens.length}`);
  }
  const addedTokens: AddedToken[] = [];
  types.forEach((type, id) => {
    if (type === TOKEN_TYPE.control || type === TOKEN_TYPE.userDefined) addedTokens.push({ id, content: tokens[id], special: type === TOKEN_TYPE.control });
  });
  const sentencePiece = model === 'llama';
  if (!sentencePiece && model !== 'gpt2') meta.fail('tokenizer.ggml.model', 'gpt2 (byte-level BPE) or llama (SentencePiece BPE)');
  const vocab = Object.fromEntries(tokens.map((token, id) => [token, id]));
  const addBos = meta.bool('tokenizer.ggml.add_bos_token', sentencePiece) && bosId !== null;
  const json: Record<string, unknown> = {
    version: '1.0',
    added_tokens: addedTokens.map((token) => ({
      id: token.id, content: token.content, single_word: false, lstrip: false, rstrip: false, normalized: !token.special, special: token.special,
    })),
    normalizer: sentencePiece
      ? { type: 'Sequence', normalizers: [{ type: 'Prepend', prepend: METASPACE }, { type: 'Replace', pattern: { String: ' ' }, content: METASPACE }] }
      : null,
    pre_tokenizer: sentencePiece ? null : byteLevelPreTokenizer(meta),
    post_processor: addBos
      ? {
        type: 'TemplateProcessing',
        single: [{ SpecialToken: { id: tokens[bosId!], type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
        pair: [{ SpecialToken: { id: tokens[bosId!], type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }],
        special_tokens: { [tokens[bosId!]]: { id: tokens[bosId!], ids: [bosId], tokens: [tokens[bosId!]] } },
      }
      : null,
    decoder: sentencePiece
      ? {
        type: 'Sequence',
        decoders: [
          { type: 'Replace', pattern: { String: METASPACE }, content: ' ' },
          { type: 'ByteFallback' },
          { type: 'Fuse' },
          { type: 'Strip', content: ' ', start: 1, stop: 0 },
        ],
      }
      : { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: 'BPE',
      dropout: null,
      unk_token: unkId === null ? null : tokens[unkId],
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: sentencePiece,
      byte_fallback: sentencePiece,
      ignore_merges: meta.string('tokenizer.ggml.pre', 'default') === 'llama-bpe',
      vocab,
      merges: sentencePiece
        ? mergesFromScores(tokens, meta.numbers('tokenizer.ggml.scores') ?? tokens.map(() => 0), types)
        : (meta.strings('tokenizer.ggml.merges') ?? meta.fail('tokenizer.ggml.merges', 'an array of strings')),
    },
  };
  const chatTemplate = meta.has('tokenizer.chat_template') ? meta.string('tokenizer.chat_template') : null;
  const config: TokenizerConfig = {
    raw: {
      bos_token: bosId === null ? null : tokens[bosId],
      eos_token: eosId === null ? null : tokens[eosId],
      add_bos_token: addBos,
      chat_template: chatTemplate,
    },
    bosToken: bosId === null ? null : tokens[bosId],
    eosToken: eosId === null ? null : tokens[eosId],
    addBosToken: addBos,
    addedTokens,
    chatTemplate,
    tiktokenEncoding: null,
  };
  return { tokenizer: huggingFaceTokenizerFromJson(json, config), config };
}
