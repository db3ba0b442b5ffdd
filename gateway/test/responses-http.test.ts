// POST /v1/responses (JSON and SSE), GET and DELETE /v1/responses/{id}, through the official SDK
// and a raw reader, over a real gateway on a scripted engine.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import http from 'node:http';
import { after, before, test } from 'node:test';
import OpenAI from 'openai';
import type { ResponseStreamEvent } from 'openai/resources/responses/responses';
import { within } from '../../test/wait.ts';
import { MODEL_NAME, oneTokenPerStep, startTestGateway, type TestGateway } from './harness.ts';
import type { Script } from './scripted-engine.ts';

let gateway: TestGateway;
let client: OpenAI;
let script: Script = { steps: [] };
before(async () => {
  gateway = await startTestGateway(() => script);
  client = new OpenAI({ baseURL: `${gateway.baseUrl}/v1`, apiKey: 'unused', maxRetries: 0 });
});
after(() => gateway.close());

const STREAM_EVENT_TYPES = [
  'response.created',
  'response.in_progress',
  'response.output_item.added',
  'response.content_part.added',
];

/** The prompt the engine was last asked for, as text. */
function lastPrompt(): string {
  return gateway.tokenizer.decode(gateway.engine.requests.at(-1)!.promptTokenIds, { skipSpecialTokens: false });
}

/** Named SSE events, each checked for OpenAI's framing: `event: <type>` matching the data's type, compact JSON. */
function namedSseEvents(body: string): { type: string; sequence_number: number }[] {
  assert.ok(body.endsWith('\n\n'), 'the stream ends with a blank line');
  return body.slice(0, -2).split('\n\n').map((record) => {
    const match = /^event: ([a-z_.]+)\ndata: (.*)$/s.exec(record);
    assert.ok(match, `an SSE record with an event line: ${JSON.stringify(record.slice(0, 80))}`);
    const data = JSON.parse(match[2]);
    assert.equal(JSON.stringify(data), match[2]);
    assert.equal(data.type, match[1]);
    return data;
  });
}

test('a response through the SDK: one assistant message, exact usage, stored for GET', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens('Grüße 👋 aus Köln')), finishReason: 'stop', numCachedTokens: 3 };
  const response = await client.responses.create({ model: MODEL_NAME, input: 'Say hello', instructions: 'Be brief.', metadata: { run: '7' } });
  assert.match(response.id, /^resp_[0-9a-f]{32}$/);
  assert.equal(response.object, 'response');
  assert.equal(response.status, 'completed');
  assert.equal(response.output_text, 'Grüße 👋 aus Köln');
  assert.equal(response.output.length, 1);
  const message = response.output[0] as OpenAI.Responses.ResponseOutputMessage;
  assert.equal(message.type, 'message');
  assert.equal(message.role, 'assistant');
  assert.equal(message.status, 'completed');
  assert.match(message.id, /^msg_[0-9a-f]{32}$/);
  assert.deepEqual(message.content, [{ type: 'output_text', text: 'Grüße 👋 aus Köln', annotations: [], logprobs: [] }]);
  assert.equal(lastPrompt(), '<|system|>Be brief.<|endoftext|><|user|>Say hello<|endoftext|><|assistant|>');
  const numInputTokens = gateway.engine.requests.at(-1)!.promptTokenIds.length;
  const numOutputTokens = gateway.tokens('Grüße 👋 aus Köln').length;
  assert.deepEqual(response.usage, {
    input_tokens: numInputTokens,
    input_tokens_details: { cached_tokens: 3 },
    output_tokens: numOutputTokens,
    output_tokens_details: { reasoning_tokens: 0 },
    total_tokens: numInputTokens + numOutputTokens,
  });
  assert.equal(response.incomplete_details, null);
  assert.equal(response.error, null);
  assert.equal(response.instructions, 'Be brief.');
  assert.deepEqual(response.metadata, { run: '7' });
  // OpenAI sends store; the SDK's type leaves it out.
  assert.equal((response as unknown as { store: boolean }).store, true);
  assert.equal(response.model, MODEL_NAME);
  const retrieved = await client.responses.retrieve(response.id);
  assert.deepEqual({ ...retrieved, output_text: undefined }, { ...response, output_text: undefined });
});

