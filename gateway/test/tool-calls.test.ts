// Tools, structured outputs and reasoning over a real gateway on a scripted engine: what the
// worker is asked for (the grammar each request carries), and how the model's text comes back:
// chat's tool_calls and reasoning_content, streamed as OpenAI streams them and equal to the
// whole response, the Responses API's function_call and reasoning items over HTTP, SSE and
// WebSocket mode, and the official SDK's parse helpers. Real generation under the grammar is
// test/integration/structured-outputs.test.ts.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import OpenAI from 'openai';
import { zodFunction, zodResponseFormat, zodTextFormat } from 'openai/helpers/zod';
import { ResponsesWS } from 'openai/resources/responses/ws';
import { z } from 'zod';
import type { GenerateRequest, StructuredOutput } from '../../engine/types.ts';
import { HERMES_TEMPLATE, MISTRAL_TEMPLATE, QWEN3_TEMPLATE } from '../tool-calls/test/family-templates.ts';
import { LONG_MODEL_NAME, oneTokenPerStep, sseEvents, startTestGateway, type TestGateway } from './harness.ts';
import type { Script } from './scripted-engine.ts';

const WEATHER_TOOL = {
  type: 'function' as const,
  function: {
    name: 'get_weather',
    description: 'The weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'], additionalProperties: false },
  },
};
const CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>';

let hermes: TestGateway;
let qwen3: TestGateway;
let script: Script = { steps: [] };
let hermesClient: OpenAI;

