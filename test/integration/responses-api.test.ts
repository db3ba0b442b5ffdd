// The Responses API on the real server (engine workers on conduit-tiny): HTTP, SSE, WebSocket
// mode through the SDK's ResponsesWS, and the agents SDK over its WebSocket model.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import OpenAI from 'openai';
import type { ResponsesClientEvent, ResponsesServerEvent } from 'openai/resources/responses/responses';
import { ResponsesWS } from 'openai/resources/responses/ws';
import { WebSocket } from 'ws';
import type { RunningServer } from '../../bin/serve.ts';
import { boundedFetch, defaultModelDir, openaiClient, startServer } from './harness.ts';

const modelName = 'conduit-tiny';
const BLOCK_SIZE_TOKENS = 16;
let server: RunningServer;
let client: OpenAI;

before(async () => {
  server = await startServer([{ path: defaultModelDir, num_workers: 1, threads_per_worker: 1, kv_cache_blocks: 256, max_num_seqs: 16 }]);
  client = openaiClient(`${server.httpAddress}/v1`);
});

after(async () => {
  await server?.close();
});

/** A greedy request of a fixed length: ignore_eos is vLLM's extension, which the SDK's types do not know. */
const fixedLength = (numTokens: number) => ({ max_output_tokens: numTokens, temperature: 0, ...{ ignore_eos: true } });

const longInstructions = 'You are a careful assistant who explains the weather at length, with examples. '.repeat(3);

function turn(rws: ResponsesWS, body: Omit<ResponsesClientEvent, 'type'> & { generate?: boolean }): Promise<OpenAI.Responses.Response> {
  return new Promise((resolve, reject) => {
    const onEvent = (event: ResponsesServerEvent) => {
      if (event.type === 'error') reject(new Error(`error event: ${JSON.stringify(event)}`));
      else if (event.type === 'response.completed' || event.type === 'response.incomplete' || event.type === 'response.failed') resolve(event.response);
      else return;
      rws.off('event', onEvent);
    };
    rws.on('event', onEvent);
    rws.send({ type: 'response.create', ...body } as ResponsesClientEvent);
  });
}

test('a response over HTTP and over SSE: the same greedy text, exact usage', async () => {
  const request = { model: modelName, input: 'Tell me about the sea.', ...fixedLength(12) };
  const whole = await client.responses.create(request);
  assert.equal(whole.status, 'incomplete');
  assert.deepEqual(whole.incomplete_details, { reason: 'max_output_tokens' });
  assert.equal(whole.usage?.output_tokens, 12);
  const rendered = (await (
    await boundedFetch(`${server.httpAddress}/tokenize`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: modelName, messages: [{ role: 'user', content: 'Tell me about the sea.' }] }),
    })
  ).json()) as { count: number };
  assert.equal(whole.usage?.input_tokens, rendered.count);
  assert.ok(whole.output_text.length > 0);

  const stream = await client.responses.create({ ...request, stream: true });
  let text = '';
  let last: OpenAI.Responses.ResponseStreamEvent | null = null;
  for await (const event of stream) {
    if (event.type === 'response.output_text.delta') text += event.delta;
    last = event;
  }
  assert.equal(last?.type, 'response.incomplete');
  assert.equal(text, whole.output_text);
});

test('a chained turn reports its history as cached tokens', async () => {
  const first = await client.responses.create({ model: modelName, instructions: longInstructions, input: 'Is it raining?', ...fixedLength(8) });
  const second = await client.responses.create({
    model: modelName, instructions: longInstructions, input: 'And tomorrow?', previous_response_id: first.id, ...fixedLength(8),
  });
  const cachedTokens = second.usage!.input_tokens_details.cached_tokens;
  // The first prompt's full blocks are reused; its output only partly (it ends mid-block).
  assert.ok(cachedTokens >= Math.floor(first.usage!.input_tokens / BLOCK_SIZE_TOKENS) * BLOCK_SIZE_TOKENS, `${cachedTokens} cached`);
  assert.ok(cachedTokens > 0 && cachedTokens < second.usage!.input_tokens);
});

test('WebSocket mode through ResponsesWS: a warm-up, then chained turns whose prompts come from the cache', { timeout: 60_000 }, async () => {
  const rws = new ResponsesWS(client);
  rws.on('error', () => {});
  try {
    const warm = await turn(rws, { model: modelName, instructions: longInstructions, input: 'Is it sunny?', generate: false });
    assert.equal(warm.status, 'completed');
    assert.deepEqual(warm.output, []);
    const numWarmTokens = warm.usage!.input_tokens;
    const first = await turn(rws, {
      model: modelName, instructions: longInstructions, input: 'Answer now.', previous_response_id: warm.id, store: false, ...fixedLength(6),
    });
    assert.equal(first.usage?.output_tokens, 6);
    assert.ok(first.usage!.input_tokens_details.cached_tokens >= Math.floor(numWarmTokens / BLOCK_SIZE_TOKENS) * BLOCK_SIZE_TOKENS);
    assert.ok(first.usage!.input_tokens_details.cached_tokens > 0);
    const second = await turn(rws, {
      model: modelName, instructions: longInstructions, input: 'Thanks.', previous_response_id: first.id, store: false, ...fixedLength(6),
    });
    assert.ok(second.usage!.input_tokens_details.cached_tokens >= Math.floor(first.usage!.input_tokens / BLOCK_SIZE_TOKENS) * BLOCK_SIZE_TOKENS);
    assert.equal(second.previous_response_id, first.id);
  } finally {
    rws.close();
  }
});

test('the agents SDK runs an Agent over the Responses WebSocket model', { timeout: 60_000 }, async () => {
  // Node 20 has no global WebSocket; the agents SDK takes the `ws` package's, which accepts headers.
  const globals = globalThis as { WebSocket?: unknown };
  const previousWebSocket = globals.WebSocket;
  globals.WebSocket = WebSocket;
  const { Agent, setTracingDisabled, withResponsesWebSocketSession } = await import('@openai/agents');
  setTracingDisabled(true);
  try {
    const agent = new Agent({
      name: 'Forecaster',
      instructions: 'You describe the weather.',
      model: modelName,
      modelSettings: { maxTokens: 16, temperature: 0 },
    });
    const result = await withResponsesWebSocketSession(
      ({ run }) => run(agent, 'What is the weather like?'),
      { providerOptions: { apiKey: 'unused', baseURL: `${server.httpAddress}/v1` } },
    );
    // A tiny text-continuation model: the protocol worked and text came back; its quality is not the point.
    assert.equal(typeof result.finalOutput, 'string');
    assert.ok((result.finalOutput as string).length > 0);
    assert.equal(result.rawResponses.length, 1);
    assert.ok(result.rawResponses[0].usage.outputTokens > 0);
  } finally {
    globals.WebSocket = previousWebSocket;
  }
});
