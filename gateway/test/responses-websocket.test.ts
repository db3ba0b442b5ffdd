// WebSocket mode on /v1/responses, through the official SDK's ResponsesWS (and raw `ws` clients
// where a test needs to misbehave: stop reading, ignore pings), over a real gateway on a scripted
// engine.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { after, before, test } from 'node:test';
import OpenAI from 'openai';
import type { ResponsesClientEvent, ResponsesServerEvent } from 'openai/resources/responses/responses';
import { ResponsesWS } from 'openai/resources/responses/ws';
import { WebSocket } from 'ws';
import type { GenerateRequest } from '../../engine/types.ts';
import { pollUntil, within } from '../../test/wait.ts';
import { MODEL_NAME, oneTokenPerStep, startTestGateway, type TestGateway, type TestGatewayOptions } from './harness.ts';
import type { Script } from './scripted-engine.ts';

type CreateBody = Omit<ResponsesClientEvent, 'type'> & { generate?: boolean };
type ErrorEvent = Extract<ResponsesServerEvent, { type: 'error' }> & { status: number };
type TerminalEvent = Extract<ResponsesServerEvent, { type: 'response.completed' | 'response.incomplete' | 'response.failed' }>;

let gateway: TestGateway;
let client: OpenAI;
let script: Script = { steps: [] };
before(async () => {
  gateway = await startTestGateway(() => script);
  client = clientOf(gateway);
});
after(() => gateway.close());

function clientOf(target: TestGateway): OpenAI {
  return new OpenAI({ baseURL: `${target.baseUrl}/v1`, apiKey: 'unused', maxRetries: 0 });
}

function wsUrlOf(target: TestGateway): string {
  return `${target.baseUrl.replace(/^http/, 'ws')}/v1/responses`;
}

/** Error events are read from 'event' like the rest; the listener keeps the SDK from raising them as unhandled. */
function connect(target: OpenAI = client): ResponsesWS {
  const rws = new ResponsesWS(target);
  rws.on('error', () => {});
  return rws;
}

const isTerminal = (event: ResponsesServerEvent) =>
  event.type === 'error' || event.type === 'response.completed' || event.type === 'response.incomplete' || event.type === 'response.failed';

/** The events from now until a terminal or error event. */
function eventsUntilEnd(rws: ResponsesWS): Promise<ResponsesServerEvent[]> {
  return new Promise((resolve) => {
    const events: ResponsesServerEvent[] = [];
    const onEvent = (event: ResponsesServerEvent) => {
      events.push(event);
      if (!isTerminal(event)) return;
      rws.off('event', onEvent);
      resolve(events);
    };
    rws.on('event', onEvent);
  });
}

/** One response.create, and its events to the end. */
async function turn(rws: ResponsesWS, body: CreateBody): Promise<ResponsesServerEvent[]> {
  const ended = eventsUntilEnd(rws);
  rws.send({ type: 'response.create', ...body } as ResponsesClientEvent);
  return ended;
}

function terminalOf(events: ResponsesServerEvent[]): TerminalEvent {
  const last = events.at(-1)!;
  assert.ok(last.type !== 'error', `the turn failed: ${JSON.stringify(last)}`);
  return last as TerminalEvent;
}

/** The one event an invalid frame gets. */
async function errorFor(rws: ResponsesWS, send: () => void): Promise<ErrorEvent> {
  const ended = eventsUntilEnd(rws);
  send();
  const events = await ended;
  assert.equal(events.length, 1);
  assert.equal(events[0].type, 'error');
  return events[0] as ErrorEvent;
}

function textOf(events: ResponsesServerEvent[]): string {
  return events.map((event) => (event.type === 'response.output_text.delta' ? event.delta : '')).join('');
}

function promptOf(request: GenerateRequest, target: TestGateway = gateway): string {
  return target.tokenizer.decode(request.promptTokenIds, { skipSpecialTokens: false });
}

function closed(rws: ResponsesWS): Promise<[code: number, reason: string]> {
  return new Promise((resolve) => rws.on('close', (code, reason) => resolve([code, reason])));
}

async function withGateway(scriptFor: (request: GenerateRequest) => Script, options: TestGatewayOptions, body: (target: TestGateway) => Promise<void>) {
  const target = await startTestGateway(scriptFor, options);
  try {
    await body(target);
  } finally {
    await target.close();
  }
}

