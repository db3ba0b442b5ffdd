// The length check before tokenizing: it must never refuse a prompt that could fit, so the bound
// of characters per token has to hold for every token and every text.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, test } from 'node:test';
import { testSeed } from '../../test/seed.ts';
import { ApiError } from '../errors.ts';
import { loadTokenizer } from './load.ts';
import { checkPromptChars, maxPromptChars, type PromptModel } from './prompt.ts';

const conduitTinyDir = new URL('../../models/conduit-tiny', import.meta.url).pathname;
const tmpDir = mkdtempSync(path.join(os.tmpdir(), 'conduit-prompt-'));
after(() => rmSync(tmpDir, { recursive: true, force: true }));

function promptModelOf(modelDir: string, maxModelLen: number): PromptModel {
  return { name: 'm', maxModelLen, tokenizer: loadTokenizer(modelDir).tokenizer, chatTemplate: null };
}

/** Tiny deterministic PRNG, so a failing seed replays. */
function rng(seed: number): () => number {
  let state = seed >>> 0 || 1;
  return () => {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    return (state >>> 0) / 2 ** 32;
  };
}

test('the characters-per-token bound holds for every token and for seeded random text (conduit-tiny, gpt2)', (t) => {
  const gpt2 = mkdtempSync(path.join(tmpDir, 'gpt2-'));
  writeFileSync(path.join(gpt2, 'tokenizer_config.json'), JSON.stringify({ tiktoken_encoding: 'gpt2', eos_token: '<|endoftext|>' }));
  const seed = testSeed(t);
  const random = rng(seed);
  const pieces = ['the', ' ', '   ', '\n\n', 'Grüße', '東京', '🎉', '----', '<|endoftext|>', 'x', '1234567', '\t', 'ﬁ', '\u0301'];
  for (const dir of [conduitTinyDir, gpt2]) {
    const { tokenizer } = loadTokenizer(dir);
    const maxTokenChars = tokenizer.maxTokenChars;
    assert.ok(maxTokenChars !== null && maxTokenChars > 0, `${dir}: no bound`);
    for (let id = 0; id < tokenizer.vocabSize; id++) {
      const text = tokenizer.decode([id], { skipSpecialTokens: false });
      assert.ok(text.length <= maxTokenChars, `${dir}: token ${id} ${JSON.stringify(text)} is longer than ${maxTokenChars}`);
    }
    for (let round = 0; round < 200; round++) {
      const text = Array.from({ length: 1 + Math.floor(random() * 200) }, () => pieces[Math.floor(random() * pieces.length)]).join('');
      const numTokens = tokenizer.encode(text, { addSpecialTokens: false }).length;
      assert.ok(numTokens * maxTokenChars >= text.length, `seed ${seed}, ${dir}: ${numTokens} tokens for ${text.length} characters`);
    }
  }
});

test('text up to the cap passes; one character more is context_length_exceeded on input_text', () => {
  const model = promptModelOf(conduitTinyDir, 100);
  const maxChars = maxPromptChars(model)!;
  assert.equal(maxChars, model.tokenizer.maxTokenChars! * 100);
  checkPromptChars(model, maxChars);
  assert.throws(
    () => checkPromptChars(model, maxChars + 1),
    (error: unknown) => error instanceof ApiError && error.code === 'context_length_exceeded' && error.param === 'input_text',
  );
});

test('a tokenizer whose normalizer may shorten text gives no bound, and no prompt is refused by length', () => {
  const json = JSON.parse(readFileSync(path.join(conduitTinyDir, 'tokenizer.json'), 'utf8'));
  const dir = mkdtempSync(path.join(tmpDir, 'nfkc-'));
  writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify({ ...json, normalizer: { type: 'NFKC' } }));
  writeFileSync(path.join(dir, 'tokenizer_config.json'), readFileSync(path.join(conduitTinyDir, 'tokenizer_config.json')));
  const model = promptModelOf(dir, 4);
  assert.equal(model.tokenizer.maxTokenChars, null);
  assert.equal(maxPromptChars(model), null);
  checkPromptChars(model, 10_000_000);
});