test('a streamed response: every event in order, numbered from 0, framed as named SSE events', async () => {
  const text = 'Hello world, again';
  script = { steps: oneTokenPerStep(gateway.tokens(text)), finishReason: 'stop' };
  const stream = await client.responses.create({ model: MODEL_NAME, input: 'hi', stream: true });
  const events: ResponseStreamEvent[] = [];
  for await (const event of stream) events.push(event);
  const numDeltas = gateway.tokens(text).length;
  assert.deepEqual(events.map((event) => event.type), [
    ...STREAM_EVENT_TYPES,
    ...Array<string>(numDeltas).fill('response.output_text.delta'),
    'response.output_text.done',
    'response.content_part.done',
    'response.output_item.done',
    'response.completed',
  ]);
  assert.deepEqual(events.map((event) => event.sequence_number), events.map((_, i) => i));
  const created = events[0] as OpenAI.Responses.ResponseCreatedEvent;
  assert.equal(created.response.status, 'in_progress');
  assert.deepEqual(created.response.output, []);
  assert.equal(created.response.usage, null);
  const added = events[2] as OpenAI.Responses.ResponseOutputItemAddedEvent;
  const itemId = added.item.id!;
  assert.deepEqual(added.item, { id: itemId, type: 'message', status: 'in_progress', role: 'assistant', content: [] });
  const deltas = events.filter((event) => event.type === 'response.output_text.delta');
  assert.equal(deltas.map((event) => event.delta).join(''), text);
  for (const delta of deltas) {
    assert.deepEqual(
      { ...delta, delta: '', sequence_number: 0 },
      { type: 'response.output_text.delta', sequence_number: 0, item_id: itemId, output_index: 0, content_index: 0, delta: '', logprobs: [] },
    );
  }
  const textDone = events.at(-4) as OpenAI.Responses.ResponseTextDoneEvent;
  assert.equal(textDone.text, text);
  const itemDone = events.at(-2) as OpenAI.Responses.ResponseOutputItemDoneEvent;
  assert.deepEqual(itemDone.item, { id: itemId, type: 'message', status: 'completed', role: 'assistant', content: [{ type: 'output_text', text, annotations: [], logprobs: [] }] });
  const completed = events.at(-1) as OpenAI.Responses.ResponseCompletedEvent;
  assert.equal(completed.response.id, created.response.id);
  assert.equal(completed.response.status, 'completed');
  assert.equal(completed.response.usage?.output_tokens, numDeltas);
  assert.equal(completed.response.usage?.input_tokens, gateway.engine.requests.at(-1)!.promptTokenIds.length);
  assert.deepEqual(completed.response.output, [itemDone.item]);

  // The same stream read raw: named events, no [DONE].
  const raw = await gateway.post('/v1/responses', { model: MODEL_NAME, input: 'hi', stream: true });
  assert.equal(raw.headers.get('content-type'), 'text/event-stream; charset=utf-8');
  const rawEvents = namedSseEvents(await raw.text());
  assert.deepEqual(rawEvents.map((event) => event.type), events.map((event) => event.type));
});

test('max_output_tokens cuts a response: incomplete, with its reason, streamed or not', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens('one two three')), finishReason: 'length' };
  const response = await client.responses.create({ model: MODEL_NAME, input: 'count', max_output_tokens: 3 });
  assert.equal(gateway.engine.requests.at(-1)!.sampling.maxTokens, 3);
  assert.equal(response.status, 'incomplete');
  assert.deepEqual(response.incomplete_details, { reason: 'max_output_tokens' });
  assert.equal(response.max_output_tokens, 3);
  assert.equal((response.output[0] as OpenAI.Responses.ResponseOutputMessage).status, 'incomplete');
  assert.equal(response.output_text, 'one two three');

  const stream = await client.responses.create({ model: MODEL_NAME, input: 'count', max_output_tokens: 3, stream: true });
  const events: ResponseStreamEvent[] = [];
  for await (const event of stream) events.push(event);
  const last = events.at(-1) as OpenAI.Responses.ResponseIncompleteEvent;
  assert.equal(last.type, 'response.incomplete');
  assert.equal(last.response.status, 'incomplete');
  assert.deepEqual(last.response.incomplete_details, { reason: 'max_output_tokens' });
});

test('an error before any output is a plain HTTP error, streamed or not', async () => {
  script = { steps: [[]], error: { code: 'kv_cache_too_small', message: 'the prompt needs 9 blocks' } };
  for (const stream of [false, true]) {
    await assert.rejects(client.responses.create({ model: MODEL_NAME, input: 'hi', stream }), (error: unknown) => {
      assert.ok(error instanceof OpenAI.BadRequestError);
      assert.equal(error.code, 'kv_cache_too_small');
      return true;
    });
  }
});

