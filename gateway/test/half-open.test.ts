// Hostile and broken clients at the socket level, beside the timeouts of connections.test.ts and
// the slow reader of stream-limits.test.ts: many connections that send half a request and then
// nothing are freed by the headers and receive timeouts while everyone else is served at once;
// a client that half-closes its socket after sending a request is taken as gone (Node's default):
// its request is aborted in the worker and nothing is left in flight.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { after, before, test } from 'node:test';
import { within } from '../../test/wait.ts';
import { MODEL_NAME, oneTokenPerStep, sseEvents, startTestGateway, type TestGateway } from './harness.ts';
import { connect, parseResponse, postHead } from './raw-client.ts';
import type { Script } from './scripted-engine.ts';

const HEADERS_TIMEOUT_MS = 2_000;
const RECEIVE_TIMEOUT_MS = 3_000;
const NUM_HALF_OPEN = 40;

let gateway: TestGateway;
let script: Script = { steps: [] };
before(async () => {
  gateway = await startTestGateway(() => script, { limits: { headersTimeoutMs: HEADERS_TIMEOUT_MS, receiveTimeoutMs: RECEIVE_TIMEOUT_MS } });
});
after(() => gateway.close());

const body = JSON.stringify({ model: MODEL_NAME, prompt: 'x', max_tokens: 4 });

test(`${NUM_HALF_OPEN} connections with half a request and then silence are freed by the timeouts; others are served meanwhile`, { timeout: 20_000 }, async () => {
  script = { steps: [gateway.tokens('ok')], finishReason: 'stop' };
  const head = postHead('/v1/completions', Buffer.byteLength(body));
  let numClosed = 0;
  const halfOpen = await Promise.all(Array.from({ length: NUM_HALF_OPEN }, async (_, i) => {
    const connection = await connect(gateway.baseUrl);
    // Half of them stop inside the headers, half inside the body.
    connection.socket.write(i % 2 === 0 ? head.slice(0, head.length >> 1) : head + body.slice(0, body.length >> 1));
    void connection.closed.then(() => numClosed++);
    return connection;
  }));
  // While they hang, a whole request is answered.
  const served = await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x', max_tokens: 4 });
  assert.equal(served.status, 200);
  assert.equal(numClosed, 0, 'served while every stalled connection was still open');
  // Each stalled connection is closed with a 408 in the OpenAI envelope.
  await within(Promise.all(halfOpen.map((connection) => connection.closed)), 'the stalled connections closed', RECEIVE_TIMEOUT_MS + 5_000);
  for (const connection of halfOpen) {
    const { status, body: received } = parseResponse(connection.received());
    assert.equal(status, 408);
    assert.equal(JSON.parse(received).error.code, 'receive_timeout');
  }
  assert.equal(gateway.engine.numInFlight, 0);
});

test('a client that half-closes after its request is taken as gone: its request is aborted, nothing stays in flight, others are served', { timeout: 20_000 }, async () => {
  // Node's HTTP server (httpAllowHalfOpen false, its default) ends a connection whose client has
  // ended its side, as most servers do; what matters is that nothing is left behind.
  script = { steps: oneTokenPerStep(gateway.tokens(' one two three four')), stepIntervalMs: 20, finishReason: 'length' };
  for (const stream of [false, true]) {
    const request = JSON.stringify({ model: MODEL_NAME, prompt: 'x', stream });
    const numRequestsBefore = gateway.engine.requests.length;
    const connection = await connect(gateway.baseUrl);
    connection.socket.end(postHead('/v1/completions', Buffer.byteLength(request)) + request);
    await within(connection.closed, `the ${stream ? 'streamed' : 'plain'} request's half-closed connection closed`);
    // Nothing, or (streamed) the head of a response the server began before it saw the end.
    const received = connection.received().toString('latin1');
    assert.ok(received === '' || received.startsWith('HTTP/1.1 200 OK\r\n'), JSON.stringify(received.slice(0, 200)));
    const started = gateway.engine.requests.slice(numRequestsBefore);
    assert.equal(started.length, 1);
    const { requestId } = started[0];
    await within((async () => {
      while (!gateway.engine.abortedRequestIds.includes(requestId)) await once(gateway.engine, 'abort');
    })(), `stream: ${stream}: the worker's request aborted`);
  }
  assert.equal(gateway.engine.numInFlight, 0);
  const served = await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x', stream: true });
  assert.equal(served.status, 200);
  assert.equal(sseEvents(await served.text()).at(-1), '[DONE]');
});
