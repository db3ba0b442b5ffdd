// The gateway's readiness over real sockets: 503 with Retry-After in OpenAI's envelope (KServe's
// under /v2, whose live probe stays 200) while it starts and while it drains, /health reporting
// the state, and streams in flight finishing during the drain while new requests are turned away.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { test } from 'node:test';
import OpenAI from 'openai';
import type { ResponsesClientEvent, ResponsesServerEvent } from 'openai/resources/responses/responses';
import { ResponsesWS } from 'openai/resources/responses/ws';
import { Readiness } from '../server.ts';
import { MODEL_NAME, startTestGateway } from './harness.ts';
import type { Script } from './scripted-engine.ts';
import { within } from '../../test/wait.ts';

const chatBody = { model: MODEL_NAME, messages: [{ role: 'user' as const, content: 'hi' }] };

async function expectUnavailable(response: Response, code: 'server_starting' | 'server_draining', message: RegExp) {
  assert.equal(response.status, 503);
  assert.equal(response.headers.get('retry-after'), '5');
  const { error } = await response.json();
  assert.deepEqual(error, { message: error.message, type: 'service_unavailable_error', param: null, code });
  assert.match(error.message, message);
}

/** Outside `ready`: alive, not ready (Triton's 400), and KServe's own body on the rest of /v2. */
async function expectKServeProbes(baseUrl: string, message: string) {
  assert.equal((await fetch(`${baseUrl}/v2/health/live`)).status, 200);
  const ready = await fetch(`${baseUrl}/v2/health/ready`);
  assert.equal(ready.status, 400);
  assert.equal(await ready.text(), '');
  const metadata = await fetch(`${baseUrl}/v2/models/${MODEL_NAME}`);
  assert.equal(metadata.status, 503);
  assert.equal(metadata.headers.get('retry-after'), '5');
  assert.match((await metadata.json()).error, new RegExp(message));
}

test('while starting: 503 with Retry-After for every request, /health says starting; then ready', async () => {
  const readiness = new Readiness('starting');
  let script: Script = { steps: [] };
  const gateway = await startTestGateway(() => script, { gatewayOptions: { readiness } });
  try {
    const sdk = new OpenAI({ baseURL: `${gateway.baseUrl}/v1`, apiKey: 'unused', maxRetries: 0 });
    const refused = await sdk.chat.completions.create(chatBody).catch((err) => err);
    assert.ok(refused instanceof OpenAI.InternalServerError);
    assert.equal(refused.status, 503);
    assert.equal(refused.code, 'server_starting');
    assert.equal(refused.headers.get('retry-after'), '5');
    await expectUnavailable(await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x' }), 'server_starting', /is starting/);
    await expectUnavailable(await fetch(`${gateway.baseUrl}/v1/models`), 'server_starting', /is starting/);
    assert.equal(gateway.engine.requests.length, 0);

    const health = await fetch(`${gateway.baseUrl}/health`);
    assert.equal(health.status, 503);
    assert.equal(health.headers.get('retry-after'), '5');
    const body = await health.json();
    assert.equal(body.status, 'unavailable');
    assert.equal(body.state, 'starting');
    await expectKServeProbes(gateway.baseUrl, 'is starting');

    readiness.markReady();
    script = { steps: [gateway.tokens('up')], finishReason: 'stop' };
    assert.equal((await sdk.chat.completions.create(chatBody)).choices[0].message.content, 'up');
    const ready = await fetch(`${gateway.baseUrl}/health`);
    assert.equal(ready.status, 200);
    assert.equal((await ready.json()).state, 'ready');
  } finally {
    await gateway.close();
  }
});

test('while draining: the stream in flight finishes, new requests get 503, /health says draining', async () => {
  let script: Script = { steps: [], hang: true };
  const gateway = await startTestGateway(() => script, { gatewayOptions: { drainTimeoutMs: 60_000 } });
  script = { steps: [gateway.tokens(' first')], hang: true };
  const stream = await gateway.post('/v1/chat/completions', { ...chatBody, stream: true });
  assert.equal(stream.status, 200);
  const reader = stream.body!.getReader();
  const decoder = new TextDecoder();
  let text = decoder.decode((await reader.read()).value, { stream: true });

  const closed = gateway.close();
  // Still listening: a new request is answered, in our envelope.
  await expectUnavailable(await gateway.post('/v1/chat/completions', chatBody), 'server_draining', /shutting down/);
  const health = await fetch(`${gateway.baseUrl}/health`);
  assert.equal(health.status, 503);
  assert.equal(health.headers.get('retry-after'), '5');
  assert.equal((await health.json()).state, 'draining');
  await expectKServeProbes(gateway.baseUrl, 'shutting down');

  // The stream in flight was not cut: it ends as its generation does.
  gateway.engine.finishHanging(gateway.engine.requests[0].requestId);
  for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) text += decoder.decode(chunk.value, { stream: true });
  assert.match(text, /first.*"finish_reason":"stop".*data: \[DONE\]/s);
  assert.deepEqual(gateway.engine.abortedRequestIds, []);
  await closed;
  await assert.rejects(fetch(`${gateway.baseUrl}/health`));
});

