// `conduit serve --model FILE.gguf` as a user runs it: a GGUF our writer made from conduit-tiny
// (its BF16 weights as stored, its tokenizer and a chat template of its own embedded), answering
// the official client over HTTP. The same checkpoint as safetensors, served beside it, is the
// reference: with bitwise the same logits, the same embedded tokenizer and template give the
// same prompt token count and the same greedy text, and a template other than the embedded one
// would not. The model is named after its file, as a directory's is after its folder.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { writeLlamaGguf } from '../../tools/llama-gguf.ts';
import { DEFAULT_OPTIONS, writeRandomCheckpoint } from '../../tools/make-checkpoint.ts';
import { defaultModelDir, openaiClient, startServer, within } from './harness.ts';
import { startCli } from './cli-process.ts';

/** Distinct from every default: the prompt's token count shows which template rendered it. */
const CHAT_TEMPLATE =
  "{% for message in messages %}<<{{ message['role'] | upper }}>> {{ message['content'] }} <</{{ message['role'] }}>>\n{% endfor %}" +
  '{% if add_generation_prompt %}<<ASSISTANT>>{% endif %}';

const MESSAGES: OpenAI.Chat.ChatCompletionMessageParam[] = [
  { role: 'system', content: 'You answer briefly.' },
  { role: 'user', content: 'Name a colour of the sky.' },
];

/** conduit-tiny with CHAT_TEMPLATE, as safetensors (weights linked) and as a GGUF alone in its folder. */
function writeModels(workDir: string): { safetensorsDir: string; ggufFile: string } {
  const safetensorsDir = path.join(workDir, 'tiny-templated');
  mkdirSync(safetensorsDir);
  for (const file of ['config.json', 'generation_config.json', 'tokenizer.json']) {
    copyFileSync(path.join(defaultModelDir, file), path.join(safetensorsDir, file));
  }
  symlinkSync(path.join(defaultModelDir, 'model.safetensors'), path.join(safetensorsDir, 'model.safetensors'));
  const tokenizerConfig = JSON.parse(readFileSync(path.join(defaultModelDir, 'tokenizer_config.json'), 'utf8')) as Record<string, unknown>;
  writeFileSync(path.join(safetensorsDir, 'tokenizer_config.json'), JSON.stringify({ ...tokenizerConfig, chat_template: CHAT_TEMPLATE }));
  const ggufDir = path.join(workDir, 'gguf');
  mkdirSync(ggufDir);
  const ggufFile = path.join(ggufDir, 'tiny-bf16.gguf');
  writeLlamaGguf(safetensorsDir, ggufFile);
  return { safetensorsDir, ggufFile };
}

async function greedyChat(client: OpenAI, model: string): Promise<{ text: string; promptTokens: number; finishReason: string }> {
  const completion = await client.chat.completions.create({ model, messages: MESSAGES, max_tokens: 12, temperature: 0 });
  return {
    text: completion.choices[0].message.content ?? '',
    promptTokens: completion.usage!.prompt_tokens,
    finishReason: completion.choices[0].finish_reason,
  };
}

test('conduit serve --model FILE.gguf answers chat completions with the embedded tokenizer and chat template', { timeout: 180_000 }, async (t) => {
  const workDir = mkdtempSync(path.join(os.tmpdir(), 'conduit-gguf-served-'));
  t.after(() => rmSync(workDir, { recursive: true, force: true }));
  const { safetensorsDir, ggufFile } = writeModels(workDir);

  const reference = await startServer([{ path: safetensorsDir, num_workers: 1, threads_per_worker: 1, kv_cache_blocks: 64, max_num_seqs: 4 }]);
  t.after(() => reference.close());
  const expected = await greedyChat(openaiClient(`${reference.httpAddress}/v1`), 'tiny-templated');
  // The template's own words and markers are many tokens: a default template would count fewer.
  assert.ok(expected.promptTokens > 30, `the reference prompt is ${expected.promptTokens} tokens`);

  const server = startCli(t, ['serve', '--model', ggufFile, '--http-port', '0', '--metrics-port', '0']);
  const client = openaiClient(`${(await server.serving()).http}/v1`);
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ['tiny-bf16.gguf']);
  assert.deepEqual(await greedyChat(client, 'tiny-bf16.gguf'), expected, 'the GGUF answers as its safetensors twin');

  const stream = await client.chat.completions.create({
    model: 'tiny-bf16.gguf',
    messages: MESSAGES,
    max_tokens: 12,
    temperature: 0,
    stream: true,
    stream_options: { include_usage: true },
  });
  let streamedText = '';
  let promptTokens = 0;
  for await (const chunk of stream) {
    streamedText += chunk.choices[0]?.delta.content ?? '';
    promptTokens = chunk.usage?.prompt_tokens ?? promptTokens;
  }
  assert.equal(streamedText, expected.text, 'streamed as answered');
  assert.equal(promptTokens, expected.promptTokens);

  server.child.kill('SIGTERM');
  assert.equal(await within(server.exited, 'exit after SIGTERM'), 0);
});

test('conduit serve --model FILE.gguf serves a Qwen3-MoE file (stacked experts) as its safetensors twin answers', { timeout: 180_000 }, async (t) => {
  const workDir = mkdtempSync(path.join(os.tmpdir(), 'conduit-gguf-moe-'));
  t.after(() => rmSync(workDir, { recursive: true, force: true }));
  // Random MoE weights beside conduit-tiny's tokenizer (its vocabulary size) and chat template.
  const safetensorsDir = path.join(workDir, 'tiny-moe');
  const vocabSize = (JSON.parse(readFileSync(path.join(defaultModelDir, 'config.json'), 'utf8')) as { vocab_size: number }).vocab_size;
  writeRandomCheckpoint({
    ...DEFAULT_OPTIONS,
    outDir: safetensorsDir,
    arch: 'qwen3_moe',
    hiddenSize: 64,
    numLayers: 2,
    numHeads: 4,
    numKvHeads: 2,
    headDim: 16,
    intermediateSize: 96,
    moeIntermediateSize: 32,
    numExperts: 8,
    numExpertsPerToken: 2,
    vocabSize,
    dtype: 'bf16',
    seed: 37,
  });
  for (const file of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(path.join(defaultModelDir, file), path.join(safetensorsDir, file));
  const ggufFile = path.join(workDir, 'tiny-moe.gguf');
  writeLlamaGguf(safetensorsDir, ggufFile);

  const reference = await startServer([{ path: safetensorsDir, num_workers: 1, threads_per_worker: 1, kv_cache_blocks: 64, max_num_seqs: 4 }]);
  t.after(() => reference.close());
  const expected = await greedyChat(openaiClient(`${reference.httpAddress}/v1`), 'tiny-moe');

  const server = startCli(t, ['serve', '--model', ggufFile, '--http-port', '0', '--metrics-port', '0']);
  const client = openaiClient(`${(await server.serving()).http}/v1`);
  assert.deepEqual(await greedyChat(client, 'tiny-moe.gguf'), expected, 'the MoE GGUF answers as its safetensors twin');
  server.child.kill('SIGTERM');
  assert.equal(await within(server.exited, 'exit after SIGTERM'), 0);
});
