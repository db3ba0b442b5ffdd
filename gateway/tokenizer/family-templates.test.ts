// The families' published chat templates (tools/chat-templates/, each with its source) rendered
// by loadChatTemplate through @huggingface/jinja, as transformers' apply_chat_template renders
// them: recorded conversations, each with the text the real tokenizer produces. Where a publisher
// or a project quotes transformers' own output, the case says so; the rest follow the formats the
// model cards document (Qwen3 drops earlier turns' reasoning; gpt-oss's harmony messages).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadChatTemplate, type ChatMessage, type ChatTemplate } from './chat-template.ts';

const TEMPLATES = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', '..', 'tools', 'chat-templates');

function templateOf(file: string, bosToken: string | null, eosToken: string | null): ChatTemplate {
  const chatTemplate = readFileSync(path.join(TEMPLATES, file), 'utf8').replace(/\n$/, '');
  return loadChatTemplate({ raw: {}, bosToken, eosToken, addBosToken: false, addedTokens: [], chatTemplate, tiktokenEncoding: null })!;
}

const user = (content: string): ChatMessage => ({ role: 'user', content });
const assistant = (content: string): ChatMessage => ({ role: 'assistant', content });
const system = (content: string): ChatMessage => ({ role: 'system', content });

test('Qwen3: the generation prompt, thinking switched off, earlier reasoning dropped, tool calls', () => {
  const qwen3 = templateOf('qwen3.jinja', null, '<|im_end|>');
  assert.equal(
    qwen3.render([system('You are a helpful assistant.'), user('Hello!')], { addGenerationPrompt: true }),
    '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n',
  );
  // enable_thinking=False closes an empty think block, so the model answers at once.
  assert.equal(
    qwen3.render([user('Hello!')], { addGenerationPrompt: true, kwargs: { enable_thinking: false } }),
    '<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n',
  );
  assert.equal(
    qwen3.render([user('Hello!')], { addGenerationPrompt: true, kwargs: { enable_thinking: true } }),
    '<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n',
  );
  // transformers' output for Qwen/Qwen3-0.6B, as tyler-griggs/SkyRL's templates README records it.
  assert.equal(
    qwen3.render([user('Hi'), assistant('Hello')], { addGenerationPrompt: false }),
    '<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello<|im_end|>\n',
  );
  // Reasoning of turns before the last query is not fed back.
  assert.equal(
    qwen3.render([user('What is 2+2?'), assistant('<think>\nAdd them.\n</think>\n\n4'), user('And 3+3?')], { addGenerationPrompt: true }),
    '<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n',
  );
  const call: ChatMessage = { role: 'assistant', content: '', tool_calls: [{ id: 'c1', type: 'function', function: { name: 'get_weather', arguments: { city: 'Paris' } } }] };
  assert.equal(
    qwen3.render([user('Weather in Paris?'), call, { role: 'tool', content: '18C', tool_call_id: 'c1' }], { addGenerationPrompt: true }),
    '<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n' +
      '<|im_start|>user\n<tool_response>\n18C\n</tool_response><|im_end|>\n<|im_start|>assistant\n',
  );
});

test('Gemma 3: bos, the system message folded into the first user turn, model turns, trimming, alternation enforced', () => {
  const gemma3 = templateOf('gemma3.jinja', '<bos>', '<eos>');
  assert.equal(
    gemma3.render([system('You are terse.'), user(' Hi '), assistant('Hello.'), user('Bye')], { addGenerationPrompt: true }),
    '<bos><start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n',
  );
  assert.throws(() => gemma3.render([user('a'), user('b')], { addGenerationPrompt: true }), /Conversation roles must alternate user\/assistant/);
});

/** strftime_now("%Y-%m-%d"), as the template reads today's date. */
function today(): string {
  const now = new Date();
  return `${now.getFullYear()}-${String(now.getMonth() + 1).padStart(2, '0')}-${String(now.getDate()).padStart(2, '0')}`;
}

test('gpt-oss: harmony system message with the reasoning effort and date, developer instructions, final channel', () => {
  const gptOss = templateOf('gpt-oss.jinja', '<|startoftext|>', '<|return|>');
  const systemMessage = (effort: string) =>
    '<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\n' +
    `Current date: ${today()}\n\nReasoning: ${effort}\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>`;
  assert.equal(
    gptOss.render([system('Answer briefly.'), user('Hi')], { addGenerationPrompt: true, kwargs: { reasoning_effort: 'high' } }),
    `${systemMessage('high')}<|start|>developer<|message|># Instructions\n\nAnswer briefly.<|end|><|start|>user<|message|>Hi<|end|><|start|>assistant`,
  );
  // Earlier answers go back on the final channel, their reasoning dropped; the effort defaults to medium.
  assert.equal(
    gptOss.render([user('Hi'), assistant('Hello!'), user('Weather?')], { addGenerationPrompt: true }),
    `${systemMessage('medium')}<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>Hello!<|end|>` +
      '<|start|>user<|message|>Weather?<|end|><|start|>assistant',
  );
});

test('Phi-4-mini and Mixtral: role tags and [INST] turns', () => {
  const phi = templateOf('phi4-mini.jinja', '<|endoftext|>', '<|endoftext|>');
  assert.equal(phi.render([system('Be brief.'), user('Hi there')], { addGenerationPrompt: true }), '<|system|>Be brief.<|end|><|user|>Hi there<|end|><|assistant|>');
  const mixtral = templateOf('mixtral.jinja', '<s>', '</s>');
  assert.equal(mixtral.render([user('Hi'), assistant('Hello'), user('Bye')], { addGenerationPrompt: true }), '<s>[INST] Hi [/INST]Hello</s>[INST] Bye [/INST]');
});
