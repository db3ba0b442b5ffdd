import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, test } from 'node:test';
import { loadChatTemplate } from './chat-template.ts';
import { createDetokenizer } from './incremental-detokenizer.ts';
import { loadTokenizer } from './load.ts';
import type { Tokenizer } from './tokenizer.ts';

const tmpRoot = mkdtempSync(path.join(os.tmpdir(), 'conduit-tokenizer-'));
after(() => rmSync(tmpRoot, { recursive: true, force: true }));

function modelDir(name: string, files: Record<string, string | Buffer>): string {
  const dir = path.join(tmpRoot, name);
  mkdirSync(dir);
  for (const [file, content] of Object.entries(files)) writeFileSync(path.join(dir, file), content);
  return dir;
}

/** The deltas a client would see, one token per step. */
function streamOneByOne(tokenizer: Tokenizer, tokenIds: readonly number[]): string[] {
  const detokenizer = createDetokenizer(tokenizer);
  const deltas = tokenIds.map((id) => detokenizer.push([id]));
  deltas.push(detokenizer.flush());
  return deltas;
}

test('a bundled tiktoken encoding named in tokenizer_config.json (gpt2)', () => {
  const dir = modelDir('gpt2', {
    'tokenizer_config.json': JSON.stringify({
      tiktoken_encoding: 'gpt2',
      eos_token: '<|endoftext|>',
      added_tokens_decoder: { '50256': { content: '<|endoftext|>', special: true } },
      chat_template: '{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}',
    }),
  });
  const { tokenizer, config } = loadTokenizer(dir);
  assert.equal(tokenizer.vocabSize, 50257);
  assert.deepEqual(tokenizer.eosTokenIds, [50256]);
  assert.ok(tokenizer.specialTokenIds.has(50256));
  const tokenIds = tokenizer.encode('Hello 👋 world<|endoftext|>', { addSpecialTokens: true });
  assert.deepEqual(tokenIds, [15496, 50169, 233, 995, 50256]);
  assert.equal(tokenizer.decode(tokenIds, { skipSpecialTokens: true }), 'Hello 👋 world');
  assert.equal(tokenizer.decode(tokenIds, { skipSpecialTokens: false }), 'Hello 👋 world<|endoftext|>');
  // 👋 is two gpt2 tokens; the first alone must not reach the client as U+FFFD.
  assert.deepEqual(streamOneByOne(tokenizer, tokenIds), ['Hello', ' ', '👋', ' world', '', '']);
  assert.equal(tokenizer.decode([999_999], { skipSpecialTokens: false }), '');
  assert.deepEqual([...tokenizer.tokenBytes(50169)], [0x20, 0xf0, 0x9f, 0x91]);
  assert.deepEqual(Buffer.from(tokenizer.tokenBytes(50256)).toString(), '<|endoftext|>');
  assert.equal(tokenizer.tokenBytes(999_999).length, 0);
  const template = loadChatTemplate(config);
  assert.equal(template?.render([{ role: 'user', content: 'hi' }], { addGenerationPrompt: true }), 'user: hi\nassistant:');
});

test('a Llama 3 style tokenizer.model ranks file with special tokens from tokenizer_config.json', () => {
  const tokens = Array.from({ length: 256 }, (_, byte) => Buffer.from([byte]));
  tokens.push(Buffer.from('ab'), Buffer.from('abc'));
  const ranks = tokens.map((bytes, rank) => `${bytes.toString('base64')} ${rank}`).join('\n') + '\n';
  const dir = modelDir('ranks', {
    'tokenizer.model': ranks,
    'tokenizer_config.json': JSON.stringify({
      bos_token: '<|begin_of_text|>',
      eos_token: '<|eot_id|>',
      add_bos_token: true,
      added_tokens_decoder: {
        '258': { content: '<|begin_of_text|>', special: true },
        '259': { content: '<|eot_id|>', special: true },
      },
    }),
  });
  const { tokenizer } = loadTokenizer(dir);
  assert.equal(tokenizer.vocabSize, 260);
  assert.equal(tokenizer.bosTokenId, 258);
  assert.deepEqual(tokenizer.eosTokenIds, [259]);
  assert.deepEqual(tokenizer.encode('abc ab', { addSpecialTokens: true }), [258, 257, 32, 256]);
  assert.deepEqual(tokenizer.encode('ab<|eot_id|>', { addSpecialTokens: false }), [256, 259]);
  assert.equal(Buffer.from(tokenizer.tokenBytes(257)).toString(), 'abc');
  assert.equal(tokenizer.decode([258, 257, 32, 256, 259], { skipSpecialTokens: true }), 'abc ab');
  const waveIds = tokenizer.encode('👋', { addSpecialTokens: false });
  assert.deepEqual(waveIds, [0xf0, 0x9f, 0x91, 0x8b]);
  assert.deepEqual(streamOneByOne(tokenizer, waveIds), ['', '', '', '👋', '']);
});

