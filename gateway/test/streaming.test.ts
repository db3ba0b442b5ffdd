// Chat and text completions over real sockets: SSE framing, usage, stop strings, UTF-8.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import type { Script } from './scripted-engine.ts';
import { MODEL_NAME, oneTokenPerStep, sseEvents, startTestGateway, type TestGateway } from './harness.ts';

let gateway: TestGateway;
let script: Script = { steps: [] };
before(async () => {
  gateway = await startTestGateway(() => script);
});
after(() => gateway.close());

const messages = [{ role: 'user', content: 'Say hello' }];

test('a chat stream is byte-exact OpenAI SSE: role chunk, content chunks, finish chunk, [DONE]', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens('Hello world')), finishReason: 'stop' };
  const response = await gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages, stream: true });
  assert.equal(response.status, 200);
  assert.equal(response.headers.get('content-type'), 'text/event-stream; charset=utf-8');
  const body = await response.text();
  const first = sseEvents(body)[0] as { id: string; created: number };
  assert.match(first.id, /^chatcmpl-[0-9a-f]{32}$/);
  const chunk = (delta: object, finishReason: string | null) =>
    `data: ${JSON.stringify({
      id: first.id,
      object: 'chat.completion.chunk',
      created: first.created,
      model: MODEL_NAME,
      choices: [{ index: 0, delta, logprobs: null, finish_reason: finishReason }],
    })}\n\n`;
  const expected =
    chunk({ role: 'assistant', content: '' }, null) +
    chunk({ content: 'Hello' }, null) +
    chunk({ content: ' world' }, null) +
    chunk({}, 'stop') +
    'data: [DONE]\n\n';
  assert.equal(body, expected);
});

test('include_usage adds a usage chunk with empty choices before [DONE], counting the rendered prompt exactly', async () => {
  const outputIds = gateway.tokens('One two three');
  script = { steps: [outputIds.slice(0, 2), outputIds.slice(2)], finishReason: 'length' };
  const response = await gateway.post('/v1/chat/completions', {
    model: MODEL_NAME,
    messages,
    stream: true,
    stream_options: { include_usage: true },
    max_tokens: 3,
  });
  const events = sseEvents(await response.text());
  assert.equal(events.at(-1), '[DONE]');
  const usageChunk = events.at(-2) as { choices: unknown[]; usage: Record<string, unknown> };
  const finishChunk = events.at(-3) as { choices: { finish_reason: string }[] };
  assert.equal(finishChunk.choices[0].finish_reason, 'length');
  assert.deepEqual(usageChunk.choices, []);
  const renderedPrompt = '<|user|>Say hello<|endoftext|><|assistant|>';
  const numPromptTokens = gateway.tokens(renderedPrompt).length;
  assert.deepEqual(usageChunk.usage, { prompt_tokens: numPromptTokens, completion_tokens: 3, total_tokens: numPromptTokens + 3, prompt_tokens_details: { cached_tokens: 0 } });
  assert.deepEqual(gateway.engine.requests.at(-1)?.promptTokenIds, gateway.tokens(renderedPrompt));
});

test('without include_usage a stream carries no usage', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens('Hi')) };
  const events = sseEvents(await (await gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages, stream: true })).text());
  assert.ok(events.every((event) => event === '[DONE]' || !('usage' in (event as object))));
});

test('a non-streamed chat completion has the OpenAI shape', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens('Hello there')), finishReason: 'stop' };
  const response = await gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages, max_completion_tokens: 10 });
  assert.equal(response.status, 200);
  const body = await response.json();
  assert.match(body.id, /^chatcmpl-/);
  assert.equal(body.object, 'chat.completion');
  assert.equal(typeof body.created, 'number');
  assert.equal(body.model, MODEL_NAME);
  assert.deepEqual(body.choices, [
    { index: 0, message: { role: 'assistant', content: 'Hello there' }, logprobs: null, finish_reason: 'stop' },
  ]);
  const numPromptTokens = gateway.engine.requests.at(-1)!.promptTokenIds.length;
  assert.deepEqual(body.usage, { prompt_tokens: numPromptTokens, completion_tokens: 2, total_tokens: numPromptTokens + 2, prompt_tokens_details: { cached_tokens: 0 } });
  assert.equal(gateway.engine.requests.at(-1)!.sampling.maxTokens, 10);
});

