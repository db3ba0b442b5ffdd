// Each family's template renders a request's tools and a conversation's calls and results as the
// family expects, the family is told from its template, and a template that knows nothing of
// tools gets them in Hermes' words; the grammar that forces calls uses each family's own wrapper.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { loadChatTemplate } from '../../tokenizer/chat-template.ts';
import type { ChatMessage } from '../../tokenizer/chat-template.ts';
import type { TokenizerConfig } from '../../tokenizer/tokenizer-config.ts';
import { formatsOf, reasoningStateOf, THINK_TAGS } from '../families.ts';
import { promptWithTools, toolCallConstraint, type ToolDefinition } from '../tools.ts';
import { HERMES_TEMPLATE, LLAMA3_TEMPLATE, MISTRAL_TEMPLATE, QWEN3_TEMPLATE } from './family-templates.ts';

const WEATHER: ToolDefinition = {
  name: 'get_weather',
  description: 'The weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'], additionalProperties: false },
  strict: true,
};
const TIME: ToolDefinition = { name: 'get_time', description: null, parameters: null, strict: false };

const CONVERSATION: ChatMessage[] = [
  { role: 'user', content: 'Weather in Oslo?' },
  { role: 'assistant', content: '', tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: { city: 'Oslo' } } }] },
  { role: 'tool', content: 'Sunny, 21 C', tool_call_id: 'call_1', name: 'get_weather' },
  { role: 'user', content: 'And the time?' },
];

function render(template: string, messages: readonly ChatMessage[], tools: readonly ToolDefinition[]): string {
  const config = { chatTemplate: template, bosToken: '<s>', eosToken: '</s>' } as TokenizerConfig;
  const formats = formatsOf(template);
  const offered = promptWithTools(formats, messages, tools);
  return loadChatTemplate(config)!.render(offered.messages, { addGenerationPrompt: true, tools: offered.tools });
}

test('the family is read from the template; reasoning from its think tags', () => {
  assert.deepEqual(formatsOf(HERMES_TEMPLATE), { toolCalls: 'hermes', templateRendersTools: true, templateRendersToolCalls: true, reasoning: null });
  assert.equal(formatsOf(QWEN3_TEMPLATE).reasoning, THINK_TAGS);
  assert.equal(formatsOf(LLAMA3_TEMPLATE).toolCalls, 'llama3_json');
  assert.equal(formatsOf(MISTRAL_TEMPLATE).toolCalls, 'mistral');
  assert.deepEqual(formatsOf('{% for m in messages %}{{ m.content }}{% endfor %}'), { toolCalls: 'hermes', templateRendersTools: false, templateRendersToolCalls: false, reasoning: null });
  assert.equal(reasoningStateOf('<|im_start|>assistant\n<think>\n', THINK_TAGS), 'open');
  assert.equal(reasoningStateOf('<|im_start|>assistant\n<think>\n\n</think>\n\n', THINK_TAGS), 'closed');
  assert.equal(reasoningStateOf('<|im_start|>assistant\n', THINK_TAGS), 'none');
});

test('Hermes (Qwen2.5): tools in <tools>, calls in <tool_call>, results in <tool_response>', () => {
  const prompt = render(HERMES_TEMPLATE, CONVERSATION, [WEATHER, TIME]);
  assert.ok(prompt.startsWith('<|im_start|>system\nYou are a helpful assistant.\n\n# Tools'), prompt);
  assert.ok(prompt.includes('<tools>\n{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {"type": "object"'), prompt);
  assert.ok(prompt.includes('\n{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}\n</tools>'), prompt);
  assert.ok(prompt.includes('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>'), prompt);
  assert.ok(prompt.includes('<|im_start|>user\n<tool_response>\nSunny, 21 C\n</tool_response><|im_end|>'), prompt);
  assert.ok(prompt.endsWith('<|im_start|>user\nAnd the time?<|im_end|>\n<|im_start|>assistant\n'), prompt);
});