test('while draining, a WebSocket turn in flight finishes; a new turn, or a new socket, gets 503', async () => {
  const script: Script = { steps: [[318]], hang: true };
  const gateway = await startTestGateway(() => script, { gatewayOptions: { drainTimeoutMs: 60_000 } });
  const sdk = new OpenAI({ baseURL: `${gateway.baseUrl}/v1`, apiKey: 'unused', maxRetries: 0 });
  const collect = (rws: ResponsesWS) => {
    const events: ResponsesServerEvent[] = [];
    let onEvent = () => {};
    rws.on('error', () => {});
    rws.on('event', (event) => {
      events.push(event);
      onEvent();
    });
    const until = async (type: ResponsesServerEvent['type']) => {
      while (!events.some((event) => event.type === type)) await new Promise<void>((resolve) => (onEvent = resolve));
      return events.find((event) => event.type === type)!;
    };
    return until;
  };
  const create = { type: 'response.create', model: MODEL_NAME, input: 'hi' } as ResponsesClientEvent;
  const busy = new ResponsesWS(sdk);
  const busyEvent = collect(busy);
  busy.send(create);
  await busyEvent('response.created');
  // A second socket, open (and idle) before the drain.
  const idle = new ResponsesWS(sdk);
  const idleEvent = collect(idle);
  await new Promise((resolve) => idle.socket.once('open', resolve));

  const closed = gateway.close();
  idle.send(create);
  const refused = (await idleEvent('error')) as Extract<ResponsesServerEvent, { type: 'error' }> & { status: number };
  assert.equal(refused.status, 503);
  assert.equal(refused.code, 'server_draining');
  const late = new ResponsesWS(sdk);
  const lateFailure = new Promise<string>((resolve) => late.on('error', (error) => resolve(error.message)));
  late.send(create);
  assert.match(await lateFailure, /503/);

  gateway.engine.finishHanging(gateway.engine.requests[0].requestId);
  const completed = await busyEvent('response.completed');
  assert.equal(completed.type === 'response.completed' && completed.response.status, 'completed');
  await closed;
  assert.deepEqual(gateway.engine.abortedRequestIds, []);
});

test('a drain that outlasts its timeout cuts what still runs, aborting it in the worker', async () => {
  const script: Script = { steps: [[318]], hang: true };
  const gateway = await startTestGateway(() => script, { gatewayOptions: { drainTimeoutMs: 100 } });
  const stream = await gateway.post('/v1/chat/completions', { ...chatBody, stream: true });
  const reader = stream.body!.getReader();
  await reader.read();
  const aborted = once(gateway.engine, 'abort');
  await gateway.close();
  assert.equal((await aborted)[0], gateway.engine.requests[0].requestId);
  await assert.rejects(async () => {
    for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read());
  });
});

test('a client that abandons its stream without closing its connection does not hold up the close', async () => {
  const script: Script = { steps: Array.from({ length: 20 }, () => [318]), finishReason: 'length' };
  const gateway = await startTestGateway(() => script, { gatewayOptions: { drainTimeoutMs: 60_000 } });
  // fetch's abort leaves the socket open in its pool; the server sees no close, only silence.
  const abandon = new AbortController();
  const stream = await fetch(`${gateway.baseUrl}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...chatBody, stream: true, max_tokens: 20 }),
    signal: abandon.signal,
  });
  await stream.body!.getReader().read();
  abandon.abort();
  // The drain lets the stream run to its end in the worker; the abandoned socket must not keep the server open after.
  await within(gateway.close(), 'the gateway to close', 10_000);
});
