// A client that goes away aborts its request in the worker at once, streamed or not.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { after, before, test } from 'node:test';
import type { GenerateRequest } from '../../engine/types.ts';
import { MODEL_NAME, startTestGateway, type TestGateway } from './harness.ts';
import type { Script } from './scripted-engine.ts';

let gateway: TestGateway;
let script: Script = { steps: [] };
before(async () => {
  gateway = await startTestGateway(() => script);
});
after(() => gateway.close());

function postWithSignal(route: string, body: object, signal: AbortSignal) {
  return fetch(`${gateway.baseUrl}${route}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
    signal,
  });
}

test('disconnecting mid-stream aborts the request in the worker', { timeout: 10_000 }, async () => {
  script = { steps: [gateway.tokens('Hello')], hang: true };
  const controller = new AbortController();
  const response = await postWithSignal(
    '/v1/chat/completions',
    { model: MODEL_NAME, messages: [{ role: 'user', content: 'hi' }], stream: true },
    controller.signal,
  );
  const reader = response.body!.getReader();
  const { value } = await reader.read();
  assert.match(new TextDecoder().decode(value), /^data: /);
  const aborted = once(gateway.engine, 'abort');
  controller.abort();
  const [requestId] = await aborted;
  assert.equal(requestId, gateway.engine.requests.at(-1)!.requestId);
  assert.equal(gateway.engine.numInFlight, 0);
});

test('disconnecting before a non-streamed response aborts the request in the worker', { timeout: 10_000 }, async () => {
  script = { steps: [], hang: true };
  const controller = new AbortController();
  const generated = once(gateway.engine, 'generate');
  const pending = postWithSignal('/v1/completions', { model: MODEL_NAME, prompt: 'x' }, controller.signal);
  const [request] = (await generated) as [GenerateRequest];
  const aborted = once(gateway.engine, 'abort');
  controller.abort();
  await assert.rejects(pending);
  assert.deepEqual(await aborted, [request.requestId]);
  assert.equal(gateway.engine.numInFlight, 0);
});

test('a finished request is not aborted when its connection closes', async () => {
  script = { steps: [gateway.tokens('done')], finishReason: 'stop' };
  const numAbortedBefore = gateway.engine.abortedRequestIds.length;
  const response = await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x' });
  assert.equal(response.status, 200);
  await response.json();
  assert.equal(gateway.engine.abortedRequestIds.length, numAbortedBefore);
});

test('disconnecting aborts every choice of an n > 1 request', { timeout: 10_000 }, async () => {
  script = { steps: [gateway.tokens('Hi')], hang: true };
  const controller = new AbortController();
  const numRequestsBefore = gateway.engine.requests.length;
  const response = await postWithSignal('/v1/completions', { model: MODEL_NAME, prompt: 'x', n: 2, stream: true }, controller.signal);
  await response.body!.getReader().read();
  const abortedBoth = new Promise<void>((resolve) => {
    const onAbort = () => {
      if (gateway.engine.numInFlight > 0) return;
      gateway.engine.off('abort', onAbort);
      resolve();
    };
    gateway.engine.on('abort', onAbort);
  });
  controller.abort();
  await abortedBoth;
  const choiceRequestIds = gateway.engine.requests.slice(numRequestsBefore).map((request) => request.requestId);
  assert.deepEqual(gateway.engine.abortedRequestIds.slice(-2).sort(), choiceRequestIds.sort());
});