before(async () => {
  hermes = await startTestGateway(() => script, { chatTemplate: HERMES_TEMPLATE, longModelLen: 4096 });
  qwen3 = await startTestGateway(() => script, { chatTemplate: QWEN3_TEMPLATE, longModelLen: 4096 });
  hermesClient = new OpenAI({ baseURL: `${hermes.baseUrl}/v1`, apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  await hermes.close();
  await qwen3.close();
});

function say(target: TestGateway, text: string, finishReason: 'stop' | 'length' = 'stop') {
  script = { steps: oneTokenPerStep(target.tokens(text)), finishReason };
}

const lastRequest = (target: TestGateway): GenerateRequest => target.engine.requests.at(-1)!;
const lastPrompt = (target: TestGateway) => target.tokenizer.decode(lastRequest(target).promptTokenIds, { skipSpecialTokens: false });

async function postJson(target: TestGateway, route: string, body: object) {
  const response = await target.post(route, { model: LONG_MODEL_NAME, ...body });
  return { status: response.status, body: (await response.json()) as Record<string, any> };
}

async function postStream(target: TestGateway, route: string, body: object) {
  const response = await target.post(route, { model: LONG_MODEL_NAME, stream: true, ...body });
  assert.equal(response.status, 200);
  return sseEvents(await response.text()).filter((event) => event !== '[DONE]') as Record<string, any>[];
}

const messages = [{ role: 'user', content: 'Weather in Oslo?' }];

test('chat: a Hermes call comes back as tool_calls with finish_reason tool_calls; content is null', async () => {
  say(hermes, CALL_TEXT);
  const { status, body } = await postJson(hermes, '/v1/chat/completions', { messages, tools: [WEATHER_TOOL] });
  assert.equal(status, 200, JSON.stringify(body));
  const [choice] = body.choices;
  assert.equal(choice.finish_reason, 'tool_calls');
  assert.equal(choice.message.content, null);
  assert.equal(choice.message.tool_calls.length, 1);
  const [call] = choice.message.tool_calls;
  assert.match(call.id, /^call_/);
  assert.deepEqual({ ...call, id: '' }, { id: '', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Oslo"}' } });
  // The template rendered the tools; auto with no strict tool leaves the output free.
  assert.ok(lastPrompt(hermes).includes('<tools>\n{"type": "function", "function": {"name": "get_weather"'));
  assert.equal(lastRequest(hermes).structuredOutput, undefined);
});

test('chat: streamed, the call\'s id and name come first, then its argument pieces; it adds up to the whole response', async () => {
  say(hermes, `Let me check.\n${CALL_TEXT}\n${CALL_TEXT.replace('Oslo', 'Rome')}`);
  const whole = (await postJson(hermes, '/v1/chat/completions', { messages, tools: [WEATHER_TOOL] })).body.choices[0];
  const chunks = await postStream(hermes, '/v1/chat/completions', { messages, tools: [WEATHER_TOOL] });
  let content = '';
  const calls: Array<{ id: string; name: string; arguments: string }> = [];
  let finishReason: string | null = null;
  for (const chunk of chunks) {
    const [choice] = chunk.choices;
    finishReason = choice.finish_reason ?? finishReason;
    content += choice.delta.content ?? '';
    for (const delta of choice.delta.tool_calls ?? []) {
      if (delta.id !== undefined) {
        assert.equal(delta.index, calls.length, 'a call opens with the next index');
        assert.deepEqual(Object.keys(delta).sort(), ['function', 'id', 'index', 'type']);
        assert.equal(delta.function.arguments, '');
        calls.push({ id: delta.id, name: delta.function.name, arguments: '' });
      } else {
        assert.deepEqual(Object.keys(delta).sort(), ['function', 'index']);
        calls[delta.index].arguments += delta.function.arguments;
      }
    }
  }
  assert.equal(finishReason, 'tool_calls');
  assert.equal(content, whole.message.content);
  assert.equal(content, 'Let me check.');
  assert.deepEqual(calls.map(({ name, arguments: args }) => [name, args]), whole.message.tool_calls.map((call: any) => [call.function.name, call.function.arguments]));
  assert.equal(calls.length, 2);
  assert.ok(chunks.filter((chunk) => chunk.choices[0].delta.tool_calls?.[0]?.id === undefined && chunk.choices[0].delta.tool_calls).length > 2, 'arguments arrive in pieces');
});

test('Mistral: a forced call begins with [TOOL_CALLS] itself, output by the worker before the grammar (a special token no grammar spells)', async () => {
  const mistral = await startTestGateway(() => script, { chatTemplate: MISTRAL_TEMPLATE, addedSpecialTokens: ['[TOOL_CALLS]'], longModelLen: 4096 });
  // A tokenizer without the special token: the grammar spells the marker as text.
  const plain = await startTestGateway(() => script, { chatTemplate: MISTRAL_TEMPLATE, longModelLen: 4096 });
  try {
    const [markerId] = mistral.tokens('[TOOL_CALLS]');
    assert.ok(mistral.tokenizer.specialTokenIds.has(markerId));
    const callArray = '[{"name": "get_weather", "arguments": {"city": "Oslo"}}]';
    // What the worker outputs for the forced call: the marker, then the array under the grammar.
    script = { steps: oneTokenPerStep([markerId, ...mistral.tokens(callArray)]), finishReason: 'stop' };
    const { body } = await postJson(mistral, '/v1/chat/completions', { messages, tools: [WEATHER_TOOL], tool_choice: 'required' });
    const forced = lastRequest(mistral).structuredOutput!;
    assert.deepEqual(forced.prefixTokenIds, [markerId]);
    const format = JSON.parse((forced.constraint as { structuralTag: string }).structuralTag).format;
    assert.deepEqual(format.elements[0], { type: 'const_string', value: '[' }, 'the grammar starts after the marker');
    assert.equal(body.choices[0].finish_reason, 'tool_calls');
    assert.deepEqual(body.choices[0].message.tool_calls.map((call: any) => [call.function.name, JSON.parse(call.function.arguments)]), [['get_weather', { city: 'Oslo' }]]);
    assert.equal(body.choices[0].message.content, null);
    // auto stays free (no grammar, no prefix).
    say(mistral, callArray);
    await postJson(mistral, '/v1/chat/completions', { messages, tools: [WEATHER_TOOL], tool_choice: 'auto' });
    assert.equal(lastRequest(mistral).structuredOutput, undefined);

    say(plain, `[TOOL_CALLS]${callArray}`);
    await postJson(plain, '/v1/chat/completions', { messages, tools: [WEATHER_TOOL], tool_choice: 'required' });
    const spelled = lastRequest(plain).structuredOutput!;
    assert.equal(spelled.prefixTokenIds, undefined);
    assert.deepEqual(JSON.parse((spelled.constraint as { structuralTag: string }).structuralTag).format.elements[0], { type: 'const_string', value: '[TOOL_CALLS][' });
  } finally {
    await mistral.close();
    await plain.close();
  }
});

test('chat: required and a named tool are forced through the grammar; named ends with stop; none offers no tools', async () => {
  const time = { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } };
  say(hermes, CALL_TEXT);
  await postJson(hermes, '/v1/chat/completions', { messages, tools: [WEATHER_TOOL, time], tool_choice: 'required', parallel_tool_calls: false });
  const required = lastRequest(hermes).structuredOutput!;
  assert.equal(required.constraint.kind, 'structural_tag');
  const tag = JSON.parse((required.constraint as { structuralTag: string }).structuralTag).format;
  assert.deepEqual(tag.tags.map((each: { begin: string }) => each.begin), ['<tool_call>\n{"name": "get_weather", "arguments": ', '<tool_call>\n{"name": "get_time", "arguments": ']);
  assert.equal(tag.stop_after_first, true);
  assert.equal(required.jumpForward, true);

  const { body } = await postJson(hermes, '/v1/chat/completions', { messages, tools: [WEATHER_TOOL, time], tool_choice: { type: 'function', function: { name: 'get_weather' } } });
  assert.equal(body.choices[0].finish_reason, 'stop', 'a named tool_choice ends with stop, as OpenAI');
  assert.equal(body.choices[0].message.tool_calls[0].function.name, 'get_weather');
  const named = JSON.parse((lastRequest(hermes).structuredOutput!.constraint as { structuralTag: string }).structuralTag).format;
  assert.deepEqual(named.tags.map((each: { begin: string }) => each.begin), ['<tool_call>\n{"name": "get_weather", "arguments": ']);

  const none = await postJson(hermes, '/v1/chat/completions', { messages, tools: [WEATHER_TOOL], tool_choice: 'none' });
  assert.equal(none.body.choices[0].message.content, CALL_TEXT, 'without tools a call is only text');
  assert.equal(none.body.choices[0].finish_reason, 'stop');
  assert.ok(!lastPrompt(hermes).includes('<tools>'));
});

test('chat: a cut-off call ends with length and is not returned half-parsed', async () => {
  say(hermes, CALL_TEXT.slice(0, 40), 'length');
  const { body } = await postJson(hermes, '/v1/chat/completions', { messages, tools: [WEATHER_TOOL], max_tokens: 30 });
  assert.equal(body.choices[0].finish_reason, 'length');
  assert.equal(body.choices[0].message.tool_calls, undefined);
});

test('chat: past calls and their results render through the template', async () => {
  say(hermes, 'It is sunny.');
  const history = [
    ...messages,
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_9', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Oslo"}' } }] },
    { role: 'tool', tool_call_id: 'call_9', content: 'Sunny' },
  ];
  const { body } = await postJson(hermes, '/v1/chat/completions', { messages: history, tools: [WEATHER_TOOL] });
  assert.equal(body.choices[0].message.content, 'It is sunny.');
  const prompt = lastPrompt(hermes);
  assert.ok(prompt.includes('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'), prompt);
  assert.ok(prompt.includes('<tool_response>\nSunny\n</tool_response>'), prompt);
  const missing = await postJson(hermes, '/v1/chat/completions', { messages: [...messages, { role: 'tool', content: 'x' }] });
  assert.equal(missing.status, 400);
  assert.equal(missing.body.error.param, 'messages[1].tool_call_id');
});