test('a ranks file without every single byte is refused before tiktoken can trap on it', () => {
  const dir = modelDir('ranks-missing-bytes', { 'tokenizer.model': 'YQ== 0\nYg== 1\n' });
  assert.throws(() => loadTokenizer(dir), /2 of the 256 single-byte tokens/);
});

test('a SentencePiece tokenizer.model without tokenizer.json gets a clear error', () => {
  const dir = modelDir('sentencepiece', { 'tokenizer.model': Buffer.from([0x0a, 0x0b, 0x0a, 0x05, 0x3c, 0x75, 0x6e, 0x6b]) });
  assert.throws(() => loadTokenizer(dir), /SentencePiece tokenizer.model needs a tokenizer.json/);
});

test('a directory with no tokenizer at all says what it looked for', () => {
  const dir = modelDir('empty', {});
  assert.throws(() => loadTokenizer(dir), /no tokenizer found/);
});

/** GPT-2's byte-to-printable-character map, which byte-level BPE vocabularies are written in. */
function byteToUnicode(): string[] {
  const printable: number[] = [];
  for (const [from, to] of [[0x21, 0x7e], [0xa1, 0xac], [0xae, 0xff]]) for (let b = from; b <= to; b++) printable.push(b);
  const chars: string[] = [];
  let numShifted = 0;
  for (let byte = 0; byte < 256; byte++) {
    chars[byte] = String.fromCodePoint(printable.includes(byte) ? byte : 256 + numShifted++);
  }
  return chars;
}

test('a byte-level BPE tokenizer.json through @huggingface/tokenizers', () => {
  const chars = byteToUnicode();
  const vocab: Record<string, number> = {};
  chars.forEach((char, byte) => (vocab[char] = byte));
  vocab['hi'] = 256;
  vocab[`${chars[0x20]}w`] = 257;
  const byteLevel = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true };
  const tokenizerJson = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: [
      { id: 258, content: '<|eot|>', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
    ],
    normalizer: null,
    pre_tokenizer: byteLevel,
    post_processor: null,
    decoder: byteLevel,
    model: { type: 'BPE', dropout: null, unk_token: null, fuse_unk: false, byte_fallback: false, vocab, merges: ['h i', `${chars[0x20]} w`] },
  };
  const dir = modelDir('hf-bpe', {
    'tokenizer.json': JSON.stringify(tokenizerJson),
    'tokenizer_config.json': JSON.stringify({
      eos_token: '<|eot|>',
      chat_template: [
        { name: 'tool_use', template: 'tools' },
        { name: 'default', template: '{{ messages[0].content }}{{ eos_token }}' },
      ],
    }),
  });
  const { tokenizer, config } = loadTokenizer(dir);
  assert.equal(tokenizer.vocabSize, 259);
  assert.deepEqual(tokenizer.eosTokenIds, [258]);
  const tokenIds = tokenizer.encode('hi wow<|eot|>', { addSpecialTokens: true });
  assert.deepEqual(tokenIds, [256, 257, 0x6f, 0x77, 258]);
  assert.equal(tokenizer.decode(tokenIds, { skipSpecialTokens: true }), 'hi wow');
  assert.equal(tokenizer.decode(tokenIds, { skipSpecialTokens: false }), 'hi wow<|eot|>');
  const waveIds = tokenizer.encode('👋!', { addSpecialTokens: false });
  assert.deepEqual(waveIds, [0xf0, 0x9f, 0x91, 0x8b, 0x21]);
  assert.deepEqual(streamOneByOne(tokenizer, waveIds), ['', '', '', '👋', '!', '']);
  assert.deepEqual([...tokenizer.tokenBytes(257)], [0x20, 0x77]);
  assert.deepEqual([...tokenizer.tokenBytes(0xf0)], [0xf0]);
  assert.equal(Buffer.from(tokenizer.tokenBytes(258)).toString(), '<|eot|>');
  assert.equal(loadChatTemplate(config)?.render([{ role: 'user', content: 'x' }], { addGenerationPrompt: false }), 'x<|eot|>');
});

test("a bundled encoding's own special tokens are special even when tokenizer_config.json lists none", () => {
  const dir = modelDir('gpt2-bare', { 'tokenizer_config.json': JSON.stringify({ tiktoken_encoding: 'gpt2' }) });
  const { tokenizer, config } = loadTokenizer(dir);
  assert.ok(tokenizer.specialTokenIds.has(50256));
  assert.deepEqual(tokenizer.encode('a<|endoftext|>', { addSpecialTokens: true }), [64, 50256]);
  assert.equal(tokenizer.decode([64, 50256], { skipSpecialTokens: true }), 'a');
  assert.equal(loadChatTemplate(config), null);
});
