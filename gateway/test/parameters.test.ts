// Chat and completions parameters beyond the basics, through the official SDK and raw fetch:
// include_stop_str_in_output, continuous usage, lists of prompts, echo, and the combinations
// that are refused rather than ignored.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import OpenAI from 'openai';
import { MODEL_NAME, oneTokenPerStep, sseEvents, startTestGateway, type TestGateway } from './harness.ts';
import type { Script } from './scripted-engine.ts';

let gateway: TestGateway;
let client: OpenAI;
let script: Script = { steps: [] };
before(async () => {
  gateway = await startTestGateway(() => script);
  client = new OpenAI({ baseURL: `${gateway.baseUrl}/v1`, apiKey: 'unused', maxRetries: 0 });
});
after(() => gateway.close());

const messages = [{ role: 'user' as const, content: 'hi' }];

interface CompletionChunk {
  choices: { index: number; text: string; logprobs: CompletionLogprobs | null; finish_reason: string | null }[];
  usage?: { prompt_tokens: number; completion_tokens: number; total_tokens: number };
}
interface CompletionLogprobs {
  tokens: string[];
  token_logprobs: (number | null)[];
  top_logprobs: (Record<string, number> | null)[];
  text_offset: number[];
}

async function streamedEvents(route: string, body: object) {
  const response = await gateway.post(route, { ...body, stream: true });
  assert.equal(response.status, 200);
  const events = sseEvents(await response.text());
  assert.equal(events.pop(), '[DONE]');
  return events;
}

async function expectBadRequest(route: string, body: object, code: string, param: string) {
  const response = await gateway.post(route, { model: MODEL_NAME, ...body });
  assert.equal(response.status, 400, JSON.stringify(body));
  const { error } = await response.json();
  assert.deepEqual([error.code, error.param], [code, param], JSON.stringify(body));
}

test('include_stop_str_in_output keeps the matched stop string, streamed and not, through the SDK', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens('Hello world. More')), hang: true };
  const plain = await client.chat.completions.create({ model: MODEL_NAME, messages, stop: ['world.'] });
  assert.equal(plain.choices[0].message.content, 'Hello ');
  const kept = await client.chat.completions.create({ model: MODEL_NAME, messages, stop: ['world.'], include_stop_str_in_output: true } as OpenAI.ChatCompletionCreateParamsNonStreaming);
  assert.equal(kept.choices[0].message.content, 'Hello world.');
  assert.equal(kept.choices[0].finish_reason, 'stop');

  const stream = await client.completions.create({ model: MODEL_NAME, prompt: 'x', stop: 'world.', stream: true, include_stop_str_in_output: true } as OpenAI.CompletionCreateParamsStreaming);
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, 'Hello world.');
});