test('Llama 3.1: tools in the last user turn, calls as JSON with parameters, results as ipython', () => {
  const prompt = render(LLAMA3_TEMPLATE, CONVERSATION, [WEATHER]);
  assert.ok(prompt.includes('Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'), prompt);
  assert.ok(prompt.includes('{"type": "function", "function": {"name": "get_weather"'), prompt);
  assert.ok(prompt.includes('<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": {"city": "Oslo"}}<|eot_id|>'), prompt);
  assert.ok(prompt.includes('<|start_header_id|>ipython<|end_header_id|>\n\nSunny, 21 C<|eot_id|>'), prompt);
  assert.ok(prompt.endsWith('<|start_header_id|>assistant<|end_header_id|>\n\n'), prompt);
});

test('Mistral: [AVAILABLE_TOOLS] before the last user turn, [TOOL_CALLS] arrays, [TOOL_RESULTS]', () => {
  const prompt = render(MISTRAL_TEMPLATE, CONVERSATION, [WEATHER]);
  assert.ok(prompt.includes('[AVAILABLE_TOOLS][{"type": "function", "function": {"name": "get_weather"'), prompt);
  assert.ok(prompt.includes('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "call_1"}]</s>'), prompt);
  assert.ok(prompt.includes('[TOOL_RESULTS]{"call_id": "call_1", "content": "Sunny, 21 C"}[/TOOL_RESULTS]'), prompt);
  assert.ok(prompt.endsWith('[/AVAILABLE_TOOLS][INST] And the time?[/INST]'), prompt);
});

test('a template that knows nothing of tools gets them in Hermes words, and the history as text', () => {
  const plain = '{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}';
  const prompt = render(plain, CONVERSATION, [WEATHER]);
  assert.ok(prompt.startsWith('system: # Tools\n\nYou may call one or more functions'), prompt);
  assert.ok(prompt.includes('{"name": <function-name>, "arguments": <args-json-object>}'), prompt);
  assert.ok(prompt.includes('assistant: <tool_call>\n{"name":"get_weather","arguments":{"city":"Oslo"}}\n</tool_call>\n'), prompt);
  assert.ok(prompt.includes('tool: <tool_response>\nSunny, 21 C\n</tool_response>\n'), prompt);
  // No tools offered, no history of calls: the messages are untouched.
  assert.equal(render(plain, [{ role: 'user', content: 'hi' }], []), 'user: hi\nassistant:');
});

test('forced calls are a structural tag in the family\'s own wrapper; auto is constrained only for strict tools', () => {
  const tagOf = (family: 'hermes' | 'llama3_json' | 'mistral', choice: 'auto' | 'required' | { name: string }, parallel = true, tools = [WEATHER, TIME]) => {
    const constraint = toolCallConstraint(family, { tools, choice, parallel });
    return constraint === null ? null : JSON.parse((constraint as { structuralTag: string }).structuralTag).format;
  };
  const hermes = tagOf('hermes', 'required');
  assert.equal(hermes.type, 'tags_with_separator');
  assert.equal(hermes.at_least_one, true);
  assert.equal(hermes.stop_after_first, false);
  assert.deepEqual(hermes.tags.map((tag: { begin: string }) => tag.begin), ['<tool_call>\n{"name": "get_weather", "arguments": ', '<tool_call>\n{"name": "get_time", "arguments": ']);
  assert.deepEqual(hermes.tags[0].content, { type: 'json_schema', json_schema: WEATHER.parameters });
  assert.deepEqual(hermes.tags[1].content, { type: 'json_schema', json_schema: { type: 'object' } });
  assert.equal(tagOf('hermes', 'required', false).stop_after_first, true);
  const named = tagOf('hermes', { name: 'get_time' });
  assert.deepEqual(named.tags.map((tag: { begin: string }) => tag.begin), ['<tool_call>\n{"name": "get_time", "arguments": ']);
  assert.equal(named.stop_after_first, true);
  assert.equal(tagOf('llama3_json', 'required').tags[0].begin, '{"name": "get_weather", "parameters": ');
  const mistral = tagOf('mistral', 'required');
  assert.deepEqual(mistral.elements.map((element: { type: string }) => element.type), ['const_string', 'tags_with_separator', 'const_string']);
  assert.equal(tagOf('hermes', 'auto', true, [TIME]), null);
  const auto = tagOf('hermes', 'auto');
  assert.equal(auto.type, 'triggered_tags');
  assert.deepEqual(auto.triggers, ['<tool_call>']);
  assert.equal(toolCallConstraint('hermes', { tools: [WEATHER], choice: 'none', parallel: true }), null);
});
