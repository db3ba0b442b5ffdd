// The tokenizer side of a random checkpoint, per family: tokenizer.json (a byte-level BPE whose
// tokens are the 256 bytes, after the family's special tokens), tokenizer_config.json with the
// family's published chat template (tools/chat-templates/) and special tokens, and the
// generation_config.json fields the family ships (its end-of-turn tokens among eos_token_id, its
// sampling defaults). A served random checkpoint then renders, tokenizes and stops exactly as the
// real model's files make a server do.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { ArchName } from './make-checkpoint.ts';
import { PyFloat } from './python-json.ts';

interface FamilyTokens {
  /** Ids 0, 1, ... in this order; `special: false` are added tokens that are not special (Qwen's <think>). */
  tokens: ReadonlyArray<{ content: string; special: boolean }>;
  bosToken: string | null;
  eosToken: string;
  padToken: string | null;
  addBosToken: boolean;
  templateFile: string;
  /** config.json's bos and eos, and generation_config.json's eos list (end of turn first). */
  configBos: string;
  configEos: string;
  generationEos: readonly string[];
  generationDefaults: Record<string, number | PyFloat | boolean>;
}

const special = (content: string) => ({ content, special: true });

const QWEN3: FamilyTokens = {
  tokens: [
    special('<|endoftext|>'),
    special('<|im_start|>'),
    special('<|im_end|>'),
    { content: '<tool_call>', special: false },
    { content: '</tool_call>', special: false },
    { content: '<tool_response>', special: false },
    { content: '</tool_response>', special: false },
    { content: '<think>', special: false },
    { content: '</think>', special: false },
  ],
  bosToken: null,
  eosToken: '<|im_end|>',
  padToken: '<|endoftext|>',
  addBosToken: false,
  templateFile: 'qwen3.jinja',
  configBos: '<|endoftext|>',
  configEos: '<|im_end|>',
  generationEos: ['<|im_end|>', '<|endoftext|>'],
  generationDefaults: { do_sample: true, temperature: new PyFloat(0.6), top_k: 20, top_p: new PyFloat(0.95) },
};

export const FAMILY_TOKENS: Partial<Readonly<Record<ArchName, FamilyTokens>>> = {
  qwen3: QWEN3,
  qwen3_moe: QWEN3,
  gemma3: {
    tokens: [special('<pad>'), special('<eos>'), special('<bos>'), special('<unk>'), special('<start_of_turn>'), special('<end_of_turn>')],
    bosToken: '<bos>',
    eosToken: '<eos>',
    padToken: '<pad>',
    addBosToken: true,
    templateFile: 'gemma3.jinja',
    configBos: '<bos>',
    configEos: '<eos>',
    generationEos: ['<eos>', '<end_of_turn>'],
    generationDefaults: { do_sample: true, top_k: 64, top_p: new PyFloat(0.95) },
  },
  phi3: {
    tokens: [special('<|endoftext|>'), special('<|system|>'), special('<|user|>'), special('<|assistant|>'), special('<|end|>'), special('<|tool|>'), special('<|/tool|>')],
    bosToken: '<|endoftext|>',
    eosToken: '<|endoftext|>',
    padToken: '<|endoftext|>',
    addBosToken: false,
    templateFile: 'phi4-mini.jinja',
    configBos: '<|endoftext|>',
    configEos: '<|endoftext|>',
    generationEos: ['<|end|>', '<|endoftext|>'],
    generationDefaults: {},
  },
  mixtral: {
    tokens: [special('<unk>'), special('<s>'), special('</s>')],
    bosToken: '<s>',
    eosToken: '</s>',
    padToken: null,
    addBosToken: true,
    templateFile: 'mixtral.jinja',
    configBos: '<s>',
    configEos: '</s>',
    generationEos: ['</s>'],
    generationDefaults: {},
  },
  gpt_oss: {
    tokens: [
      special('<|startoftext|>'),
      special('<|endoftext|>'),
      special('<|return|>'),
      special('<|constrain|>'),
      special('<|channel|>'),
      special('<|start|>'),
      special('<|end|>'),
      special('<|message|>'),
      special('<|call|>'),
    ],
    bosToken: '<|startoftext|>',
    eosToken: '<|return|>',
    padToken: '<|endoftext|>',
    addBosToken: false,
    templateFile: 'gpt-oss.jinja',
    configBos: '<|startoftext|>',
    configEos: '<|return|>',
    generationEos: ['<|return|>', '<|endoftext|>', '<|call|>'],
    generationDefaults: { do_sample: true },
  },
};

const TEMPLATES_DIR = path.join(path.dirname(fileURLToPath(import.meta.url)), 'chat-templates');

/** A family's published chat template, as its tokenizer_config.json carries it (no trailing newline). */
export function chatTemplateOf(file: string): string {
  return readFileSync(path.join(TEMPLATES_DIR, file), 'utf8').replace(/\n$/, '');
}

/** Whether the family's tokens and the 256 bytes fit the vocabulary (tiny numerics models do without). */
export function tokenizerFits(arch: ArchName, vocabSize: number): FamilyTokens | null {
  const family = FAMILY_TOKENS[arch];
  return family !== undefined && family.tokens.length + 256 <= vocabSize ? family : null;
}

export function tokenIdOf(family: FamilyTokens, content: string): number {
  const id = family.tokens.findIndex((token) => token.content === content);
  if (id === -1) throw new Error(`${content} is not one of the family's tokens`);
  return id;
}

/** GPT-2's printable stand-ins for bytes, in which byte-level vocabularies are written. */
function byteCharacters(): string[] {
  const printable = new Set<number>();
  for (const [from, to] of [[0x21, 0x7e], [0xa1, 0xac], [0xae, 0xff]]) for (let b = from; b <= to; b++) printable.add(b);
  let shifted = 0;
  return Array.from({ length: 256 }, (_, byte) => String.fromCodePoint(printable.has(byte) ? byte : 256 + shifted++));
}

export function tokenizerJson(family: FamilyTokens): Record<string, unknown> {
  const vocab: Record<string, number> = {};
  byteCharacters().forEach((char, byte) => (vocab[char] = family.tokens.length + byte));
  const byteLevel = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true };
  return {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: family.tokens.map((token, id) => ({
      id,
      content: token.content,
      single_word: false,
      lstrip: false,
      rstrip: false,
      normalized: false,
      special: token.special,
    })),
    normalizer: null,
    pre_tokenizer: byteLevel,
    post_processor: { ...byteLevel, trim_offsets: false },
    decoder: byteLevel,
    model: {
      type: 'BPE',
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: false,
      vocab,
      merges: [],
    },
  };
}

export function tokenizerConfigJson(family: FamilyTokens, maxPositionEmbeddings: number): Record<string, unknown> {
  const decoder: Record<string, unknown> = {};
  family.tokens.forEach((token, id) => {
    decoder[String(id)] = { content: token.content, lstrip: false, normalized: false, rstrip: false, single_word: false, special: token.special };
  });
  return {
    add_bos_token: family.addBosToken,
    add_eos_token: false,
    added_tokens_decoder: decoder,
    bos_token: family.bosToken,
    chat_template: chatTemplateOf(family.templateFile),
    clean_up_tokenization_spaces: false,
    eos_token: family.eosToken,
    model_max_length: maxPositionEmbeddings,
    pad_token: family.padToken,
    tokenizer_class: 'PreTrainedTokenizerFast',
    unk_token: null,
  };
}