test("a stop token's text is left out unless include_stop_str_in_output", async () => {
  const [period] = gateway.tokens('.');
  script = { steps: oneTokenPerStep(gateway.tokens('Done.')), finishReason: 'stop', stopTokenId: period };
  const plain = await (await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x', stop_token_ids: [period] })).json();
  assert.equal(plain.choices[0].text, 'Done');
  // The token was generated: usage counts it.
  assert.equal(plain.usage.completion_tokens, 2);
  const kept = await (
    await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x', stop_token_ids: [period], include_stop_str_in_output: true })
  ).json();
  assert.equal(kept.choices[0].text, 'Done.');
  const streamed = (await streamedEvents('/v1/chat/completions', { model: MODEL_NAME, messages })) as { choices: { delta: { content?: string } }[] }[];
  assert.equal(streamed.map((event) => event.choices[0].delta.content ?? '').join(''), 'Done');
});

test('continuous_usage_stats: every chunk carries its choice usage so far, then the total', async () => {
  script = { steps: [gateway.tokens('One two'), gateway.tokens(' three')], finishReason: 'length' };
  const events = (await streamedEvents('/v1/completions', {
    model: MODEL_NAME,
    prompt: 'Count',
    n: 2,
    stream_options: { include_usage: true, continuous_usage_stats: true },
  })) as CompletionChunk[];
  const numPromptTokens = gateway.tokens('Count').length;
  const total = events.pop()!;
  assert.deepEqual(total.choices, []);
  assert.deepEqual(total.usage, { prompt_tokens: numPromptTokens, completion_tokens: 6, total_tokens: numPromptTokens + 6, prompt_tokens_details: { cached_tokens: 0 } });
  for (const index of [0, 1]) {
    const chunks = events.filter((event) => event.choices[0].index === index);
    assert.deepEqual(
      chunks.map((chunk) => [chunk.choices[0].text, chunk.usage]),
      [
        ['One two', { prompt_tokens: numPromptTokens, completion_tokens: 2, total_tokens: numPromptTokens + 2 }],
        [' three', { prompt_tokens: numPromptTokens, completion_tokens: 3, total_tokens: numPromptTokens + 3 }],
        ['', { prompt_tokens: numPromptTokens, completion_tokens: 3, total_tokens: numPromptTokens + 3 }],
      ],
    );
  }
});

test('continuous usage through the SDK: the role chunk counts 0, every chunk has usage', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens('a b c')), finishReason: 'stop' };
  const stream = await client.chat.completions.create({
    model: MODEL_NAME,
    messages,
    stream: true,
    stream_options: { continuous_usage_stats: true } as OpenAI.ChatCompletionStreamOptions,
  });
  const completionTokens: number[] = [];
  for await (const chunk of stream) {
    assert.ok(chunk.usage, 'a chunk without usage');
    completionTokens.push(chunk.usage.completion_tokens);
  }
  // Role, three texts, finish, and the total (implied by continuous_usage_stats, as vLLM does).
  assert.deepEqual(completionTokens, [0, 1, 2, 3, 3, 3]);
});

test('stream_options only with stream; continuous usage cannot go with include_usage false', async () => {
  await expectBadRequest('/v1/chat/completions', { messages, stream_options: { include_usage: true } }, 'invalid_request', 'stream_options');
  await expectBadRequest('/v1/completions', { prompt: 'x', stream: false, stream_options: { include_usage: true } }, 'invalid_request', 'stream_options');
  await expectBadRequest(
    '/v1/completions',
    { prompt: 'x', stream: true, stream_options: { include_usage: false, continuous_usage_stats: true } },
    'invalid_request',
    'stream_options.continuous_usage_stats',
  );
  // A null is no value at all, as clients often send it.
  script = { steps: [gateway.tokens('ok')], finishReason: 'stop' };
  const ok = await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x', stream_options: null });
  assert.equal(ok.status, 200);
});

test('a list of prompts: choices are prompt-major (index = prompt × n + choice), usage sums the prompts', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens(' go')), finishReason: 'length' };
  const numRequestsBefore = gateway.engine.requests.length;
  const prompts = ['First prompt', 'Second', 'The third prompt here'];
  const completion = await client.completions.create({ model: MODEL_NAME, prompt: prompts, n: 2, max_tokens: 1, seed: 3 });
  const engineRequests = gateway.engine.requests.slice(numRequestsBefore);
  assert.deepEqual(
    engineRequests.map((request) => [gateway.tokenizer.decode(request.promptTokenIds, { skipSpecialTokens: false }), request.sampling.seed]),
    [[prompts[0], 3n], [prompts[0], 4n], [prompts[1], 3n], [prompts[1], 4n], [prompts[2], 3n], [prompts[2], 4n]],
  );
  assert.deepEqual(completion.choices.map((choice) => [choice.index, choice.text]), [0, 1, 2, 3, 4, 5].map((index) => [index, ' go']));
  const numPromptTokens = prompts.reduce((sum, prompt) => sum + gateway.tokens(prompt).length, 0);
  assert.deepEqual(completion.usage, { prompt_tokens: numPromptTokens, completion_tokens: 6, total_tokens: numPromptTokens + 6, prompt_tokens_details: { cached_tokens: 0 } });

  const tokenPrompts = [gateway.tokens('A'), gateway.tokens('B C')];
  const events = (await streamedEvents('/v1/completions', { model: MODEL_NAME, prompt: tokenPrompts, stream_options: { include_usage: true } })) as CompletionChunk[];
  assert.deepEqual(events.pop()!.usage, { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5, prompt_tokens_details: { cached_tokens: 0 } });
  assert.deepEqual(events.map((event) => [event.choices[0].index, event.choices[0].finish_reason]).sort(), [[0, null], [0, 'length'], [1, null], [1, 'length']]);
  assert.deepEqual(gateway.engine.requests.slice(-2).map((request) => request.promptTokenIds), tokenPrompts);
});