const INTERNAL_ERROR_MESSAGE = 'The server failed while running the request.';

test('an error after output: an error event, then response.failed, stored as failed', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens('Hello world')), error: { code: 'internal_error', message: 'the runner failed' } };
  // The SDK raises the error event.
  const stream = await client.responses.create({ model: MODEL_NAME, input: 'hi', stream: true });
  await assert.rejects(
    (async () => {
      for await (const _event of stream);
    })(),
    // The worker's own text stays in the log: the client gets the catalogue's fixed message.
    (error: unknown) => error instanceof OpenAI.APIError && error.code === 'internal_error' && /The server failed while running/.test(error.message),
  );
  const raw = await gateway.post('/v1/responses', { model: MODEL_NAME, input: 'hi', stream: true });
  const events = namedSseEvents(await raw.text()) as unknown as Record<string, any>[];
  const [error, failed] = events.slice(-2);
  assert.deepEqual(error, {
    type: 'error',
    sequence_number: events.length - 2,
    status: 500,
    code: 'internal_error',
    message: INTERNAL_ERROR_MESSAGE,
    param: null,
    error: { message: INTERNAL_ERROR_MESSAGE, type: 'server_error', param: null, code: 'internal_error' },
  });
  assert.equal(failed.type, 'response.failed');
  assert.equal(failed.response.status, 'failed');
  assert.deepEqual(failed.response.error, { code: 'server_error', message: INTERNAL_ERROR_MESSAGE });
  // The worker's failing step carried ' world'; a failed step's tokens are not output.
  assert.equal(failed.response.output[0].content[0].text, 'Hello');
  const stored = await client.responses.retrieve(failed.response.id);
  assert.equal(stored.status, 'failed');
});

test('previous_response_id continues the conversation: turn 2 is prompted with turn 1 input and output', async () => {
  script = { steps: [gateway.tokens('Paris.')], finishReason: 'stop' };
  const first = await client.responses.create({ model: MODEL_NAME, input: 'Capital of France?', instructions: 'Answer.' });
  script = { steps: [gateway.tokens('Berlin.')], finishReason: 'stop' };
  const second = await client.responses.create({ model: MODEL_NAME, input: 'And Germany?', previous_response_id: first.id });
  assert.equal(second.previous_response_id, first.id);
  // Instructions are the turn's own: the first turn's are not carried over.
  assert.equal(lastPrompt(), '<|user|>Capital of France?<|endoftext|><|assistant|>Paris.<|endoftext|><|user|>And Germany?<|endoftext|><|assistant|>');
  script = { steps: [gateway.tokens('Rome.')], finishReason: 'stop' };
  await client.responses.create({ model: MODEL_NAME, input: [{ role: 'user', content: [{ type: 'input_text', text: 'Italy?' }] }], previous_response_id: second.id, instructions: 'Be short.' });
  assert.equal(
    lastPrompt(),
    '<|system|>Be short.<|endoftext|><|user|>Capital of France?<|endoftext|><|assistant|>Paris.<|endoftext|>' +
      '<|user|>And Germany?<|endoftext|><|assistant|>Berlin.<|endoftext|><|user|>Italy?<|endoftext|><|assistant|>',
  );
});

test('input items: messages of every role, and history sent in full', async () => {
  script = { steps: [gateway.tokens('ok')], finishReason: 'stop' };
  await client.responses.create({
    model: MODEL_NAME,
    input: [
      { role: 'developer', content: 'Rules.' },
      { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'A' }, { type: 'input_text', text: 'B' }] },
      { type: 'message', role: 'assistant', id: 'msg_1', status: 'completed', content: [{ type: 'output_text', text: 'C', annotations: [] }] },
      { role: 'user', content: 'D' },
    ],
  });
  assert.equal(lastPrompt(), '<|system|>Rules.<|endoftext|><|user|>AB<|endoftext|><|assistant|>C<|endoftext|><|user|>D<|endoftext|><|assistant|>');
});

