// The official openai client reads what the gateway writes: streams, usage and errors.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import OpenAI from 'openai';
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

test('a streamed chat completion with usage, through the SDK', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens('Grüße 👋 aus Köln')), finishReason: 'stop' };
  const stream = await client.chat.completions.create({
    model: MODEL_NAME,
    messages: [{ role: 'user', content: 'hi' }],
    stream: true,
    stream_options: { include_usage: true },
  });
  let content = '';
  let finishReason: string | null = null;
  let usage: OpenAI.CompletionUsage | null | undefined = null;
  for await (const chunk of stream) {
    content += chunk.choices[0]?.delta.content ?? '';
    finishReason = chunk.choices[0]?.finish_reason ?? finishReason;
    usage = chunk.usage ?? usage;
  }
  assert.equal(content, 'Grüße 👋 aus Köln');
  assert.equal(finishReason, 'stop');
  assert.equal(usage?.completion_tokens, gateway.tokens('Grüße 👋 aus Köln').length);
  assert.equal(usage?.prompt_tokens, gateway.engine.requests.at(-1)!.promptTokenIds.length);
});

test('a text completion through the SDK', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens(' world')), finishReason: 'length' };
  const completion = await client.completions.create({ model: MODEL_NAME, prompt: 'Hello', max_tokens: 1 });
  assert.equal(completion.choices[0].text, ' world');
  assert.equal(completion.choices[0].finish_reason, 'length');
});

test('errors arrive as the SDK error classes with status, code and param', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'nope', messages: [{ role: 'user', content: 'hi' }] }),
    (error: unknown) => {
      assert.ok(error instanceof OpenAI.NotFoundError);
      assert.equal(error.code, 'model_not_found');
      assert.equal(error.param, 'model');
      return true;
    },
  );
  await assert.rejects(
    client.chat.completions.create({ model: MODEL_NAME, messages: [{ role: 'user', content: 'hi' }], temperature: 5 }),
    (error: unknown) => error instanceof OpenAI.BadRequestError && error.param === 'temperature',
  );
});

test('a mid-stream error surfaces as an APIError from the stream', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens('Hello world')), error: { code: 'internal_error', message: 'the runner failed' } };
  const stream = await client.completions.create({ model: MODEL_NAME, prompt: 'x', stream: true });
  await assert.rejects(
    (async () => {
      for await (const _chunk of stream);
    })(),
    /The server failed while running the request/,
  );
});
