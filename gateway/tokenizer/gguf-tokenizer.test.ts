// A GGUF file's embedded tokenizer: the byte-level BPE of conduit-tiny, written into a GGUF by
// tools/llama-gguf.ts, tokenizes and decodes as its tokenizer.json does, with the same special
// tokens and chat template; a SentencePiece vocabulary (tokenizer.ggml.model "llama") merges by
// score and falls back to bytes.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { GgufMetadata, readGgufHeader } from '../../gguf.ts';
import { writeGguf } from '../../tools/gguf-writer.ts';
import { writeLlamaGguf } from '../../tools/llama-gguf.ts';
import { loadGgufTokenizer } from './gguf-tokenizer.ts';
import { ModelRegistry } from '../served-model.ts';
import { loadTokenizer } from './load.ts';

const tinyDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../models/conduit-tiny');
const TEXTS = [
  'Hello, world!',
  'The quick brown fox jumps over the lazy dog.  Twice\n\nnewlines\ttabs',
  'ünïcödé — 日本語のテキスト 🚀🚀 and emoji',
  "it's 1234567 o'clock<|endoftext|>after",
  '   leading spaces and trailing   ',
];

function tempDir(t: { after(fn: () => void): void }): string {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-gguf-tokenizer-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

test('a byte-level BPE tokenizer in a GGUF encodes and decodes as its tokenizer.json', (t) => {
  const file = path.join(tempDir(t), 'tiny.gguf');
  writeLlamaGguf(tinyDir, file, { matrixType: 'Q8_0' });
  const fromGguf = loadTokenizer(file);
  const fromJson = loadTokenizer(tinyDir);
  for (const text of TEXTS) {
    for (const addSpecialTokens of [false, true]) {
      const ids = fromGguf.tokenizer.encode(text, { addSpecialTokens });
      assert.deepEqual(ids, fromJson.tokenizer.encode(text, { addSpecialTokens }), JSON.stringify(text));
      assert.equal(fromGguf.tokenizer.decode(ids, { skipSpecialTokens: false }), text);
      assert.equal(fromGguf.tokenizer.decode(ids, { skipSpecialTokens: true }), fromJson.tokenizer.decode(ids, { skipSpecialTokens: true }));
    }
  }
  assert.equal(fromGguf.tokenizer.vocabSize, fromJson.tokenizer.vocabSize);
  assert.equal(fromGguf.tokenizer.bosTokenId, fromJson.tokenizer.bosTokenId);
  assert.deepEqual(fromGguf.tokenizer.eosTokenIds, fromJson.tokenizer.eosTokenIds);
  assert.deepEqual([...fromGguf.tokenizer.specialTokenIds], [...fromJson.tokenizer.specialTokenIds]);
  assert.equal(fromGguf.config.chatTemplate, fromJson.config.chatTemplate);
  for (const id of [0, 300, 4095]) assert.deepEqual(fromGguf.tokenizer.tokenBytes(id), fromJson.tokenizer.tokenBytes(id));
});

test('a SentencePiece vocabulary merges by score, falls back to bytes, and adds BOS when asked', (t) => {
  const file = path.join(tempDir(t), 'spm.gguf');
  const bytes = Array.from({ length: 256 }, (_, b) => `<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`);
  const pieces = ['▁', 'h', 'e', 'l', 'o', '▁h', 'll', '▁he', 'llo', '▁hello'];
  const tokens = ['<unk>', '<s>', '</s>', ...bytes, ...pieces];
  const types = [2, 3, 3, ...bytes.map(() => 6), ...pieces.map(() => 1)];
  // Longer pieces score higher, so "▁hello" is reached by merges in this order.
  const scores = [0, 0, 0, ...bytes.map(() => 0), ...pieces.map((_, i) => -100 + i)];
  writeGguf(file, [
    ['general.architecture', { type: 'string', value: 'llama' }],
    ['tokenizer.ggml.model', { type: 'string', value: 'llama' }],
    ['tokenizer.ggml.tokens', { type: 'string[]', value: tokens }],
    ['tokenizer.ggml.token_type', { type: 'int32[]', value: types }],
    ['tokenizer.ggml.scores', { type: 'float32[]', value: scores }],
    ['tokenizer.ggml.bos_token_id', { type: 'uint32', value: 1 }],
    ['tokenizer.ggml.eos_token_id', { type: 'uint32', value: 2 }],
    ['tokenizer.ggml.unknown_token_id', { type: 'uint32', value: 0 }],
    ['tokenizer.chat_template', { type: 'string', value: '{{ messages[0].content }}' }],
  ], []);
  const { tokenizer, config } = loadGgufTokenizer(new GgufMetadata(readGgufHeader(file)));
  const id = (piece: string) => tokens.indexOf(piece);
  assert.deepEqual(tokenizer.encode('hello', { addSpecialTokens: false }), [id('▁hello')]);
  assert.deepEqual(tokenizer.encode('hello hi', { addSpecialTokens: true }), [1, id('▁hello'), id('▁h'), id('<0x69>')]);
  assert.equal(tokenizer.decode([1, id('▁hello'), id('▁h'), id('<0x69>')], { skipSpecialTokens: true }), 'hello hi');
  assert.deepEqual(tokenizer.eosTokenIds, [2]);
  assert.equal(config.chatTemplate, '{{ messages[0].content }}');
  assert.deepEqual(tokenizer.tokenBytes(id('<0x69>')), Uint8Array.of(0x69));
});

test('the gateway serves a .gguf path: its tokenizer and chat template come from the file', (t) => {
  const file = path.join(tempDir(t), 'tiny.gguf');
  writeLlamaGguf(tinyDir, file);
  const [model] = new ModelRegistry([{ name: 'tiny', modelDir: file, maxModelLen: 2048, workers: [] }]).models;
  assert.deepEqual(model.tokenizer.encode('Hello', { addSpecialTokens: false }), loadTokenizer(tinyDir).tokenizer.encode('Hello', { addSpecialTokens: false }));
  assert.notEqual(model.chatTemplate, null);
  assert.equal(model.defaultMaxTokens, null);
  assert.throws(() => new ModelRegistry([{ name: 'x', modelDir: path.join(tinyDir, 'config.json'), maxModelLen: 1, workers: [] }]), /is not a directory/);
});