test('store: false is neither retrievable nor continuable; unknown ids are 404s; DELETE removes', async () => {
  script = { steps: [gateway.tokens('x')], finishReason: 'stop' };
  const unstored = await client.responses.create({ model: MODEL_NAME, input: 'hi', store: false });
  assert.equal((unstored as unknown as { store: boolean }).store, false);
  await assert.rejects(client.responses.retrieve(unstored.id), (error: unknown) => {
    assert.ok(error instanceof OpenAI.NotFoundError);
    assert.equal(error.code, 'response_not_found');
    assert.equal(error.message, `404 Response with id '${unstored.id}' not found.`);
    return true;
  });
  await assert.rejects(client.responses.create({ model: MODEL_NAME, input: 'hi', previous_response_id: unstored.id }), (error: unknown) => {
    assert.ok(error instanceof OpenAI.BadRequestError);
    assert.equal(error.code, 'previous_response_not_found');
    assert.equal(error.param, 'previous_response_id');
    return true;
  });

  const stored = await client.responses.create({ model: MODEL_NAME, input: 'hi' });
  const deletion = await (await fetch(`${gateway.baseUrl}/v1/responses/${stored.id}`, { method: 'DELETE' })).json();
  assert.deepEqual(deletion, { id: stored.id, object: 'response', deleted: true });
  await assert.rejects(client.responses.retrieve(stored.id), OpenAI.NotFoundError);
  await assert.rejects(client.responses.delete(stored.id), OpenAI.NotFoundError);
});

test('invalid requests are 400s naming the parameter; the server keeps serving', async () => {
  const cases: [body: Record<string, unknown>, code: string, param: string | null][] = [
    [{ input: 'hi', temperature: 5 }, 'invalid_request', 'temperature'],
    [{ input: 5 }, 'invalid_request', 'input'],
    [{}, 'invalid_request', 'input'],
    [{ input: [] }, 'invalid_request', 'input'],
    [{ input: [{ role: 'bob', content: 'x' }] }, 'invalid_request', 'input[0].role'],
    [{ input: [{ role: 'user', content: 'x' }, { role: 'user', content: 7 }] }, 'invalid_request', 'input[1].content'],
    [{ input: [{ type: 'function_call', call_id: 'c', name: 'f' }] }, 'invalid_request', 'input[0].arguments'],
    [{ input: [{ type: 'function_call_output', call_id: 'nope', output: 'x' }] }, 'invalid_request', 'input[0].call_id'],
    [{ input: [{ role: 'user', content: [{ type: 'input_text', text: 'x' }, { type: 'input_image', image_url: 'http://x/y.png' }] }] }, 'unsupported_parameter', 'input[0].content[1]'],
    [{ input: [{ type: 'image_generation_call', id: 'x' }] }, 'unsupported_parameter', 'input[0].type'],
    [{ input: 'hi', tools: [{ type: 'web_search' }] }, 'unsupported_parameter', 'tools[0].type'],
    [{ input: 'hi', tools: [{ type: 'function', name: 'f f' }] }, 'invalid_request', 'tools[0].name'],
    [{ input: 'hi', tool_choice: 'required' }, 'invalid_request', 'tool_choice'],
    [{ input: 'hi', reasoning: { effort: 'high' } }, 'unsupported_parameter', 'reasoning'],
    [{ input: 'hi', text: { format: { type: 'xml' } } }, 'invalid_request', 'text.format.type'],
    [{ input: 'hi', text: { format: { type: 'json_schema', name: 'x', schema: { type: 'strin' } } } }, 'invalid_request', 'text.format.schema'],
    [{ input: 'hi', truncation: 'sometimes' }, 'invalid_request', 'truncation'],
    [{ input: 'hi', truncation: 'auto', max_output_tokens: 1000 }, 'context_length_exceeded', 'max_output_tokens'],
    [{ input: 'hi', background: true }, 'unsupported_parameter', 'background'],
    [{ input: 'hi', conversation: 'conv_1' }, 'unsupported_parameter', 'conversation'],
    [{ input: 'hi', top_logprobs: 2 }, 'invalid_request', 'top_logprobs'],
    [{ input: 'hi', max_output_tokens: 0 }, 'invalid_request', 'max_output_tokens'],
    [{ input: 'hi', max_output_tokens: 1000 }, 'context_length_exceeded', 'max_output_tokens'],
    [{ input: 'hi', metadata: Object.fromEntries(Array.from({ length: 17 }, (_, i) => [`k${i}`, 'v'])) }, 'invalid_request', 'metadata'],
    [{ input: 'hi', stop: ['a', 'b', 'c', 'd', 'e'] }, 'invalid_request', 'stop'],
    [{ input: 'hi', model: undefined }, 'invalid_request', 'model'],
  ];
  for (const [body, code, param] of cases) {
    const response = await gateway.post('/v1/responses', { model: MODEL_NAME, ...body });
    const { error } = (await response.json()) as { error: { code: string; param: string | null; type: string; message: string } };
    assert.equal(response.status, 400, JSON.stringify(body));
    assert.deepEqual({ code: error.code, param: error.param }, { code, param }, JSON.stringify(body));
    assert.equal(error.type, 'invalid_request_error');
  }
  const unknownModel = await gateway.post('/v1/responses', { model: 'nope', input: 'hi' });
  assert.equal(unknownModel.status, 404);
  assert.equal(((await unknownModel.json()) as { error: { code: string } }).error.code, 'model_not_found');
  const plainGet = await fetch(`${gateway.baseUrl}/v1/responses`);
  assert.equal(plainGet.status, 404);
  assert.equal(((await plainGet.json()) as { error: { code: string } }).error.code, 'route_not_found');

  script = { steps: [gateway.tokens('still here')], finishReason: 'stop' };
  const response = await client.responses.create({ model: MODEL_NAME, input: 'hi' });
  assert.equal(response.output_text, 'still here');
});

