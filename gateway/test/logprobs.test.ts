// Sampled-token log-probabilities in chat and completions shapes, streamed and not.
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
