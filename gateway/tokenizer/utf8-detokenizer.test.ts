import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { createDetokenizer, IncrementalDetokenizer, type Detokenizer } from './incremental-detokenizer.ts';
import { createRng } from '../../loadtest/random.ts';
import { testSeed } from '../../test/seed.ts';
import { loadTokenizer } from './load.ts';
import type { Tokenizer } from './tokenizer.ts';
import { Utf8Detokenizer } from './utf8-detokenizer.ts';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
// Drawn at load: the seed is in the tests' names, so a failure names it.
const seed = testSeed();

function stream(detokenizer: Detokenizer, tokenIds: readonly number[], pushSizes: () => number): string[] {
  const deltas: string[] = [];
  for (let i = 0; i < tokenIds.length; ) {
    const size = pushSizes();
    deltas.push(detokenizer.push(tokenIds.slice(i, i + size)));
    i += size;
  }
  deltas.push(detokenizer.flush());
  return deltas;
}

const tmpRoot = mkdtempSync(path.join(os.tmpdir(), 'conduit-detokenizer-'));
after(() => rmSync(tmpRoot, { recursive: true, force: true }));

function tokenizerOf(name: string, files: Record<string, object>): Tokenizer {
  const dir = path.join(tmpRoot, name);
  mkdirSync(dir);
  for (const [file, json] of Object.entries(files)) writeFileSync(path.join(dir, file), JSON.stringify(json));
  return loadTokenizer(dir).tokenizer;
}

const gpt2Tokenizer = tokenizerOf('gpt2', {
  'tokenizer_config.json': { tiktoken_encoding: 'gpt2', eos_token: '<|endoftext|>' },
});

/** Llama 2's layout: SentencePiece pieces with byte fallback, a decoder that rewrites after the byte mapping. */
const sentencePieceTokenizer = tokenizerOf('sentencepiece', {
  'tokenizer.json': {
    version: '1.0',
    added_tokens: [{ id: 0, content: '<s>', special: true, single_word: false, lstrip: false, rstrip: false, normalized: false }],
    normalizer: { type: 'Sequence', normalizers: [{ type: 'Prepend', prepend: '\u2581' }, { type: 'Replace', pattern: { String: ' ' }, content: '\u2581' }] },
    pre_tokenizer: null,
    post_processor: null,
    decoder: {
      type: 'Sequence',
      decoders: [
        { type: 'Replace', pattern: { String: '\u2581' }, content: ' ' },
        { type: 'ByteFallback' },
        { type: 'Fuse' },
        { type: 'Strip', content: ' ', start: 1, stop: 0 },
      ],
    },
    model: {
      type: 'BPE',
      byte_fallback: true,
      fuse_unk: true,
      unk_token: null,
      vocab: Object.fromEntries([
        '<s>',
        ...Array.from({ length: 256 }, (_, byte) => `<0x${byte.toString(16).toUpperCase().padStart(2, '0')}>`),
        '\u2581', 'a', 'b', '\u2581a', '\u2581b', 'ab',
      ].map((piece, id) => [piece, id])),
      merges: ['\u2581 a', '\u2581 b', 'a b'],
    },
  },
  'tokenizer_config.json': { bos_token: '<s>', add_bos_token: true },
});

const tinyTokenizer = loadTokenizer(path.join(repoRoot, 'models', 'conduit-tiny')).tokenizer;

const tokenizers: [string, Tokenizer][] = [
  ['conduit-tiny (tokenizer.json, ByteLevel)', tinyTokenizer],
  ['gpt2 (tiktoken)', gpt2Tokenizer],
];

for (const [name, tokenizer] of tokenizers) {
  test(`${name}: streams by table lookup and equals decoding every token at once (seed ${seed})`, () => {
    assert.ok(tokenizer.decodesAsUtf8Bytes);
    assert.ok(createDetokenizer(tokenizer) instanceof Utf8Detokenizer);
    const random = createRng(seed);
    for (let sequence = 0; sequence < 200; sequence++) {
      // Any ids at all, specials and ids past the vocabulary included: invalid UTF-8 and split characters abound.
      const tokenIds = Array.from({ length: 1 + Math.floor(random() * 40) }, () => Math.floor(random() * (tokenizer.vocabSize + 8)));
      const whole = tokenizer.decode(tokenIds, { skipSpecialTokens: true });
      const deltas = stream(createDetokenizer(tokenizer), tokenIds, () => 1 + Math.floor(random() * 3));
      assert.equal(deltas.join(''), whole, `token ids ${JSON.stringify(tokenIds)}`);
    }
  });

  test(`${name}: multi-byte characters split across tokens are never sent in part`, () => {
    const text = 'naïve café — 東京 👋🏽 done.\u{1F600}\uFEFF end';
    const textBytes = new TextEncoder().encode(text);
    // Single-byte tokens: every character of more than one byte straddles tokens.
    const byteTokenIds = [...textBytes].map((byte) => {
      const [tokenId] = [...Array(tokenizer.vocabSize).keys()].filter((id) => {
        const bytes = tokenizer.tokenBytes(id);
        return bytes.length === 1 && bytes[0] === byte;
      });
      return tokenId;
    });
    for (const tokenIds of [tokenizer.encode(text, { addSpecialTokens: false }), byteTokenIds]) {
      const deltas = stream(createDetokenizer(tokenizer), tokenIds, () => 1);
      for (const delta of deltas) assert.ok(!delta.includes('\uFFFD'), `delta ${JSON.stringify(delta)} splits a character`);
      assert.equal(deltas.join(''), text);
      const windowed = new IncrementalDetokenizer((ids) => tokenizer.decode(ids, { skipSpecialTokens: true }));
      assert.equal(stream(windowed, tokenIds, () => 1).join(''), text);
    }
  });
}

test('a SentencePiece decoder keeps the windowed detokenizer, which streams the same text', () => {
  assert.equal(sentencePieceTokenizer.decodesAsUtf8Bytes, false);
  assert.ok(createDetokenizer(sentencePieceTokenizer) instanceof IncrementalDetokenizer);
  const text = 'ab a b 東京 👋';
  const tokenIds = sentencePieceTokenizer.encode(text, { addSpecialTokens: true });
  const deltas = stream(createDetokenizer(sentencePieceTokenizer), tokenIds, () => 1);
  for (const delta of deltas) assert.ok(!delta.includes('\uFFFD'), `delta ${JSON.stringify(delta)} splits a character`);
  assert.equal(deltas.join(''), text);
});