test('sampling parameters and vLLM extensions reach the engine; a stop string ends the text', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens('Hello world and more')), finishReason: 'length' };
  const response = await client.responses.create({
    model: MODEL_NAME,
    input: 'hi',
    temperature: 0.5,
    top_p: 0.9,
    max_output_tokens: 10,
    // vLLM's extensions, which the SDK's types do not know.
    ...{ top_k: 5, seed: 7, stop: [' world'], cache_salt: 'tenant-a', priority: 2 },
  });
  assert.equal(response.output_text, 'Hello');
  assert.equal(response.status, 'completed');
  assert.equal(response.temperature, 0.5);
  assert.equal(response.top_p, 0.9);
  const request = gateway.engine.requests.at(-1)!;
  assert.deepEqual(
    { ...request.sampling },
    { maxTokens: 10, temperature: 0.5, topP: 0.9, topK: 5, seed: 7n },
  );
  assert.equal(request.cacheSalt, 'tenant-a');
  assert.equal(request.priority, 2);
  // The stop string ended the request in the worker too.
  assert.ok(gateway.engine.abortedRequestIds.includes(request.requestId));
});

test('include message.output_text.logprobs: each delta carries its tokens, the text part all of them', async () => {
  const tokenIds = gateway.tokens('Hi there');
  script = { steps: oneTokenPerStep(tokenIds), finishReason: 'stop' };
  const stream = await client.responses.create({
    model: MODEL_NAME, input: 'hi', stream: true, include: ['message.output_text.logprobs'], top_logprobs: 2,
  });
  const deltas: OpenAI.Responses.ResponseTextDeltaEvent[] = [];
  let completed: OpenAI.Responses.Response | null = null;
  for await (const event of stream) {
    if (event.type === 'response.output_text.delta') deltas.push(event);
    if (event.type === 'response.completed') completed = event.response;
  }
  assert.equal(gateway.engine.requests.at(-1)!.sampling.numTopLogprobs, 2);
  assert.deepEqual(deltas.map((delta) => delta.logprobs.length), tokenIds.map(() => 1));
  const first = deltas[0].logprobs[0];
  assert.equal(first.token, 'Hi');
  assert.equal(first.logprob, -0.25);
  assert.equal(first.top_logprobs?.length, 2);
  const part = (completed!.output[0] as OpenAI.Responses.ResponseOutputMessage).content[0] as OpenAI.Responses.ResponseOutputText;
  assert.deepEqual(part.logprobs, deltas.flatMap((delta) => delta.logprobs));
  assert.equal(completed!.top_logprobs, 2);
  // Stored with them as typed arrays: GET gives back the same object, log-probabilities included.
  const retrieved = await client.responses.retrieve(completed!.id);
  assert.deepEqual({ ...retrieved, output_text: undefined }, { ...completed!, output_text: undefined });
  const nonStreamed = await client.responses.create({ model: MODEL_NAME, input: 'hi', include: ['message.output_text.logprobs'], top_logprobs: 2 });
  assert.deepEqual((nonStreamed.output[0] as OpenAI.Responses.ResponseOutputMessage).content, completed!.output[0].type === 'message' ? completed!.output[0].content : []);
});