test('turns chain by previous_response_id from the connection, without the history sent again, even with store: false', async () => {
  const rws = connect();
  script = { steps: oneTokenPerStep(gateway.tokens('Paris it is.')), finishReason: 'stop' };
  const first = await turn(rws, { model: MODEL_NAME, input: 'France?', store: false });
  assert.deepEqual(first.map((event) => event.type), [
    'response.created',
    'response.in_progress',
    'response.output_item.added',
    'response.content_part.added',
    ...Array<string>(gateway.tokens('Paris it is.').length).fill('response.output_text.delta'),
    'response.output_text.done',
    'response.content_part.done',
    'response.output_item.done',
    'response.completed',
  ]);
  assert.deepEqual(first.map((event) => event.sequence_number), first.map((_, i) => i));
  assert.equal(textOf(first), 'Paris it is.');
  const firstResponse = terminalOf(first).response;
  assert.equal((firstResponse as unknown as { store: boolean }).store, false);

  script = { steps: [gateway.tokens('Berlin.')], finishReason: 'stop' };
  const second = await turn(rws, { model: MODEL_NAME, input: 'Germany?', previous_response_id: firstResponse.id, store: false });
  assert.equal(second[0].sequence_number, 0);
  assert.equal(terminalOf(second).response.previous_response_id, firstResponse.id);
  assert.equal(promptOf(gateway.engine.requests.at(-1)!), '<|user|>France?<|endoftext|><|assistant|>Paris it is.<|endoftext|><|user|>Germany?<|endoftext|><|assistant|>');

  // Unstored: no other connection, and no HTTP request, can continue it.
  const other = connect();
  const notFound = await errorFor(other, () => other.send({ type: 'response.create', model: MODEL_NAME, input: 'x', previous_response_id: firstResponse.id }));
  assert.deepEqual({ ...notFound }, {
    type: 'error',
    status: 400,
    code: 'previous_response_not_found',
    message: `Previous response with id '${firstResponse.id}' not found.`,
    param: 'previous_response_id',
    error: {
      type: 'invalid_request_error',
      code: 'previous_response_not_found',
      message: `Previous response with id '${firstResponse.id}' not found.`,
      param: 'previous_response_id',
    },
  });
  await assert.rejects(client.responses.retrieve(firstResponse.id), OpenAI.NotFoundError);
  rws.close();
  other.close();
});

test('stored responses continue across connections and HTTP', async () => {
  script = { steps: [gateway.tokens('One.')], finishReason: 'stop' };
  const overHttp = await client.responses.create({ model: MODEL_NAME, input: 'Count' });
  const rws = connect();
  script = { steps: [gateway.tokens('Two.')], finishReason: 'stop' };
  const overWs = terminalOf(await turn(rws, { model: MODEL_NAME, input: 'More', previous_response_id: overHttp.id })).response;
  rws.close();
  script = { steps: [gateway.tokens('Three.')], finishReason: 'stop' };
  const later = connect();
  await turn(later, { model: MODEL_NAME, input: 'Again', previous_response_id: overWs.id });
  later.close();
  assert.equal(
    promptOf(gateway.engine.requests.at(-1)!),
    '<|user|>Count<|endoftext|><|assistant|>One.<|endoftext|><|user|>More<|endoftext|><|assistant|>Two.<|endoftext|><|user|>Again<|endoftext|><|assistant|>',
  );
  assert.equal((await client.responses.retrieve(overWs.id)).output_text, 'Two.');
});

test('generate: false prefills the prompt (one token, discarded) and returns an id the next turn extends', async () => {
  const rws = connect();
  script = { steps: [gateway.tokens('x')], finishReason: 'length' };
  const warm = await turn(rws, { model: MODEL_NAME, instructions: 'Be terse.', input: 'Shared context', generate: false });
  assert.deepEqual(warm.map((event) => event.type), ['response.created', 'response.in_progress', 'response.completed']);
  const warmRequest = gateway.engine.requests.at(-1)!;
  assert.deepEqual({ ...warmRequest.sampling }, { maxTokens: 1 });
  // No generation prompt: the turn that continues it extends this prompt, so its KV is reused.
  assert.equal(promptOf(warmRequest), '<|system|>Be terse.<|endoftext|><|user|>Shared context<|endoftext|>');
  const warmResponse = terminalOf(warm).response;
  assert.equal(warmResponse.status, 'completed');
  assert.deepEqual(warmResponse.output, []);
  assert.deepEqual(warmResponse.usage, {
    input_tokens: warmRequest.promptTokenIds.length,
    input_tokens_details: { cached_tokens: 0 },
    output_tokens: 0,
    output_tokens_details: { reasoning_tokens: 0 },
    total_tokens: warmRequest.promptTokenIds.length,
  });

  script = { steps: [gateway.tokens('Sure.')], finishReason: 'stop' };
  const next = await turn(rws, { model: MODEL_NAME, instructions: 'Be terse.', input: 'Go', previous_response_id: warmResponse.id });
  assert.equal(textOf(next), 'Sure.');
  const nextRequest = gateway.engine.requests.at(-1)!;
  assert.deepEqual(nextRequest.promptTokenIds.slice(0, warmRequest.promptTokenIds.length), warmRequest.promptTokenIds);
  assert.equal(promptOf(nextRequest), `${promptOf(warmRequest)}<|user|>Go<|endoftext|><|assistant|>`);
  rws.close();
});