test('response formats and structured_outputs reach the worker as constraints; bad schemas are 400s naming the field', async () => {
  say(hermes, '{"a": 1}');
  const schema = { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'], additionalProperties: false };
  const referring = {
    type: 'object',
    properties: { a: { $ref: '#/$defs/a~1b' }, b: { $ref: '#point' }, pattern: { enum: [{ pattern: '(' }] } },
    $defs: { 'a/b': { type: 'string', pattern: '^[a-z]+$' }, point: { $anchor: 'point', type: 'integer' } },
  };
  const cases: Array<[string, object, StructuredOutput['constraint']]> = [
    ['/v1/chat/completions', { messages, response_format: { type: 'json_schema', json_schema: { name: 'x', schema, strict: true } } }, { kind: 'json_schema', schema: JSON.stringify(schema) }],
    ['/v1/chat/completions', { messages, response_format: { type: 'json_object' } }, { kind: 'json_object' }],
    ['/v1/chat/completions', { messages, structured_outputs: { regex: '[0-9]+' } }, { kind: 'regex', pattern: '[0-9]+' }],
    ['/v1/chat/completions', { messages, structured_outputs: { choice: ['a', 'b'] } }, { kind: 'choice', choices: ['a', 'b'] }],
    ['/v1/completions', { prompt: 'x', structured_outputs: { grammar: 'root ::= "a"' } }, { kind: 'grammar', grammar: 'root ::= "a"' }],
    ['/v1/completions', { prompt: 'x', response_format: { type: 'json_schema', json_schema: { name: 'x', schema } } }, { kind: 'json_schema', schema: JSON.stringify(schema) }],
    ['/v1/completions', { prompt: 'x', structured_outputs: { json: schema } }, { kind: 'json_schema', schema: JSON.stringify(schema) }],
    // References that find their targets (an escaped pointer, an anchor); values that only look like broken patterns.
    ['/v1/completions', { prompt: 'x', structured_outputs: { json: referring } }, { kind: 'json_schema', schema: JSON.stringify(referring) }],
  ];
  for (const [route, body, constraint] of cases) {
    const response = await postJson(hermes, route, body);
    assert.equal(response.status, 200, JSON.stringify(response.body));
    assert.deepEqual(lastRequest(hermes).structuredOutput, { constraint, jumpForward: true }, JSON.stringify(body));
  }
  await postJson(hermes, '/v1/chat/completions', { messages, logprobs: true, response_format: { type: 'json_object' } });
  assert.equal(lastRequest(hermes).structuredOutput!.jumpForward, false, 'forced tokens would have no logprobs of their own');

  const refusals: Array<[string, object, string, RegExp]> = [
    ['/v1/chat/completions', { messages, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { a: {} } }, strict: true } } }, 'response_format.json_schema.schema', /'additionalProperties' is required to be supplied and to be false/],
    ['/v1/chat/completions', { messages, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { a: {} }, additionalProperties: false }, strict: true } } }, 'response_format.json_schema.schema', /Missing 'a'/],
    ['/v1/chat/completions', { messages, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'nope' } } } }, 'response_format.json_schema.schema', /Invalid schema for response_format 'x'/],
    ['/v1/chat/completions', { messages, structured_outputs: { json: { type: 'object', properties: { a: { $ref: '#/$defs/missing' } }, $defs: { present: {} } } } }, 'structured_outputs.json', /can't resolve reference #\/\$defs\/missing from #\/properties\/a/],
    ['/v1/chat/completions', { messages, structured_outputs: { json: { type: 'object', properties: { a: { $ref: '#nowhere' } } } } }, 'structured_outputs.json', /can't resolve reference #nowhere/],
    ['/v1/chat/completions', { messages, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'array', items: { anyOf: [{ type: 'string', pattern: '(a' }] } } } } }, 'response_format.json_schema.schema', /pattern "\(a" at #\/items\/anyOf\/0 is not a regular expression/],
    ['/v1/chat/completions', { messages, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', patternProperties: { '[': {} } } } } }, 'response_format.json_schema.schema', /pattern "\[" at #\/patternProperties is not a regular expression/],
    ['/v1/chat/completions', { messages, response_format: { type: 'json_schema', json_schema: { name: 'bad name', schema } } }, 'response_format.json_schema.name', /name/],
    ['/v1/chat/completions', { messages, structured_outputs: { regex: 'a', choice: ['b'] } }, 'structured_outputs', /exactly one/],
    ['/v1/chat/completions', { messages, response_format: { type: 'json_object' }, structured_outputs: { regex: 'a' } }, 'structured_outputs', /not both/],
    ['/v1/chat/completions', { messages, tools: [{ ...WEATHER_TOOL, function: { ...WEATHER_TOOL.function, parameters: { type: 'object', properties: {} }, strict: true } }] }, 'tools[0].function.parameters', /additionalProperties/],
  ];
  for (const [route, body, param, message] of refusals) {
    const response = await postJson(hermes, route, body);
    assert.equal(response.status, 400, JSON.stringify(body));
    assert.equal(response.body.error.param, param, JSON.stringify(response.body));
    assert.match(response.body.error.message, message);
  }
});

