// Each family's parser on outputs as those models write them (recorded shapes: Qwen2.5 / Hermes,
// Qwen3 and DeepSeek-R1 reasoning, Llama 3.1 JSON, Mistral), including the malformed and the cut
// off; and the property that makes streams and whole responses agree: any chunking of a text
// gives the same content, reasoning, calls and argument text as the whole.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { testSeed } from '../../../test/seed.ts';
import { CALL_SYNTAX, THINK_TAGS, type ToolCallFamily } from '../families.ts';
import { OutputParser, type OutputEvent, type OutputParserOptions } from '../output-parser.ts';

interface Expected {
  content: string;
  reasoning?: string;
  calls: Array<[string, string]>;
  incomplete?: boolean;
}

interface Case {
  name: string;
  family: ToolCallFamily | null;
  reasoning?: 'none' | 'open';
  text: string;
  expected: Expected;
}

const CASES: Case[] = [
  {
    name: 'Qwen2.5: one call',
    family: 'hermes',
    text: '<tool_call>\n{"name": "get_current_weather", "arguments": {"location": "San Francisco, CA", "unit": "fahrenheit"}}\n</tool_call>',
    expected: { content: '', calls: [['get_current_weather', '{"location": "San Francisco, CA", "unit": "fahrenheit"}']] },
  },
  {
    name: 'Qwen2.5: text, then two parallel calls',
    family: 'hermes',
    text: 'Let me look both up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>',
    expected: { content: 'Let me look both up.', calls: [['get_weather', '{"city": "Oslo"}'], ['get_time', '{"tz": "CET"}']] },
  },
  {
    name: 'Hermes: an end tag inside an argument does not end the call (vllm#45167)',
    family: 'hermes',
    text: '<tool_call>\n{"name": "write", "arguments": {"text": "</tool_call> is a tag", "n": [1, {"a": "}"}]}}\n</tool_call>',
    expected: { content: '', calls: [['write', '{"text": "</tool_call> is a tag", "n": [1, {"a": "}"}]}']] },
  },
  {
    name: 'Hermes: empty arguments (vllm#11392), name after arguments',
    family: 'hermes',
    text: '<tool_call>\n{"arguments": {}, "name": "now"}\n</tool_call>',
    expected: { content: '', calls: [['now', '{}']] },
  },
  {
    name: 'Hermes: JSON in plain text is content (llama.cpp#18183)',
    family: 'hermes',
    text: 'The call would be {"name": "f", "arguments": {}} but I will not make it.',
    expected: { content: 'The call would be {"name": "f", "arguments": {}} but I will not make it.', calls: [] },
  },
  {
    name: 'Hermes: malformed (an unquoted name) is content, as written',
    family: 'hermes',
    text: '<tool_call>\n{"name": get_weather, "arguments": {}}\n</tool_call>',
    expected: { content: '<tool_call>\n{"name": get_weather, "arguments": {}}\n</tool_call>', calls: [] },
  },
  {
    name: 'Hermes: not an object after the tag is content',
    family: 'hermes',
    text: '<tool_call> I cannot call that </tool_call>',
    expected: { content: '<tool_call> I cannot call that </tool_call>', calls: [] },
  },
  {
    name: 'Hermes: cut off by max_tokens inside the arguments: no half-parsed call',
    family: 'hermes',
    text: 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
    expected: { content: 'Checking.', calls: [], incomplete: true },
  },
  {
    name: 'Hermes: cut off before the end tag: the call is complete',
    family: 'hermes',
    text: '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_',
    expected: { content: '', calls: [['get_weather', '{"city": "Paris"}']] },
  },
  {
    name: 'Qwen3: a think section, then a call',
    family: 'hermes',
    reasoning: 'none',
    text: '<think>\nThe user wants the weather; I have a tool.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>',
    expected: { reasoning: '\nThe user wants the weather; I have a tool.\n', content: '', calls: [['get_weather', '{"city": "Rome"}']] },
  },
  {
    name: 'Qwen3: a <tool_call> while thinking is thought, not a call',
    family: 'hermes',
    reasoning: 'none',
    text: '<think>maybe <tool_call> later</think>\n\nNo call needed: 4.',
    expected: { reasoning: 'maybe <tool_call> later', content: 'No call needed: 4.', calls: [] },
  },
  {
    name: 'DeepSeek-R1: the prompt opened the think section',
    family: null,
    reasoning: 'open',
    text: 'Two plus two.\n</think>\n\nThe answer is 4.',
    expected: { reasoning: 'Two plus two.\n', content: 'The answer is 4.', calls: [] },
  },
  {
    name: 'A reasoning model that answers without thinking',
    family: null,
    reasoning: 'none',
    text: 'Just 4.',
    expected: { reasoning: '', content: 'Just 4.', calls: [] },
  },
  {
    name: 'Reasoning cut off inside the think section',
    family: null,
    reasoning: 'none',
    text: '<think>Let me count: one, two, thr',
    expected: { reasoning: 'Let me count: one, two, thr', content: '', calls: [] },
  },
  {
    name: 'Llama 3.1: a bare JSON call',
    family: 'llama3_json',
    text: '{"name": "get_weather", "parameters": {"city": "Lima", "days": 3}}',
    expected: { content: '', calls: [['get_weather', '{"city": "Lima", "days": 3}']] },
  },
  {
    name: 'Llama 3.1: after <|python_tag|>, two calls joined by "; "',
    family: 'llama3_json',
    text: '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}',
    expected: { content: '', calls: [['a', '{"x": 1}'], ['b', '{}']] },
  },
  {
    name: 'Llama 3.1: a JSON answer that is no call is content',
    family: 'llama3_json',
    text: '{"answer": 4, "why": "arithmetic"}',
    expected: { content: '{"answer": 4, "why": "arithmetic"}', calls: [] },
  },
  {
    name: 'Llama 3.1: text',
    family: 'llama3_json',
    text: 'It is sunny in Lima.',
    expected: { content: 'It is sunny in Lima.', calls: [] },
  },
  {
    name: 'Mistral: [TOOL_CALLS] and an array of two',
    family: 'mistral',
    text: '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Nice"}}, {"name": "get_time", "arguments": {}}]',
    expected: { content: '', calls: [['get_weather', '{"city": "Nice"}'], ['get_time', '{}']] },
  },
  {
    name: 'Mistral: the array alone (the marker is a special token the detokenizer drops)',
    family: 'mistral',
    text: '[{"name": "get_weather", "arguments": {"city": "Nice"}}]',
    expected: { content: '', calls: [['get_weather', '{"city": "Nice"}']] },
  },
  {
    name: 'Mistral: cut off in the second call keeps the first',
    family: 'mistral',
    text: '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"name": "b", "argum',
    expected: { content: '', calls: [['a', '{"x": 1}']], incomplete: true },
  },
  {
    name: 'Mistral: a bracketed answer is content',
    family: 'mistral',
    text: '[1, 2, 3] are the numbers.',
    expected: { content: '[1, 2, 3] are the numbers.', calls: [] },
  },
  {
    name: 'No tools offered: a call is only text',
    family: null,
    text: '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
    expected: { content: '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', calls: [] },
  },
];

