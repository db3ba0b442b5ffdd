import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Template } from '@huggingface/jinja';
import { get_encoding } from 'tiktoken';
import { loadReferenceModel, referenceLogits } from '../test/reference/llama-reference.ts';
import { DEFAULT_MODEL_DIR, writeDefaultModel } from './make-default-model.ts';

const readJson = (file: string) => JSON.parse(readFileSync(path.join(DEFAULT_MODEL_DIR, file), 'utf8'));

test('the committed models/conduit-tiny is exactly what make-default-model writes', () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'default-model-test-'));
  try {
    writeDefaultModel(dir);
    const files = readdirSync(dir).sort();
    assert.deepEqual(files, ['config.json', 'generation_config.json', 'model.safetensors', 'tokenizer_config.json']);
    for (const file of files) {
      assert.ok(readFileSync(path.join(dir, file)).equals(readFileSync(path.join(DEFAULT_MODEL_DIR, file))), `${file} differs; rerun the generator`);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('config and generation defaults describe the small tied bf16 Llama', () => {
  const config = readJson('config.json');
  assert.deepEqual(config.architectures, ['LlamaForCausalLM']);
  assert.equal(config.torch_dtype, 'bfloat16');
  assert.equal(config.vocab_size, 50257);
  assert.equal(config.tie_word_embeddings, true);
  assert.equal(config.max_position_embeddings, 2048);
  assert.deepEqual(
    [config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads, config.intermediate_size],
    [256, 4, 4, 2, 704],
  );
  assert.deepEqual(readJson('generation_config.json'), {
    bos_token_id: 50256,
    eos_token_id: 50256,
    max_new_tokens: 256,
    temperature: 0.8,
    top_k: 50,
    top_p: 0.95,
  });
});

test('the tokenizer is tiktoken gpt2, whose <|endoftext|> is the declared bos/eos id', () => {
  const tokenizerConfig = readJson('tokenizer_config.json');
  assert.equal(tokenizerConfig.tiktoken_encoding, 'gpt2');
  assert.equal(tokenizerConfig.eos_token, '<|endoftext|>');
  assert.equal(tokenizerConfig.added_tokens_decoder['50256'].content, '<|endoftext|>');
  const encoding = get_encoding(tokenizerConfig.tiktoken_encoding);
  try {
    assert.deepEqual([...encoding.encode('<|endoftext|>', 'all')], [50256]);
    assert.equal(new TextDecoder().decode(encoding.decode(new Uint32Array([50256]))), '<|endoftext|>');
  } finally {
    encoding.free();
  }
});

test('the chat template renders roles, closes assistant turns and opens a generation prompt', () => {
  const template = new Template(readJson('tokenizer_config.json').chat_template);
  const messages = [
    { role: 'system', content: 'Be brief.' },
    { role: 'user', content: 'Hi' },
    { role: 'assistant', content: 'Hello!' },
    { role: 'user', content: 'Bye' },
  ];
  assert.equal(
    template.render({ messages, add_generation_prompt: true }),
    '<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\nHello!<|endoftext|>\n<|user|>\nBye\n<|assistant|>\n',
  );
  assert.equal(template.render({ messages: messages.slice(1, 2), add_generation_prompt: false }), '<|user|>\nHi\n');
});

test('the reference forward pass runs on the default model with finite, varied logits', () => {
  const model = loadReferenceModel(DEFAULT_MODEL_DIR);
  const [first, second] = referenceLogits(model, [31373, 995]);
  assert.equal(first.length, 50257);
  assert.ok(first.every(Number.isFinite) && second.every(Number.isFinite));
  assert.notDeepEqual(first, second);
});