test('a second response.create while one runs gets response_already_in_flight; closing the socket aborts the first in the worker', async () => {
  const rws = connect();
  script = { steps: [gateway.tokens('Hello')], hang: true };
  const firstDelta = new Promise((resolve) => rws.on('response.output_text.delta', resolve));
  rws.send({ type: 'response.create', model: MODEL_NAME, input: 'long one' });
  await within(firstDelta, 'the first response\'s first delta');
  const running = gateway.engine.requests.at(-1)!;
  const numRequests = gateway.engine.requests.length;
  const refused = await within(errorFor(rws, () => rws.send({ type: 'response.create', model: MODEL_NAME, input: 'another' })), 'the second response.create\'s error');
  assert.equal(refused.code, 'response_already_in_flight');
  assert.equal(refused.status, 409);
  assert.equal(gateway.engine.requests.length, numRequests);

  const aborted = once(gateway.engine, 'abort');
  rws.close();
  const [requestId] = await within(aborted, 'the worker\'s abort of the first response');
  assert.equal(requestId, running.requestId);
  assert.equal(gateway.engine.numInFlight, 0);
});

test('bad frames get error events and the connection keeps serving', async () => {
  const rws = connect();
  const notJson = await errorFor(rws, () => rws.sendRaw('{"type": "response.create",'));
  assert.equal(notJson.code, 'invalid_json');
  const binary = await errorFor(rws, () => rws.sendRaw(new Uint8Array([1, 2, 3])));
  assert.equal(binary.code, 'invalid_request');
  const unknownType = await errorFor(rws, () => rws.sendRaw(JSON.stringify({ type: 'response.cancel' })));
  assert.deepEqual([unknownType.code, unknownType.param], ['invalid_request', 'type']);
  const badParam = await errorFor(rws, () => rws.send({ type: 'response.create', model: MODEL_NAME, input: 'hi', temperature: 9 }));
  assert.deepEqual([badParam.code, badParam.param, badParam.status], ['invalid_request', 'temperature', 400]);
  const badModel = await errorFor(rws, () => rws.send({ type: 'response.create', model: 'nope', input: 'hi' }));
  assert.deepEqual([badModel.code, badModel.status], ['model_not_found', 404]);
  const tools = await errorFor(rws, () => rws.send({ type: 'response.create', model: MODEL_NAME, input: 'hi', background: true }));
  assert.deepEqual([tools.code, tools.param], ['unsupported_parameter', 'background']);
  script = { steps: [[]], error: { code: 'kv_cache_too_small', message: 'needs 9 blocks' } };
  const workerError = await errorFor(rws, () => rws.send({ type: 'response.create', model: MODEL_NAME, input: 'hi' }));
  assert.deepEqual([workerError.code, workerError.message], ['kv_cache_too_small', 'needs 9 blocks']);

  script = { steps: [gateway.tokens('fine')], finishReason: 'stop' };
  // `stream: true`, which the agents SDK sends, changes nothing here.
  assert.equal(textOf(await turn(rws, { model: MODEL_NAME, input: 'hi', stream: true })), 'fine');
  rws.close();
});

test('50 connections at once each complete a turn', { timeout: 30_000 }, async () => {
  script = { steps: oneTokenPerStep(gateway.tokens('Hi there, you')), finishReason: 'stop' };
  const connections = Array.from({ length: 50 }, () => connect());
  const results = await Promise.all(connections.map((rws, i) => turn(rws, { model: MODEL_NAME, input: `user ${i}` })));
  for (const events of results) {
    assert.equal(terminalOf(events).type, 'response.completed');
    assert.equal(textOf(events), 'Hi there, you');
  }
  assert.equal(new Set(results.map((events) => terminalOf(events).response.id)).size, 50);
  for (const rws of connections) rws.close();
});