test('a client that disconnects mid-stream aborts its response in the worker', { timeout: 10_000 }, async () => {
  script = { steps: [gateway.tokens('Hello')], hang: true };
  const controller = new AbortController();
  const response = await fetch(`${gateway.baseUrl}/v1/responses`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL_NAME, input: 'hi', stream: true }),
    signal: controller.signal,
  });
  const reader = response.body!.getReader();
  let received = '';
  while (!received.includes('response.output_text.delta')) {
    const { value, done } = await reader.read();
    // An ended stream reads done at once, forever: a loop over it would never yield to a timeout.
    assert.ok(!done, `the stream ended before its first delta: ${received}`);
    received += new TextDecoder().decode(value);
  }
  const aborted = once(gateway.engine, 'abort');
  controller.abort();
  const [requestId] = await aborted;
  assert.equal(requestId, gateway.engine.requests.at(-1)!.requestId);
  assert.equal(gateway.engine.numInFlight, 0);
});

test('requests count in conduit_http_requests_total under /v1/responses', async () => {
  const text = await (await fetch(`${gateway.metricsUrl}/metrics`)).text();
  assert.match(text, /conduit_http_requests_total\{endpoint="\/v1\/responses",status_code="200"\} \d+/);
  assert.match(text, /conduit_http_requests_total\{endpoint="\/v1\/responses",status_code="400"\} \d+/);
  assert.match(text, /conduit_http_requests_total\{endpoint="\/v1\/responses\/:id",status_code="404"\} \d+/);
});

test('function calls and their outputs render as an assistant tool call and a tool message', async () => {
  const toolTemplate =
    '{% for m in messages %}{{ m.role }}:{{ m.content }}' +
    '{% if m.tool_calls %}{% for c in m.tool_calls %}[{{ c.id }} {{ c.function.name }} {{ c.function.arguments | tojson }}]{% endfor %}{% endif %}' +
    '{% if m.tool_call_id %}({{ m.tool_call_id }} {{ m.name }}){% endif %};{% endfor %}' +
    '{% if add_generation_prompt %}assistant:{% endif %}';
  const toolGateway = await startTestGateway(() => ({ steps: [toolGateway.tokens('Sunny.')], finishReason: 'stop' }), { chatTemplate: toolTemplate });
  try {
    const toolClient = new OpenAI({ baseURL: `${toolGateway.baseUrl}/v1`, apiKey: 'unused', maxRetries: 0 });
    const response = await toolClient.responses.create({
      model: MODEL_NAME,
      input: [
        { role: 'user', content: 'Weather?' },
        { type: 'function_call', call_id: 'c1', name: 'weather', arguments: '{"city":"Oslo"}' },
        { type: 'function_call', call_id: 'c2', name: 'time', arguments: 'now' },
        { type: 'function_call_output', call_id: 'c1', output: 'sun' },
        { type: 'function_call_output', call_id: 'c2', output: [{ type: 'input_text', text: 'noon' }] },
      ],
    });
    assert.equal(response.output_text, 'Sunny.');
    const prompt = toolGateway.tokenizer.decode(toolGateway.engine.requests.at(-1)!.promptTokenIds, { skipSpecialTokens: false });
    assert.equal(
      prompt,
      'user:Weather?;assistant:[c1 weather {"city": "Oslo"}][c2 time "now"];tool:sun(c1 weather);tool:noon(c2 time);assistant:',
    );
  } finally {
    await toolGateway.close();
  }
});

test('the store holds at most its number of responses, each for its time', async () => {
  const small = await startTestGateway(() => ({ steps: [[32]], finishReason: 'stop' }), { responses: { storeMaxResponses: 2, storeTtlMs: 400 } });
  try {
    const smallClient = new OpenAI({ baseURL: `${small.baseUrl}/v1`, apiKey: 'unused', maxRetries: 0 });
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) ids.push((await smallClient.responses.create({ model: MODEL_NAME, input: `turn ${i}` })).id);
    // Past the bound, the oldest left first.
    await assert.rejects(smallClient.responses.retrieve(ids[0]), OpenAI.NotFoundError);
    assert.equal((await smallClient.responses.retrieve(ids[1])).id, ids[1]);
    assert.equal((await smallClient.responses.retrieve(ids[2])).id, ids[2]);
    await new Promise((resolve) => setTimeout(resolve, 500));
    await assert.rejects(smallClient.responses.retrieve(ids[2]), OpenAI.NotFoundError);
    await assert.rejects(
      smallClient.responses.create({ model: MODEL_NAME, input: 'more', previous_response_id: ids[2] }),
      (error: unknown) => error instanceof OpenAI.BadRequestError && error.code === 'previous_response_not_found',
    );
  } finally {
    await small.close();
  }
});