test('sampling parameters and extensions reach the engine', async () => {
  script = { steps: [[0]] };
  await gateway.post('/v1/completions', {
    model: MODEL_NAME,
    prompt: 'x',
    temperature: 0.5,
    top_p: 0.9,
    top_k: -1,
    seed: -1,
    stop_token_ids: [13],
    ignore_eos: true,
    user: 'someone',
    min_p: 0.05,
    presence_penalty: 0.5,
    frequency_penalty: -0.25,
    repetition_penalty: 1.1,
    logit_bias: { '50256': -100, '13': 2.5 },
    min_tokens: 3,
    logprobs: 4,
    prompt_logprobs: 2,
    priority: -5,
    cache_salt: 'tenant-a',
  });
  const request = gateway.engine.requests.at(-1)!;
  assert.deepEqual(request.sampling, {
    maxTokens: 16,
    temperature: 0.5,
    topP: 0.9,
    topK: 0,
    minP: 0.05,
    presencePenalty: 0.5,
    frequencyPenalty: -0.25,
    repetitionPenalty: 1.1,
    logitBias: new Map([[50256, -100], [13, 2.5]]),
    seed: 2n ** 64n - 1n,
    stopTokenIds: [13],
    ignoreEos: true,
    minTokens: 3,
    numTopLogprobs: 4,
    numPromptLogprobs: 2,
  });
  assert.equal(request.priority, -5);
  assert.equal(request.cacheSalt, 'tenant-a');
  // The harness serves its models without deadlines.
  assert.equal(request.queueTimeoutMs, undefined);
  assert.equal(request.timeoutMs, undefined);
});

test('usage reports the prompt tokens the worker found cached, once for all choices', async () => {
  script = { steps: [gateway.tokens(' a')], numCachedTokens: 16 };
  const body = await (await gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages: [{ role: 'user', content: 'hi' }], n: 2 })).json();
  assert.deepEqual(body.usage.prompt_tokens_details, { cached_tokens: 16 });
  const events = sseEvents(
    await (await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x', stream: true, stream_options: { include_usage: true } })).text(),
  ) as { usage?: { prompt_tokens_details: unknown } }[];
  assert.deepEqual(events.at(-2)!.usage!.prompt_tokens_details, { cached_tokens: 16 });
});

test('a text completion, streamed and not, from a string or from token ids', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens(' jumps over')), finishReason: 'length' };
  const whole = await (await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'The fox', max_tokens: 2 })).json();
  assert.match(whole.id, /^cmpl-/);
  assert.equal(whole.object, 'text_completion');
  assert.deepEqual(whole.choices, [{ index: 0, text: ' jumps over', logprobs: null, finish_reason: 'length' }]);
  assert.deepEqual(whole.usage, { prompt_tokens: 2, completion_tokens: 2, total_tokens: 4, prompt_tokens_details: { cached_tokens: 0 } });

  const promptIds = gateway.tokens('The fox');
  const response = await gateway.post('/v1/completions', {
    model: MODEL_NAME,
    prompt: promptIds,
    max_tokens: 2,
    stream: true,
    stream_options: { include_usage: true },
  });
  assert.deepEqual(gateway.engine.requests.at(-1)!.promptTokenIds, promptIds);
  const events = sseEvents(await response.text()) as { object: string; choices: { text: string; finish_reason: string | null }[]; usage?: unknown }[];
  assert.equal(events.pop(), '[DONE]');
  assert.ok(events.every((event) => event.object === 'text_completion'));
  assert.deepEqual(events.at(-1)!.usage, { prompt_tokens: 2, completion_tokens: 2, total_tokens: 4, prompt_tokens_details: { cached_tokens: 0 } });
  assert.deepEqual(events.slice(0, -1).map((event) => event.choices[0]), [
    { index: 0, text: ' jumps', logprobs: null, finish_reason: null },
    { index: 0, text: ' over', logprobs: null, finish_reason: null },
    { index: 0, text: '', logprobs: null, finish_reason: 'length' },
  ]);
});