test('each prompt of a list gets its own room: max_tokens is checked against each, errors name the prompt', async () => {
  script = { steps: [gateway.tokens('x')] };
  await expectBadRequest('/v1/completions', { prompt: ['short', 'word '.repeat(70)] }, 'context_length_exceeded', 'prompt[1]');
  await expectBadRequest('/v1/completions', { prompt: [[1, 2], [3, 60000]] }, 'invalid_request', 'prompt[1]');
  await expectBadRequest('/v1/completions', { prompt: ['a', 'b'], n: 1025 }, 'invalid_request', 'n');
  await expectBadRequest('/v1/completions', { prompt: Array(600).fill('a'), n: 4 }, 'invalid_request', 'n');
  await expectBadRequest('/v1/completions', { prompt: ['a', 1] }, 'invalid_request', 'prompt');
  await expectBadRequest('/v1/completions', { prompt: [[]] }, 'invalid_request', 'prompt[0]');
});

test('echo puts the prompt before the completion, streamed and not, for text and token-id prompts', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens(' jumps over')), finishReason: 'length' };
  const whole = await client.completions.create({ model: MODEL_NAME, prompt: 'The fox', echo: true, max_tokens: 2 });
  assert.equal(whole.choices[0].text, 'The fox jumps over');
  assert.equal(whole.usage?.prompt_tokens, 2);

  const byIds = await (await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: gateway.tokens('The fox'), echo: true, max_tokens: 2 })).json();
  assert.equal(byIds.choices[0].text, 'The fox jumps over');

  const events = (await streamedEvents('/v1/completions', { model: MODEL_NAME, prompt: ['A cat', 'A dog'], echo: true, n: 2, max_tokens: 2 })) as CompletionChunk[];
  for (const [index, prompt] of ['A cat', 'A cat', 'A dog', 'A dog'].entries()) {
    const texts = events.filter((event) => event.choices[0].index === index).map((event) => event.choices[0].text);
    assert.deepEqual(texts, [prompt, ' jumps', ' over', '']);
  }
});