test('the connection closes at its time limit (1001, websocket_connection_limit_reached), aborting its response', async () => {
  await withGateway(() => ({ steps: [[15496]], hang: true }), { responses: { websocketMaxConnectionMs: 300 } }, async (target) => {
    const rws = connect(clientOf(target));
    const whenClosed = closed(rws);
    const ended = eventsUntilEnd(rws);
    const aborted = once(target.engine, 'abort');
    rws.send({ type: 'response.create', model: MODEL_NAME, input: 'hi' });
    const events = await within(ended, 'the limit\'s error event');
    const limit = events.at(-1) as ErrorEvent;
    assert.equal(limit.code, 'websocket_connection_limit_reached');
    assert.match(limit.message, /connection limit reached/);
    assert.deepEqual(await within(whenClosed, 'the close at the time limit'), [1001, 'connection time limit reached']);
    const [requestId] = await within(aborted, 'the worker\'s abort');
    assert.equal(requestId, target.engine.requests[0].requestId);
  });
});

test('keepalive: the server pings, and drops a peer that stops answering', async () => {
  await withGateway(() => ({ steps: [] }), { responses: { websocketPingIntervalMs: 100 } }, async (target) => {
    const answering = new WebSocket(wsUrlOf(target));
    let numPings = 0;
    answering.on('ping', () => numPings++);
    const silent = new WebSocket(wsUrlOf(target), { autoPong: false });
    const [code] = await within(once(silent, 'close'), 'the silent peer\'s termination');
    // Terminated, not closed: the peer was not answering, so there is no one to say goodbye to.
    assert.equal(code, 1006);
    assert.ok(numPings >= 2, `pings seen: ${numPings}`);
    assert.equal(answering.readyState, WebSocket.OPEN);
    answering.close();
  });
});

test("a slow reader's response is cancelled at the buffer bound while other connections keep streaming", { timeout: 60_000 }, async () => {
  const maxBufferedBytes = 64 * 1024;
  const word = 15496; // 'Hello'
  // Far more than the socket buffers on both ends hold: about 30 MB of events.
  const flood: Script = { steps: Array<number[]>(40_000).fill(Array<number>(100).fill(word)) };
  let target!: TestGateway;
  await withGateway(
    (request) => (promptOf(request, target).includes('flood') ? flood : { steps: oneTokenPerStep(target.tokens('Hi there, you')), finishReason: 'stop' }),
    { limits: { streamMaxBufferedBytes: maxBufferedBytes } },
    async (started) => {
      target = started;
      const slow = new WebSocket(wsUrlOf(target));
      await once(slow, 'open');
      const floodAborted = once(target.engine, 'abort');
      slow.send(JSON.stringify({ type: 'response.create', model: MODEL_NAME, input: 'flood' }));
      await once(slow, 'message');
      slow.pause();

      const others = Array.from({ length: 3 }, () => connect(clientOf(target)));
      const results = await Promise.all(others.map((rws, i) => turn(rws, { model: MODEL_NAME, input: `other ${i}` })));
      for (const events of results) assert.equal(textOf(events), 'Hi there, you');
      const [abortedId] = await floodAborted;
      assert.equal(abortedId, target.engine.requests[0].requestId);
      for (const rws of others) rws.close();

      // Reading again, the client gets what was queued, the error, and the close.
      let numBytes = 0;
      let last = '';
      slow.on('message', (data: Buffer) => {
        numBytes += data.length;
        last = data.toString();
      });
      const whenClosed = once(slow, 'close');
      slow.resume();
      const [code] = await whenClosed;
      assert.equal(code, 1008);
      const error = JSON.parse(last) as ErrorEvent;
      assert.equal(error.type, 'error');
      assert.equal(error.code, 'client_too_slow');
      assert.match(error.message, new RegExp(`more than the ${maxBufferedBytes}-byte limit`));
      // A small part of the script went out: the response stopped early.
      assert.ok(numBytes < 15_000_000, `bytes received: ${numBytes}`);
    },
  );
});