function optionsOf(testCase: Case): OutputParserOptions {
  return {
    reasoning: testCase.reasoning === undefined ? null : THINK_TAGS,
    reasoningState: testCase.reasoning === 'open' ? 'open' : 'none',
    toolCalls: testCase.family === null ? null : CALL_SYNTAX[testCase.family],
  };
}

interface Parsed {
  events: OutputEvent[];
  parser: OutputParser;
}

function parseInChunks(testCase: Case, chunks: string[]): Parsed {
  const parser = new OutputParser(optionsOf(testCase));
  const events = chunks.flatMap((chunk) => parser.push(chunk));
  events.push(...parser.finish());
  return { events, parser };
}

/** What a client assembles from the events: content, reasoning, and each call's name and argument text. */
function assembled(events: OutputEvent[]) {
  let content = '';
  let reasoning = '';
  const calls: Array<[string, string]> = [];
  for (const event of events) {
    if (event.kind === 'content') content += event.text;
    else if (event.kind === 'reasoning') reasoning += event.text;
    else if (event.kind === 'call') calls[event.index] = [event.name, ''];
    else calls[event.index][1] += event.text;
  }
  return { content, reasoning, calls };
}

test('each family parses its recorded outputs: calls, content, reasoning, malformed and cut-off ones', () => {
  for (const testCase of CASES) {
    const { parser, events } = parseInChunks(testCase, [testCase.text]);
    const { expected } = testCase;
    assert.equal(parser.content, expected.content, testCase.name);
    assert.equal(parser.reasoning, expected.reasoning ?? '', testCase.name);
    assert.deepEqual(parser.toolCalls.map((call) => [call.name, call.arguments]), expected.calls, testCase.name);
    assert.equal(parser.hasIncompleteCall, expected.incomplete === true, testCase.name);
    for (const call of parser.toolCalls) {
      assert.match(call.id, /^call_[0-9a-f]{24}$/, testCase.name);
      JSON.parse(call.arguments);
    }
    // The events say the same, a call's id and name before its arguments.
    const fromEvents = assembled(events);
    assert.equal(fromEvents.content, expected.content, testCase.name);
    const complete = fromEvents.calls.slice(0, expected.calls.length);
    assert.deepEqual(complete, expected.calls, testCase.name);
  }
});

test('any chunking of an output gives what the whole gives (a stream equals its response)', (t) => {
  const seed = testSeed(t);
  let state = seed;
  const random = () => ((state = (Math.imul(state, 1103515245) + 12345) >>> 0) / 2 ** 32);
  for (const testCase of CASES) {
    const whole = parseInChunks(testCase, [testCase.text]);
    for (let round = 0; round < 40; round++) {
      const chunks: string[] = [];
      for (let at = 0; at < testCase.text.length; ) {
        const length = 1 + Math.floor(random() * (round % 2 === 0 ? 3 : 12));
        chunks.push(testCase.text.slice(at, at + length));
        at += length;
      }
      const streamed = parseInChunks(testCase, chunks);
      const label = `seed ${seed}, ${testCase.name}, chunks ${JSON.stringify(chunks)}`;
      assert.equal(streamed.parser.content, whole.parser.content, label);
      assert.equal(streamed.parser.reasoning, whole.parser.reasoning, label);
      assert.deepEqual(streamed.parser.toolCalls.map((call) => [call.name, call.arguments]), whole.parser.toolCalls.map((call) => [call.name, call.arguments]), label);
      assert.deepEqual(assembled(streamed.events), { ...assembled(whole.events), calls: assembled(whole.events).calls }, label);
    }
  }
});