test('echo with logprobs: the prompt tokens open the logprobs, the first with null, offsets run on', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens(' jumps over')), finishReason: 'length' };
  const prompt = 'The quick fox';
  const promptIds = gateway.tokens(prompt);
  const expectedPrompt: CompletionLogprobs = {
    tokens: ['The', ' quick', ' fox'],
    // The scripted worker scores prompt token i (from 1) with -i/8, its alternatives id + k with -i/8 - k.
    token_logprobs: [null, -1 / 8, -2 / 8],
    top_logprobs: [null, { ' quick': -1 / 8, [gateway.tokenizer.decode([promptIds[1] + 1], { skipSpecialTokens: false })]: -1 / 8 - 1 }, { ' fox': -2 / 8, [gateway.tokenizer.decode([promptIds[2] + 1], { skipSpecialTokens: false })]: -2 / 8 - 1 }],
    text_offset: [0, 3, 9],
  };
  const whole = await (await gateway.post('/v1/completions', { model: MODEL_NAME, prompt, echo: true, logprobs: 2, max_tokens: 2 })).json();
  const choice = whole.choices[0];
  assert.equal(choice.text, 'The quick fox jumps over');
  assert.deepEqual(choice.logprobs.tokens, [...expectedPrompt.tokens, ' jumps', ' over']);
  assert.deepEqual(choice.logprobs.token_logprobs, [...expectedPrompt.token_logprobs, -1 / 4, -2 / 4]);
  assert.deepEqual(choice.logprobs.top_logprobs.slice(0, 3), expectedPrompt.top_logprobs);
  assert.deepEqual(choice.logprobs.text_offset, [0, 3, 9, 13, 19]);
  // Echo asks the worker for the prompt's logprobs; no prompt_logprobs field was asked for.
  assert.equal(gateway.engine.requests.at(-1)!.sampling.numPromptLogprobs, 2);
  assert.equal('prompt_logprobs' in choice, false);

  const events = (await streamedEvents('/v1/completions', { model: MODEL_NAME, prompt, echo: true, logprobs: 2, max_tokens: 2, n: 2 })) as CompletionChunk[];
  for (const index of [0, 1]) {
    const chunks = events.filter((event) => event.choices[0].index === index).map((event) => event.choices[0]);
    assert.equal(chunks[0].text, prompt);
    assert.deepEqual(chunks[0].logprobs, expectedPrompt);
    assert.deepEqual(chunks[1].logprobs!.text_offset, [13]);
    assert.equal(chunks.map((chunk) => chunk.text).join(''), 'The quick fox jumps over');
  }
});

test('echo through the SDK with logprobs: the first token has no logprob', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens(' on')), finishReason: 'length' };
  const completion = await client.completions.create({ model: MODEL_NAME, prompt: 'Go', echo: true, logprobs: 0, max_tokens: 1 });
  assert.equal(completion.choices[0].text, 'Go on');
  assert.deepEqual(completion.choices[0].logprobs?.token_logprobs, [null, -1 / 4]);
});

test('every field checks its type and range; combinations that would be ignored are refused', async () => {
  const cases: [string, Record<string, unknown>, string][] = [
    ['/v1/completions', { prompt: 'x', logprobs: -1 }, 'logprobs'],
    ['/v1/completions', { prompt: 'x', logprobs: true }, 'logprobs'],
    ['/v1/chat/completions', { messages, logprobs: -1 }, 'logprobs'],
    ['/v1/chat/completions', { messages, logprobs: false, top_logprobs: 1 }, 'top_logprobs'],
    ['/v1/chat/completions', { messages, top_logprobs: -1, logprobs: true }, 'top_logprobs'],
    ['/v1/completions', { prompt: 'x', echo: 'yes' }, 'echo'],
    ['/v1/completions', { prompt: 'x', include_stop_str_in_output: 1 }, 'include_stop_str_in_output'],
    ['/v1/completions', { prompt: 'x', best_of: 0 }, 'best_of'],
    ['/v1/completions', { prompt: 'x', n: 2, best_of: 1 }, 'best_of'],
    ['/v1/completions', { prompt: 'x', seed: 2 ** 64 }, 'seed'],
    ['/v1/completions', { prompt: 'x', max_tokens: 1.5 }, 'max_tokens'],
    ['/v1/completions', { prompt: 'x', temperature: -0.1 }, 'temperature'],
    ['/v1/completions', { prompt: 'x', top_p: 0 }, 'top_p'],
    ['/v1/completions', { prompt: 'x', top_k: -2 }, 'top_k'],
    ['/v1/completions', { prompt: 'x', n: 0 }, 'n'],
    ['/v1/completions', { prompt: 'x', stream: 'true' }, 'stream'],
    ['/v1/completions', { prompt: 'x', stream: true, stream_options: { include_usage: 'yes' } }, 'stream_options.include_usage'],
    ['/v1/completions', { prompt: 'x', user: 5 }, 'user'],
    ['/v1/chat/completions', { messages: [] }, 'messages'],
    ['/v1/chat/completions', { messages: [{ role: 'robot', content: 'x' }] }, 'messages[0].role'],
    ['/v1/chat/completions', { messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }, 'messages[0].content'],
  ];
  for (const [route, fields, param] of cases) await expectBadRequest(route, fields, 'invalid_request', param);
});