test('an empty answer still takes its turn in the conversation', async () => {
  script = { steps: [[]], finishReason: 'stop' };
  const first = await client.responses.create({ model: MODEL_NAME, input: 'Say nothing' });
  assert.equal(first.output_text, '');
  script = { steps: [gateway.tokens('ok')], finishReason: 'stop' };
  await client.responses.create({ model: MODEL_NAME, input: 'Now?', previous_response_id: first.id });
  assert.equal(lastPrompt(), '<|user|>Say nothing<|endoftext|><|assistant|><|endoftext|><|user|>Now?<|endoftext|><|assistant|>');
});

test("a slow SSE reader's response is cancelled at the buffer bound, ending with client_too_slow", { timeout: 60_000 }, async () => {
  const maxBufferedBytes = 64 * 1024;
  // Far more than the socket buffers on both ends hold: about 30 MB of events.
  const flood: Script = { steps: Array<number[]>(40_000).fill(Array<number>(100).fill(15496)) };
  const slowGateway = await startTestGateway(() => flood, { responses: { maxBufferedBytes } });
  try {
    const aborted = once(slowGateway.engine, 'abort');
    const request = http.request(`${slowGateway.baseUrl}/v1/responses`, { method: 'POST', headers: { 'content-type': 'application/json' } });
    request.end(JSON.stringify({ model: MODEL_NAME, input: 'flood', stream: true }));
    const [response] = (await once(request, 'response')) as [http.IncomingMessage];
    await once(response, 'data');
    response.pause();
    const [requestId] = await aborted;
    assert.equal(requestId, slowGateway.engine.requests[0].requestId);

    // Reading again: what was queued, then the error, then the end.
    let numBytes = 0;
    let tail = '';
    response.on('data', (chunk: Buffer) => {
      numBytes += chunk.length;
      tail = (tail + chunk.toString()).slice(-2000);
    });
    response.resume();
    await once(response, 'end');
    const lastEvent = tail.slice(tail.lastIndexOf('event: '));
    assert.match(lastEvent, /^event: error\ndata: \{"type":"error","sequence_number":\d+,"status":408,"code":"client_too_slow"/);
    assert.ok(numBytes < 15_000_000, `bytes received: ${numBytes}`);
  } finally {
    await slowGateway.close();
  }
});

test("an SSE reader that takes nothing while a finished response's closing events wait is cut with client_too_slow", { timeout: 60_000 }, async () => {
  // Deltas of about 12 MB (20 alternatives per token) under a 16 MiB bound; the closing events repeat them four times.
  const maxBufferedBytes = 16 * 1024 * 1024;
  const longScript: Script = { steps: Array<number[]>(110).fill(Array<number>(100).fill(15496)), finishReason: 'length' };
  const slowGateway = await startTestGateway(() => longScript, { responses: { maxBufferedBytes, slowReaderGraceMs: 1000 } });
  try {
    const request = http.request(`${slowGateway.baseUrl}/v1/responses`, { method: 'POST', headers: { 'content-type': 'application/json' } });
    request.end(JSON.stringify({ model: MODEL_NAME, input: 'long', stream: true, include: ['message.output_text.logprobs'], top_logprobs: 20 }));
    const [response] = (await once(request, 'response')) as [http.IncomingMessage];
    await once(response, 'data');
    response.pause();
    await new Promise((resolve) => setTimeout(resolve, 4000));
    let tail = '';
    const types = new Set<string>();
    response.on('data', (chunk: Buffer) => {
      tail = (tail + chunk.toString()).slice(-4000);
      for (const match of tail.matchAll(/^event: ([a-z_.]+)$/gm)) types.add(match[1]);
    });
    response.resume();
    await within(once(response, 'end'), 'the end of the stream', 20_000);
    const lastEvent = tail.slice(tail.lastIndexOf('event: '));
    assert.match(lastEvent, /^event: error\ndata: \{"type":"error","sequence_number":\d+,"status":408,"code":"client_too_slow"/);
    assert.ok(!types.has('response.completed') && !types.has('response.incomplete'), [...types].join(', '));
  } finally {
    await slowGateway.close();
  }
});