test("a reader that takes nothing while a finished response's closing events wait is cut: client_too_slow, 1008", { timeout: 120_000 }, async () => {
  // Deltas of about 12 MB (with 20 alternatives per token) stay under a 16 MiB bound, the
  // socket buffers taking some of them; the closing events repeat all of it four times over.
  const maxBufferedBytes = 16 * 1024 * 1024;
  const word = 15496; // 'Hello'
  const longScript: Script = { steps: Array<number[]>(110).fill(Array<number>(100).fill(word)), finishReason: 'length' };
  await withGateway(() => longScript, { limits: { streamMaxBufferedBytes: maxBufferedBytes }, responses: { slowReaderGraceMs: 1000 } }, async (target) => {
    const slow = new WebSocket(wsUrlOf(target));
    await once(slow, 'open');
    slow.send(JSON.stringify({ type: 'response.create', model: MODEL_NAME, input: 'long', include: ['message.output_text.logprobs'], top_logprobs: 20 }));
    await once(slow, 'message');
    slow.pause();
    // The generation ends (a scripted worker; its 12 MB of deltas take seconds on a loaded
    // machine), then the reader takes nothing for three times the grace.
    await pollUntil(async () => {
      await new Promise((resolve) => setTimeout(resolve, 50));
      return target.engine.numInFlight === 0;
    }, 'the scripted generation to end', 60_000);
    await new Promise((resolve) => setTimeout(resolve, 3000));
    const types: string[] = [];
    let last = '';
    slow.on('message', (data: Buffer) => {
      last = data.toString();
      types.push((JSON.parse(last) as { type: string }).type);
    });
    const whenClosed = once(slow, 'close');
    slow.resume();
    const [code] = await within(whenClosed, `the server's close (the events read: ${types.filter((type) => !type.endsWith('.delta')).join(', ')})`, 20_000);
    assert.equal(code, 1008);
    const error = JSON.parse(last) as ErrorEvent;
    assert.equal(error.code, 'client_too_slow');
    assert.ok(!types.includes('response.completed') && !types.includes('response.incomplete'), `closing events: ${types.filter((type) => !type.endsWith('.delta')).join(', ')}`);
  });
});

test('the agents SDK runs an Agent over its Responses WebSocket model', { timeout: 20_000 }, async () => {
  // Node 20 has no global WebSocket; the agents SDK takes the `ws` package's, which accepts headers.
  const globals = globalThis as { WebSocket?: unknown };
  const previousWebSocket = globals.WebSocket;
  globals.WebSocket = WebSocket;
  const { Agent, setTracingDisabled, withResponsesWebSocketSession } = await import('@openai/agents');
  setTracingDisabled(true);
  try {
    script = { steps: oneTokenPerStep(gateway.tokens('Hello from Conduit.')), finishReason: 'stop' };
    const agent = new Agent({ name: 'Greeter', instructions: 'Greet the user.', model: MODEL_NAME });
    const result = await withResponsesWebSocketSession(
      ({ run }) => run(agent, 'Hi!'),
      { providerOptions: { apiKey: 'unused', baseURL: `${gateway.baseUrl}/v1` } },
    );
    assert.equal(result.finalOutput, 'Hello from Conduit.');
    assert.equal(promptOf(gateway.engine.requests.at(-1)!), '<|system|>Greet the user.<|endoftext|><|user|>Hi!<|endoftext|><|assistant|>');
  } finally {
    globals.WebSocket = previousWebSocket;
  }
});

test('each WebSocket connection counts once in conduit_http_requests_total, as a 101', async () => {
  const metricsOf = async () => {
    const text = await (await fetch(`${gateway.metricsUrl}/metrics`)).text();
    return Number(/conduit_http_requests_total\{endpoint="\/v1\/responses",status_code="101"\} (\d+)/.exec(text)?.[1] ?? 0);
  };
  const before = await metricsOf();
  const rws = connect();
  script = { steps: [gateway.tokens('x')], finishReason: 'stop' };
  await turn(rws, { model: MODEL_NAME, input: 'hi' });
  await turn(rws, { model: MODEL_NAME, input: 'hi' });
  const whenClosed = closed(rws);
  rws.close();
  await whenClosed;
  // The server sees the close after the client does.
  let after = await metricsOf();
  for (let i = 0; i < 50 && after === before; i++) {
    await new Promise((resolve) => setTimeout(resolve, 10));
    after = await metricsOf();
  }
  assert.equal(after, before + 1);
});

test('a message over the body limit closes the socket with 1009', async () => {
  const rws = connect();
  const whenClosed = closed(rws);
  rws.send({ type: 'response.create', model: MODEL_NAME, input: 'x'.repeat(5000) });
  const [code] = await whenClosed;
  assert.equal(code, 1009);
});