test('every numeric parameter is checked against its documented range at the edge, on chat, completions, Responses and KServe generate, before the wire narrows it', async () => {
  const requests = gateway.engine.requests.length;
  const surfaces: [string, Record<string, unknown>][] = [
    ['/v1/chat/completions', { messages }],
    ['/v1/completions', { prompt: 'x' }],
    ['/v1/responses', { input: 'x' }],
  ];
  const outOfRange: [Record<string, unknown>, string, RegExp][] = [
    // int32 on the engine's wire: 2147483648 arrived as -2147483648.
    [{ top_k: 2 ** 31 }, 'top_k', /<=2147483647/],
    [{ repetition_penalty: 1e308 }, 'repetition_penalty', /<=2\b/],
    [{ repetition_penalty: 0 }, 'repetition_penalty', />0/],
    [{ priority: 2 ** 31 }, 'priority', /<=2147483647/],
    [{ priority: -(2 ** 31) - 1 }, 'priority', />=-2147483648/],
    [{ min_tokens: 2 ** 31 }, 'min_tokens', /<=2147483647/],
    [{ seed: 2 ** 53 }, 'seed', /int/],
    [{ stop_token_ids: [2 ** 31] }, 'stop_token_ids[0]', /<=2147483647/],
    [{ presence_penalty: 2.5 }, 'presence_penalty', /<=2\b/],
    [{ min_p: 1.5 }, 'min_p', /<=1\b/],
    [{ logit_bias: { 5: 101 } }, 'logit_bias.5', /<=100/],
  ];
  for (const [route, base] of surfaces) {
    for (const [fields, param, message] of outOfRange) {
      const response = await gateway.post(route, { model: MODEL_NAME, ...base, ...fields });
      assert.equal(response.status, 400, `${route} ${JSON.stringify(fields)}`);
      const { error } = await response.json();
      assert.deepEqual([error.code, error.param], ['invalid_request', param], `${route} ${JSON.stringify(fields)}`);
      assert.match(error.message, message);
      if (param !== 'priority') assert.doesNotMatch(error.message, /-2147483648/);
    }
  }
  for (const [route, fields, param] of [
    ['/v1/chat/completions', { messages, max_completion_tokens: 2 ** 31 }, 'max_completion_tokens'],
    ['/v1/completions', { prompt: 'x', max_tokens: 2 ** 31 }, 'max_tokens'],
    ['/v1/responses', { input: 'x', max_output_tokens: 2 ** 31 }, 'max_output_tokens'],
  ] as const) {
    await expectBadRequest(route, fields, 'invalid_request', param);
  }
  // KServe generate, with Triton's error body.
  for (const fields of [{ top_k: 2 ** 31 }, { max_tokens: 2 ** 31 }, { temperature: 1e308 }, { seed: 2 ** 60 }]) {
    for (const where of ['top', 'parameters']) {
      const body = where === 'top' ? { text_input: 'x', ...fields } : { text_input: 'x', parameters: fields };
      const response = await gateway.post('/v2/models/tiny/generate', body);
      assert.equal(response.status, 400, JSON.stringify(body));
      const { error } = await response.json() as { error: string };
      assert.match(error, new RegExp(`^(parameters\\.)?${Object.keys(fields)[0]}: `), error);
    }
  }
  assert.equal(gateway.engine.requests.length, requests, 'none reached a worker');
  // The bounds themselves are accepted.
  script = { steps: [gateway.tokens('ok')], finishReason: 'stop' };
  const atBounds = await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x', max_tokens: 2, top_k: 2 ** 31 - 1, repetition_penalty: 2, priority: -(2 ** 31), seed: -(2 ** 53 - 1) });
  assert.equal(atBounds.status, 200, await atBounds.clone().text());
  assert.equal(gateway.engine.requests.at(-1)!.sampling.topK, 2 ** 31 - 1);
});