test('a constraint the worker refuses (an unsupported keyword) is a 400 naming it, before any output', async () => {
  script = { steps: [], error: { code: 'invalid_request', message: 'The JSON schema keyword "uniqueItems" is not supported (at #/properties/a)' } };
  for (const stream of [false, true]) {
    const response = await hermes.post('/v1/chat/completions', {
      model: LONG_MODEL_NAME, messages, stream, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { a: { type: 'array', uniqueItems: true } } } } },
    });
    assert.equal(response.status, 400);
    const { error } = (await response.json()) as { error: { message: string; code: string } };
    assert.equal(error.code, 'invalid_request');
    assert.match(error.message, /"uniqueItems" is not supported \(at #\/properties\/a\)/);
  }
});

test('the SDK\'s parse helpers: chat.completions.parse with zodResponseFormat, a forced zodFunction call, responses.parse with zodTextFormat', async () => {
  const Person = z.object({ name: z.string(), age: z.number().int() });
  say(hermes, '{"name": "Ada", "age": 36}');
  const parsed = await hermesClient.chat.completions.parse({ model: LONG_MODEL_NAME, messages: [{ role: 'user', content: 'Who?' }], response_format: zodResponseFormat(Person, 'person') });
  assert.deepEqual(parsed.choices[0].message.parsed, { name: 'Ada', age: 36 });
  assert.equal(lastRequest(hermes).structuredOutput!.constraint.kind, 'json_schema');

  say(hermes, CALL_TEXT);
  const forced = await hermesClient.chat.completions.parse({
    model: LONG_MODEL_NAME,
    messages: [{ role: 'user', content: 'Weather?' }],
    tools: [zodFunction({ name: 'get_weather', parameters: z.object({ city: z.string() }) })],
    tool_choice: 'required',
  });
  assert.deepEqual((forced.choices[0].message.tool_calls![0] as { function: { parsed_arguments: unknown } }).function.parsed_arguments, { city: 'Oslo' });

  say(hermes, '{"name": "Ada", "age": 36}');
  const response = await hermesClient.responses.parse({ model: LONG_MODEL_NAME, input: 'Who?', text: { format: zodTextFormat(Person, 'person') } });
  assert.deepEqual(response.output_parsed, { name: 'Ada', age: 36 });
  assert.equal(lastRequest(hermes).structuredOutput!.constraint.kind, 'json_schema');
});

