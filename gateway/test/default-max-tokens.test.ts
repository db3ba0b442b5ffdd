// A request that sets no output limit gets the checkpoint's (generation_config.json's
// max_new_tokens, as vLLM), on every surface; its own limit overrides it; neither runs past the
// context. Without a checkpoint default, each surface keeps its own: the room left (chat,
// Responses), OpenAI's 16 (completions), the vLLM Triton backend's 16 (KServe generate).
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { MAX_MODEL_LEN, startTestGateway, type TestGateway } from './harness.ts';
import type { Script } from './scripted-engine.ts';

const MAX_NEW_TOKENS = 5;
const script: Script = { steps: [[11]], finishReason: 'stop' };
let withDefault: TestGateway;
let withoutDefault: TestGateway;

before(async () => {
  withDefault = await startTestGateway(() => script, { generationConfig: { max_new_tokens: MAX_NEW_TOKENS, temperature: 0.8 } });
  withoutDefault = await startTestGateway(() => script, { generationConfig: { temperature: 0.8 } });
});
after(async () => {
  await withDefault?.close();
  await withoutDefault?.close();
});

type SurfaceRequest = (prompt: string, limit?: number) => [route: string, body: Record<string, unknown>];

/** Each surface's request for `prompt`, with `limit` in its own field when given. */
const surfaces: Record<'chat' | 'chatMaxCompletionTokens' | 'completions' | 'responses' | 'kserveGenerate', SurfaceRequest> = {
  chat: (prompt: string, limit?: number) => ['/v1/chat/completions', { model: 'tiny', messages: [{ role: 'user', content: prompt }], max_tokens: limit }],
  chatMaxCompletionTokens: (prompt: string, limit?: number) => ['/v1/chat/completions', { model: 'tiny', messages: [{ role: 'user', content: prompt }], max_completion_tokens: limit }],
  completions: (prompt: string, limit?: number) => ['/v1/completions', { model: 'tiny', prompt, max_tokens: limit }],
  responses: (prompt: string, limit?: number) => ['/v1/responses', { model: 'tiny', input: prompt, max_output_tokens: limit }],
  kserveGenerate: (prompt: string, limit?: number) => ['/v2/models/tiny/generate', { text_input: prompt, max_tokens: limit }],
};

async function sentMaxTokens(gateway: TestGateway, surface: keyof typeof surfaces, prompt: string, limit?: number): Promise<number> {
  const [route, body] = surfaces[surface](prompt, limit);
  const response = await gateway.post(route, body);
  assert.equal(response.status, 200, `${surface}: ${await response.text()}`);
  await response.arrayBuffer().catch(() => {});
  return gateway.engine.requests.at(-1)!.sampling.maxTokens!;
}

test("without a limit of its own, every surface asks for the checkpoint's max_new_tokens", async () => {
  for (const surface of Object.keys(surfaces) as (keyof typeof surfaces)[]) {
    assert.equal(await sentMaxTokens(withDefault, surface, 'Hello'), MAX_NEW_TOKENS, surface);
  }
});

test("a request's own limit overrides the checkpoint's, above it or below it", async () => {
  for (const surface of Object.keys(surfaces) as (keyof typeof surfaces)[]) {
    assert.equal(await sentMaxTokens(withDefault, surface, 'Hello', 9), 9, surface);
    assert.equal(await sentMaxTokens(withDefault, surface, 'Hello', 2), 2, surface);
  }
});

test("the checkpoint's default never runs past the context: a long prompt gets the room left", async () => {
  for (const surface of Object.keys(surfaces) as (keyof typeof surfaces)[]) {
    // Each surface wraps a prompt in its own tokens (a chat template's): the longest prompt of
    // one-token words that still leaves room, which is then less than the default.
    let numWords = MAX_MODEL_LEN;
    let response: Response;
    do {
      numWords--;
      const [route, body] = surfaces[surface](' word'.repeat(numWords));
      response = await withDefault.post(route, body);
      await response.arrayBuffer();
    } while (response.status === 400);
    assert.equal(response.status, 200, surface);
    const sent = withDefault.engine.requests.at(-1)!;
    const numRoomTokens = MAX_MODEL_LEN - sent.promptTokenIds.length;
    assert.ok(numRoomTokens < MAX_NEW_TOKENS, `${surface}: ${numRoomTokens} tokens of room`);
    assert.equal(sent.sampling.maxTokens, numRoomTokens, surface);
  }
});

test('without a checkpoint default: chat and Responses use the room left, completions and KServe generate 16', async () => {
  const expected = { chat: null, chatMaxCompletionTokens: null, responses: null, completions: 16, kserveGenerate: 16 };
  for (const [surface, want] of Object.entries(expected) as [keyof typeof surfaces, number | null][]) {
    const maxTokens = await sentMaxTokens(withoutDefault, surface, 'Hello');
    const room = MAX_MODEL_LEN - withoutDefault.engine.requests.at(-1)!.promptTokenIds.length;
    assert.equal(maxTokens, want ?? room, surface);
  }
});
