// Every family served end to end from a checkpoint directory as transformers lays it out
// (config.json, model.safetensors, tokenizer.json, tokenizer_config.json with the family's
// published chat template, generation_config.json), written fresh by tools/make-checkpoint.ts:
// the gateway renders the family's template, tokenizes, and a worker decodes on the native
// runtime. Prompt token counts show the template was applied, and the template variables a
// request passes (chat_template_kwargs, reasoning_effort) reach it.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type OpenAI from 'openai';
import type { RunningServer } from '../../bin/serve.ts';
import { DEFAULT_OPTIONS, writeRandomCheckpoint, type CheckpointOptions } from '../../tools/make-checkpoint.ts';
import { boundedFetch, openaiClient, startServer } from './harness.ts';

const VOCAB_SIZE = 300;
const FAMILIES: Record<string, Partial<CheckpointOptions>> = {
  qwen3: { arch: 'qwen3', headDim: 16 },
  'qwen3-moe': { arch: 'qwen3_moe', headDim: 16, numExperts: 4, numExpertsPerToken: 2, moeIntermediateSize: 32 },
  mixtral: { arch: 'mixtral', numExperts: 4, numExpertsPerToken: 2 },
  gemma3: { arch: 'gemma3', headDim: 16, slidingWindow: 8, slidingWindowPattern: 2, tieWordEmbeddings: true },
  phi3: { arch: 'phi3' },
  'gpt-oss': { arch: 'gpt_oss', headDim: 16, numExperts: 4, numExpertsPerToken: 2 },
};

let dir: string;
let server: RunningServer;
let client: OpenAI;

before(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-families-'));
  for (const [name, options] of Object.entries(FAMILIES)) {
    writeRandomCheckpoint({
      ...DEFAULT_OPTIONS,
      outDir: path.join(dir, name),
      hiddenSize: 64,
      numLayers: 2,
      numHeads: 4,
      numKvHeads: 2,
      intermediateSize: 64,
      vocabSize: VOCAB_SIZE,
      maxPositionEmbeddings: 512,
      seed: 3,
      ...options,
    });
  }
  server = await startServer(
    Object.keys(FAMILIES).map((name) => ({ path: path.join(dir, name), num_workers: 1, threads_per_worker: 1, kv_cache_blocks: 64, max_num_seqs: 4 })),
  );
  client = openaiClient(`${server.httpAddress}/v1`);
});

after(async () => {
  await server?.close();
  rmSync(dir, { recursive: true, force: true });
});

async function renderedTokenCount(model: string, messages: unknown[]): Promise<number> {
  const response = await boundedFetch(`${server.httpAddress}/tokenize`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, messages }),
  });
  assert.equal(response.status, 200, await response.clone().text());
  return ((await response.json()) as { count: number }).count;
}

// Mixtral's published template raises on a system message (roles must alternate user/assistant).
function messagesFor(model: string): { role: 'system' | 'user'; content: string }[] {
  const user = { role: 'user' as const, content: 'Hello there' };
  return model === 'mixtral' ? [user] : [{ role: 'system', content: 'Be brief.' }, user];
}

async function chat(model: string, extra: Record<string, unknown> = {}): Promise<OpenAI.Chat.ChatCompletion> {
  return client.chat.completions.create({
    model,
    messages: messagesFor(model),
    max_tokens: 4,
    temperature: 0,
    ignore_eos: true,
    ...extra,
  } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
}

for (const name of Object.keys(FAMILIES)) {
  test(`${name}: a chat renders the family's template and decodes`, async () => {
    const completion = await chat(name);
    assert.equal(completion.choices[0].finish_reason, 'length');
    assert.equal(completion.usage?.completion_tokens, 4);
    const messages = messagesFor(name);
    assert.equal(completion.usage?.prompt_tokens, await renderedTokenCount(name, messages));
    // More than the messages' bytes: the template's tags (one token each) and its text.
    const contentBytes = messages.map((message) => message.content).join('').length;
    assert.ok(completion.usage!.prompt_tokens > contentBytes + 2, `${name}: ${completion.usage?.prompt_tokens} prompt tokens`);
  });
}

test('chat_template_kwargs reach Qwen3\'s template (enable_thinking) and reasoning_effort gpt-oss\'s', async () => {
  const thinking = await chat('qwen3');
  const direct = await chat('qwen3', { chat_template_kwargs: { enable_thinking: false } });
  // <think>\n\n</think>\n\n: <think> and </think> are one token each, the four newlines a byte each.
  assert.equal(direct.usage!.prompt_tokens - thinking.usage!.prompt_tokens, 6);
  const medium = await chat('gpt-oss');
  const high = await chat('gpt-oss', { reasoning_effort: 'high' });
  assert.equal(high.usage!.prompt_tokens - medium.usage!.prompt_tokens, 'high'.length - 'medium'.length);
});