test('reasoning (Qwen3): reasoning_content apart from content, streamed or not; a grammar applies after </think>', async () => {
  say(qwen3, '<think>\nThey want JSON.\n</think>\n\n{"a": 1}');
  const { body } = await postJson(qwen3, '/v1/chat/completions', { messages, response_format: { type: 'json_object' } });
  assert.deepEqual(body.choices[0].message, { role: 'assistant', content: '{"a": 1}', reasoning_content: '\nThey want JSON.\n' });
  assert.equal(lastRequest(qwen3).structuredOutput!.constrainAfter, '</think>');
  const chunks = await postStream(qwen3, '/v1/chat/completions', { messages, response_format: { type: 'json_object' } });
  const reasoning = chunks.map((chunk) => chunk.choices[0].delta.reasoning_content ?? '').join('');
  const content = chunks.map((chunk) => chunk.choices[0].delta.content ?? '').join('');
  assert.equal(reasoning, '\nThey want JSON.\n');
  assert.equal(content, '{"a": 1}');
  // A template that closed the think section already: the grammar applies at once.
  say(hermes, '{"a": 1}');
  await postJson(hermes, '/v1/chat/completions', { messages, response_format: { type: 'json_object' } });
  assert.equal(lastRequest(hermes).structuredOutput!.constrainAfter, undefined);
});