// Bounded: a broken hold-back misses the stop, and the scripted worker never ends on its own.
test('a stop string split across tokens never leaks, ends with finish_reason stop, and aborts the worker', { timeout: 30_000 }, async () => {
  // "Hello wor" + "ld. More": the stop "world." spans three tokens.
  script = { steps: oneTokenPerStep(gateway.tokens('Hello world. More text')), hang: true };
  const response = await gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages, stream: true, stop: ['world.'] });
  const events = sseEvents(await response.text()) as { choices: { delta: { content?: string }; finish_reason: string | null }[] }[];
  assert.equal(events.pop(), '[DONE]');
  const contents = events.map((event) => event.choices[0].delta.content ?? '');
  assert.equal(contents.join(''), 'Hello ');
  assert.ok(contents.every((content) => !content.includes('w')));
  assert.equal(events.at(-1)!.choices[0].finish_reason, 'stop');
  assert.deepEqual(gateway.engine.abortedRequestIds.at(-1), gateway.engine.requests.at(-1)!.requestId);

  script = { steps: oneTokenPerStep(gateway.tokens('Hello world. More text')), hang: true };
  const whole = await (await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x', stop: 'world.' })).json();
  assert.equal(whole.choices[0].text, 'Hello ');
  assert.equal(whole.choices[0].finish_reason, 'stop');
});

test('a partial stop match is released when generation ends without completing it', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens('Hello wor')), finishReason: 'length' };
  const whole = await (await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x', stop: ['world'] })).json();
  assert.equal(whole.choices[0].text, 'Hello wor');
  assert.equal(whole.choices[0].finish_reason, 'length');
});

test('multi-byte characters split across tokens never reach the client half-done', async () => {
  const text = 'Hi 👋 東京 🎉!';
  const tokenIds = gateway.tokens(text);
  assert.ok(tokenIds.length > [...text].length - 4, 'gpt2 splits these characters across tokens');
  script = { steps: oneTokenPerStep(tokenIds), finishReason: 'stop' };
  const response = await gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages, stream: true });
  const events = sseEvents(await response.text()) as { choices: { delta: { content?: string } }[] }[];
  events.pop();
  const contents = events.map((event) => event.choices[0].delta.content ?? '');
  for (const content of contents) assert.ok(!content.includes('\uFFFD'), `chunk ${JSON.stringify(content)} splits a character`);
  assert.equal(contents.join(''), text);
});

test('the eos token is not part of the text', async () => {
  script = { steps: [gateway.tokens('Done'), [50256]], finishReason: 'stop' };
  const whole = await (await gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages })).json();
  assert.equal(whole.choices[0].message.content, 'Done');
  assert.equal(whole.usage.completion_tokens, 2);
});

test('n choices: one generation each with distinct seeds, the prompt counted once in usage', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens('Same words')), finishReason: 'stop' };
  const numRequestsBefore = gateway.engine.requests.length;
  const whole = await (await gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages, n: 2, seed: 7 })).json();
  const engineRequests = gateway.engine.requests.slice(numRequestsBefore);
  assert.deepEqual(engineRequests.map((request) => request.sampling.seed), [7n, 8n]);
  assert.deepEqual(
    whole.choices.map((choice: { index: number; message: { content: string } }) => [choice.index, choice.message.content]),
    [[0, 'Same words'], [1, 'Same words']],
  );
  const numPromptTokens = engineRequests[0].promptTokenIds.length;
  assert.deepEqual(whole.usage, { prompt_tokens: numPromptTokens, completion_tokens: 4, total_tokens: numPromptTokens + 4, prompt_tokens_details: { cached_tokens: 0 } });

  const response = await gateway.post('/v1/completions', {
    model: MODEL_NAME,
    prompt: 'x',
    n: 2,
    stream: true,
    stream_options: { include_usage: true },
  });
  const events = sseEvents(await response.text()) as { choices: { index: number; text: string; finish_reason: string | null }[]; usage?: { completion_tokens: number } }[];
  assert.equal(events.pop(), '[DONE]');
  assert.equal(events.pop()!.usage?.completion_tokens, 4);
  for (const index of [0, 1]) {
    const choices = events.flatMap((event) => event.choices).filter((choice) => choice.index === index);
    assert.equal(choices.map((choice) => choice.text).join(''), 'Same words');
    assert.deepEqual(choices.map((choice) => choice.finish_reason), [null, null, 'stop']);
  }
});
