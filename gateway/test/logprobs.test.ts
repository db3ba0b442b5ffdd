// Output and prompt log-probabilities in chat and completions shapes, streamed and not. The
// scripted engine's k-th alternative of token t is t + k with log-probability logprob - k.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { MODEL_NAME, oneTokenPerStep, sseEvents, startTestGateway, type TestGateway } from './harness.ts';
import type { Script } from './scripted-engine.ts';

let gateway: TestGateway;
let script: Script = { steps: [] };
before(async () => {
  gateway = await startTestGateway(() => script);
});
after(() => gateway.close());

const messages = [{ role: 'user', content: 'hi' }];
// gpt2 splits 👋 into ' \xf0\x9f\x91' (50169) and '\x8b' (233).
const text = 'Hi 👋';
const expectedChatContent = [
  { token: 'Hi', logprob: -0.25, bytes: [0x48, 0x69], top_logprobs: [] },
  { token: 'bytes:\\x20\\xf0\\x9f\\x91', logprob: -0.5, bytes: [0x20, 0xf0, 0x9f, 0x91], top_logprobs: [] },
  { token: 'bytes:\\x8b', logprob: -0.75, bytes: [0x8b], top_logprobs: [] },
];

test('chat logprobs, not streamed: one entry per output token with its bytes', async () => {
  assert.deepEqual(gateway.tokens(text), [17250, 50169, 233]);
  script = { steps: oneTokenPerStep(gateway.tokens(text)), finishReason: 'stop' };
  const body = await (await gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages, logprobs: true, top_logprobs: 0 })).json();
  assert.equal(body.choices[0].message.content, text);
  assert.deepEqual(body.choices[0].logprobs, { content: expectedChatContent });
});

test('chat logprobs, streamed: entries ride with the text they produced, none lost', async () => {
  script = { steps: oneTokenPerStep([...gateway.tokens(text), 50256]), finishReason: 'stop' };
  const response = await gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages, logprobs: true, stream: true });
  const events = sseEvents(await response.text()) as { choices: { delta: { content?: string }; logprobs: { content: unknown[] } | null }[] }[];
  events.pop();
  const chunks = events.map((event) => event.choices[0]);
  assert.deepEqual(
    chunks.map((chunk) => [chunk.delta.content, chunk.logprobs?.content.length ?? null]),
    [['', null], ['Hi', 1], [' ', 1], ['👋', 1], [undefined, 1]],
  );
  const entries = chunks.flatMap((chunk) => chunk.logprobs?.content ?? []);
  assert.deepEqual(entries, [
    ...expectedChatContent,
    { token: '<|endoftext|>', logprob: -1, bytes: [...Buffer.from('<|endoftext|>')], top_logprobs: [] },
  ]);
});

test('completion logprobs: 0 gives tokens, their logprobs and text offsets', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens(' a b')), finishReason: 'length' };
  const body = await (await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x', logprobs: 0 })).json();
  assert.equal(body.choices[0].text, ' a b');
  assert.deepEqual(body.choices[0].logprobs, {
    tokens: [' a', ' b'],
    token_logprobs: [-0.25, -0.5],
    top_logprobs: [{ ' a': -0.25 }, { ' b': -0.5 }],
    text_offset: [0, 2],
  });

  script = { steps: oneTokenPerStep(gateway.tokens(' a b')), finishReason: 'length' };
  const response = await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x', logprobs: 0, stream: true });
  const events = sseEvents(await response.text()) as { choices: { logprobs: { tokens: string[]; text_offset: number[] } | null }[] }[];
  events.pop();
  assert.deepEqual(
    events.map((event) => event.choices[0].logprobs),
    [
      { tokens: [' a'], token_logprobs: [-0.25], top_logprobs: [{ ' a': -0.25 }], text_offset: [0] },
      { tokens: [' b'], token_logprobs: [-0.5], top_logprobs: [{ ' b': -0.5 }], text_offset: [2] },
      { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] },
    ],
  );
});

test('without logprobs every choice says null', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens(' a')), finishReason: 'length' };
  const body = await (await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x' })).json();
  assert.equal(body.choices[0].logprobs, null);
});

test('chat top_logprobs: each token carries the alternatives the worker reported, likeliest first', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens(' a b')), finishReason: 'length' };
  const body = await (
    await gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages, logprobs: true, top_logprobs: 2 })
  ).json();
  const alternative = (tokenId: number, logprob: number) => {
    const bytes = gateway.tokenizer.tokenBytes(tokenId);
    return { token: Buffer.from(bytes).toString('utf8'), logprob, bytes: Array.from(bytes) };
  };
  const [a, b] = gateway.tokens(' a b');
  assert.deepEqual(body.choices[0].logprobs.content, [
    { ...alternative(a, -0.25), top_logprobs: [alternative(a, -0.25), alternative(a + 1, -1.25)] },
    { ...alternative(b, -0.5), top_logprobs: [alternative(b, -0.5), alternative(b + 1, -1.5)] },
  ]);
  assert.equal(gateway.engine.requests.at(-1)!.sampling.numTopLogprobs, 2);
});

test('completion logprobs: N gives N alternatives and always the sampled token', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens(' a')), finishReason: 'length' };
  const body = await (await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x', logprobs: 3 })).json();
  const text = (tokenId: number) => gateway.tokenizer.decode([tokenId], { skipSpecialTokens: false });
  const [a] = gateway.tokens(' a');
  assert.deepEqual(body.choices[0].logprobs.top_logprobs, [{ [text(a)]: -0.25, [text(a + 1)]: -1.25, [text(a + 2)]: -2.25 }]);
});

test('prompt_logprobs in vLLM shape: null first, then each prompt token with its alternatives', async () => {
  script = { steps: [gateway.tokens(' a')], finishReason: 'length' };
  const promptTokenIds = gateway.tokens('The fox jumps');
  const body = await (
    await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: promptTokenIds, prompt_logprobs: 1, n: 2, seed: 1 })
  ).json();
  const decoded = (tokenId: number) => gateway.tokenizer.decode([tokenId], { skipSpecialTokens: false });
  const expected = [
    null,
    ...promptTokenIds.slice(1).map((tokenId, i) => ({ [tokenId]: { logprob: -(i + 1) / 8, rank: 1, decoded_token: decoded(tokenId) } })),
  ];
  assert.deepEqual(body.choices[0].prompt_logprobs, expected);
  assert.deepEqual(body.choices[1].prompt_logprobs, expected);
  // The prompt is scored once, by the first choice.
  const [first, second] = gateway.engine.requests.slice(-2);
  assert.deepEqual([first.sampling.numPromptLogprobs, second.sampling.numPromptLogprobs], [1, undefined]);

  const chat = await (
    await gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages, prompt_logprobs: 0 })
  ).json();
  const chatPrompt = gateway.engine.requests.at(-1)!.promptTokenIds;
  assert.equal(chat.prompt_logprobs.length, chatPrompt.length);
  assert.equal(chat.prompt_logprobs[0], null);
  assert.deepEqual(Object.keys(chat.prompt_logprobs[1]), [String(chatPrompt[1])]);
  assert.equal(chat.choices[0].prompt_logprobs, undefined);
});