test('Responses: a function_call item, streamed as OpenAI streams it; the call and its output continue the conversation', async () => {
  const tool = { type: 'function' as const, name: 'get_weather', parameters: WEATHER_TOOL.function.parameters, strict: true };
  say(hermes, CALL_TEXT);
  const first = await hermesClient.responses.create({ model: LONG_MODEL_NAME, input: 'Weather in Oslo?', tools: [tool], tool_choice: 'required' });
  assert.equal(first.status, 'completed');
  assert.equal(first.output.length, 1);
  const call = first.output[0] as OpenAI.Responses.ResponseFunctionToolCall;
  assert.equal(call.type, 'function_call');
  assert.equal(call.name, 'get_weather');
  assert.equal(call.arguments, '{"city": "Oslo"}');
  assert.match(call.call_id, /^call_/);
  assert.match(call.id!, /^fc_/);
  assert.deepEqual(first.tools.map((each) => (each as { name: string }).name), ['get_weather']);
  assert.equal(first.tool_choice, 'required');
  assert.equal(lastRequest(hermes).structuredOutput!.constraint.kind, 'structural_tag');

  say(hermes, 'Sunny in Oslo.');
  const second = await hermesClient.responses.create({
    model: LONG_MODEL_NAME, previous_response_id: first.id, tools: [tool], input: [{ type: 'function_call_output', call_id: call.call_id, output: '21 C, sunny' }],
  });
  assert.equal(second.output_text, 'Sunny in Oslo.');
  const prompt = lastPrompt(hermes);
  assert.ok(prompt.includes('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'), prompt);
  assert.ok(prompt.includes('<tool_response>\n21 C, sunny\n</tool_response>'), prompt);

  say(hermes, `Checking.\n${CALL_TEXT}`);
  const events = namedEvents(await (await hermes.post('/v1/responses', { model: LONG_MODEL_NAME, input: 'Weather?', tools: [tool], stream: true })).text());
  assert.deepEqual(
    [...new Set(events.map((event) => event.type))],
    [
      'response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added', 'response.output_text.delta',
      'response.output_text.done', 'response.content_part.done', 'response.output_item.done', 'response.function_call_arguments.delta',
      'response.function_call_arguments.done', 'response.completed',
    ],
  );
  const added = events.filter((event) => event.type === 'response.output_item.added').map((event) => [event.output_index, event.item.type, event.item.arguments]);
  assert.deepEqual(added, [[0, 'message', undefined], [1, 'function_call', '']]);
  const args = events.filter((event) => event.type === 'response.function_call_arguments.delta').map((event) => event.delta).join('');
  const done = events.find((event) => event.type === 'response.function_call_arguments.done')!;
  assert.equal(args, '{"city": "Oslo"}');
  assert.equal(done.arguments, args);
  const completed = events.at(-1)!.response;
  assert.deepEqual(completed.output.map((item: { type: string }) => item.type), ['message', 'function_call']);
  assert.equal(completed.output[0].content[0].text, 'Checking.');
});

test('Responses: a reasoning item before the message; text.format json_schema; WebSocket mode calls tools too', async () => {
  say(qwen3, '<think>Short.</think>\n\nHello.');
  const response = await new OpenAI({ baseURL: `${qwen3.baseUrl}/v1`, apiKey: 'unused', maxRetries: 0 }).responses.create({ model: LONG_MODEL_NAME, input: 'Hi' });
  assert.deepEqual(response.output.map((item) => item.type), ['reasoning', 'message']);
  assert.deepEqual((response.output[0] as OpenAI.Responses.ResponseReasoningItem).content, [{ type: 'reasoning_text', text: 'Short.' }]);
  assert.equal(response.output_text, 'Hello.');
  assert.ok(response.usage!.output_tokens_details.reasoning_tokens > 0);

  say(hermes, '{"a": 1}');
  const schema = { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'], additionalProperties: false };
  const formatted = await hermesClient.responses.create({ model: LONG_MODEL_NAME, input: 'x', text: { format: { type: 'json_schema', name: 'obj', schema, strict: true } } });
  assert.equal(formatted.output_text, '{"a": 1}');
  assert.deepEqual(formatted.text?.format, { type: 'json_schema', name: 'obj', schema, strict: true });
  assert.deepEqual(lastRequest(hermes).structuredOutput!.constraint, { kind: 'json_schema', schema: JSON.stringify(schema) });

  say(hermes, CALL_TEXT);
  const rws = new ResponsesWS(hermesClient);
  rws.on('error', () => {});
  try {
    await new Promise<void>((resolve, reject) => {
      rws.socket.once('open', () => resolve());
      rws.socket.once('error', reject);
    });
    const completed = new Promise<OpenAI.Responses.Response>((resolve) => {
      rws.on('event', (event) => {
        if (event.type === 'response.completed') resolve(event.response);
      });
    });
    rws.send({ type: 'response.create', model: LONG_MODEL_NAME, input: 'Weather?', tools: [{ type: 'function', name: 'get_weather', parameters: WEATHER_TOOL.function.parameters, strict: true }], tool_choice: { type: 'function', name: 'get_weather' } } as never);
    const result = await completed;
    assert.deepEqual(result.output.map((item) => [item.type, (item as { name?: string }).name]), [['function_call', 'get_weather']]);
  } finally {
    rws.close();
  }
});

/** The data of each `event: ...\ndata: ...` block of a Responses SSE body. */
function namedEvents(body: string): Record<string, any>[] {
  return body
    .split('\n\n')
    .filter((block) => block !== '')
    .map((block) => JSON.parse(block.slice(block.indexOf('data: ') + 'data: '.length)));
}
