// The gateway's log over a real listening gateway: one JSON access line per request with its
// generation's figures and no text at info (the body and output at debug), request ids taken from
// x-request-id or made, echoed on every response (errors, SSE, WebSocket upgrades), carried to the
// worker, and on the error line of a 5xx.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { WebSocket } from 'ws';
import { within } from '../../test/wait.ts';
import { startTestGateway, MODEL_NAME, oneTokenPerStep, type TestGateway } from './harness.ts';
import type { Script } from './scripted-engine.ts';

type LogEntry = Record<string, unknown>;

/** Collects a logger's lines and waits for the one a test expects. */
class LogCapture {
  readonly entries: LogEntry[] = [];
  private readonly waiters: { matches: (entry: LogEntry) => boolean; resolve: (entry: LogEntry) => void }[] = [];
  readonly stream = {
    write: (line: string) => {
      const entry = JSON.parse(line) as LogEntry;
      this.entries.push(entry);
      for (const waiter of this.waiters.filter((w) => w.matches(entry))) {
        this.waiters.splice(this.waiters.indexOf(waiter), 1);
        waiter.resolve(entry);
      }
    },
  };

  waitFor(matches: (entry: LogEntry) => boolean, what: string): Promise<LogEntry> {
    const seen = this.entries.find(matches);
    if (seen !== undefined) return Promise.resolve(seen);
    return within(new Promise((resolve) => this.waiters.push({ matches, resolve })), what);
  }

  accessLine(requestId: string): Promise<LogEntry> {
    return this.waitFor((entry) => entry.request_id === requestId && (entry.msg === 'request completed' || entry.msg === 'connection closed'), `the access line of ${requestId}`);
  }
}

const PROMPT = 'the secret prompt words';
const OUTPUT = 'Hello there world';
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

let script: Script;
let gateway: TestGateway;
const log = new LogCapture();
let debugGateway: TestGateway;
const debugLog = new LogCapture();

before(async () => {
  gateway = await startTestGateway(() => script, { gatewayOptions: { logger: { level: 'info', stream: log.stream } } });
  debugGateway = await startTestGateway(() => script, { gatewayOptions: { logger: { level: 'debug', stream: debugLog.stream } } });
});
after(async () => {
  await gateway.close();
  await debugGateway.close();
});

function chat(target: TestGateway, init: { requestId?: string; stream?: boolean } = {}): Promise<Response> {
  return fetch(`${target.baseUrl}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(init.requestId === undefined ? {} : { 'x-request-id': init.requestId }) },
    body: JSON.stringify({ model: MODEL_NAME, messages: [{ role: 'user', content: PROMPT }], stream: init.stream === true }),
  });
}

test('a generation\'s access line has its id, route, status, duration, model, tokens, TTFT and finish reason, and no text at info', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens(OUTPUT)), finishReason: 'stop' };
  const response = await chat(gateway, { requestId: 'req-access-1' });
  assert.equal(response.status, 200);
  assert.equal(response.headers.get('x-request-id'), 'req-access-1');
  await response.json();
  const line = await log.accessLine('req-access-1');
  const request = gateway.engine.requests.at(-1)!;
  assert.equal(line.level, 'info');
  assert.equal(line.role, 'gateway');
  assert.match(String(line.time), /^\d{4}-\d\d-\d\dT/);
  assert.equal(line.method, 'POST');
  assert.equal(line.url, '/v1/chat/completions');
  assert.equal(line.route, '/v1/chat/completions');
  assert.equal(line.status, 200);
  assert.equal(typeof line.duration_ms, 'number');
  assert.equal(line.model, MODEL_NAME);
  assert.equal(line.prompt_tokens, request.promptTokenIds.length);
  assert.equal(line.completion_tokens, gateway.tokens(OUTPUT).length);
  assert.ok(typeof line.ttft_ms === 'number' && line.ttft_ms <= (line.duration_ms as number));
  assert.equal(line.finish_reason, 'stop');
  assert.equal(line.client_gone, undefined);
  const written = JSON.stringify(log.entries);
  for (const text of [PROMPT, 'secret', OUTPUT, 'there']) assert.ok(!written.includes(text), `"${text}" was logged at info`);
});

test('at debug the access line carries the request body and the output text', async () => {
  script = { steps: oneTokenPerStep(debugGateway.tokens(OUTPUT)), finishReason: 'stop' };
  await (await chat(debugGateway, { requestId: 'req-debug-1' })).json();
  const line = await debugLog.accessLine('req-debug-1');
  assert.equal((line.body as { messages: { content: string }[] }).messages[0].content, PROMPT);
  assert.equal(line.completion, OUTPUT);
});

test('the request id goes to the worker with every choice of the request', async () => {
  script = { steps: [gateway.tokens('ok')], finishReason: 'length' };
  const response = await fetch(`${gateway.baseUrl}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-request-id': 'req-to-worker' },
    body: JSON.stringify({ model: MODEL_NAME, prompt: 'a', n: 2 }),
  });
  await response.json();
  const requests = gateway.engine.requests.slice(-2);
  assert.deepEqual(requests.map((request) => request.externalRequestId), ['req-to-worker', 'req-to-worker']);
  // The worker's own ids stay unique per choice.
  assert.notEqual(requests[0].requestId, requests[1].requestId);
  const line = await log.accessLine('req-to-worker');
  assert.equal(line.completion_tokens, 2 * gateway.tokens('ok').length);
  assert.deepEqual(line.finish_reason, ['length', 'length']);
});

test('without x-request-id, or with an unsound one, the gateway makes an id, echoes it and logs under it', async () => {
  script = { steps: [gateway.tokens('ok')], finishReason: 'stop' };
  for (const header of [undefined, 'has a space', 'x'.repeat(129), '']) {
    const response = await chat(gateway, { requestId: header });
    await response.json();
    const requestId = response.headers.get('x-request-id')!;
    assert.match(requestId, UUID, `header ${JSON.stringify(header)}`);
    assert.equal(gateway.engine.requests.at(-1)!.externalRequestId, requestId);
    await log.accessLine(requestId);
  }
  // The longest sound id is kept.
  const longest = 'y'.repeat(128);
  const response = await chat(gateway, { requestId: longest });
  await response.json();
  assert.equal(response.headers.get('x-request-id'), longest);
});

test('errors, SSE streams and KServe answers carry the request id too', async () => {
  const missing = await fetch(`${gateway.baseUrl}/v1/nowhere`, { headers: { 'x-request-id': 'req-404' } });
  assert.equal(missing.status, 404);
  assert.equal(missing.headers.get('x-request-id'), 'req-404');
  assert.equal((await log.accessLine('req-404')).status, 404);

  script = { steps: oneTokenPerStep(gateway.tokens(OUTPUT)), finishReason: 'length' };
  const stream = await chat(gateway, { requestId: 'req-sse', stream: true });
  assert.equal(stream.headers.get('content-type'), 'text/event-stream; charset=utf-8');
  assert.equal(stream.headers.get('x-request-id'), 'req-sse');
  await stream.text();
  const streamLine = await log.accessLine('req-sse');
  assert.equal(streamLine.finish_reason, 'length');
  assert.equal(streamLine.completion_tokens, gateway.tokens(OUTPUT).length);

  const kserve = await fetch(`${gateway.baseUrl}/v2/models/${MODEL_NAME}/generate`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-request-id': 'req-kserve' },
    body: JSON.stringify({ text_input: 'hi', parameters: { max_tokens: 8 } }),
  });
  assert.equal(kserve.status, 200);
  assert.equal(kserve.headers.get('x-request-id'), 'req-kserve');
  await kserve.json();
  assert.equal(gateway.engine.requests.at(-1)!.externalRequestId, 'req-kserve');
  const kserveLine = await log.accessLine('req-kserve');
  assert.equal(kserveLine.model, MODEL_NAME);
  assert.equal(kserveLine.route, '/v2/models/:model/generate');
});

test('a WebSocket upgrade answers 101 with the request id; its access line comes when it closes', async () => {
  const socket = new WebSocket(`${gateway.baseUrl.replace('http', 'ws')}/v1/responses`, { headers: { 'x-request-id': 'req-ws' } });
  let upgradeId: unknown;
  socket.once('upgrade', (response) => (upgradeId = response.headers['x-request-id']));
  await within(new Promise((resolve, reject) => {
    socket.once('open', resolve);
    socket.once('error', reject);
  }), 'the upgrade');
  assert.equal(upgradeId, 'req-ws');
  script = { steps: [gateway.tokens('ok')], finishReason: 'stop' };
  socket.send(JSON.stringify({ type: 'response.create', model: MODEL_NAME, input: 'hi' }));
  await within(new Promise<void>((resolve) => {
    socket.on('message', (data) => {
      if ((JSON.parse(data.toString()) as { type: string }).type === 'response.completed') resolve();
    });
  }), 'the turn');
  assert.equal(gateway.engine.requests.at(-1)!.externalRequestId, 'req-ws');
  socket.close();
  const line = await log.accessLine('req-ws');
  assert.equal(line.msg, 'connection closed');
  assert.equal(line.status, 101);
  assert.equal(line.finish_reason, 'stop');
});

test('a client that leaves mid-stream gets an access line saying so, when it leaves', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens(OUTPUT)), hang: true };
  const controller = new AbortController();
  const response = await fetch(`${gateway.baseUrl}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-request-id': 'req-gone' },
    body: JSON.stringify({ model: MODEL_NAME, messages: [{ role: 'user', content: 'hi' }], stream: true }),
    signal: controller.signal,
  });
  const reader = response.body!.getReader();
  await reader.read();
  controller.abort();
  const line = await log.accessLine('req-gone');
  assert.equal(line.client_gone, true);
  assert.equal(line.status, 200);
  assert.equal(line.finish_reason, 'abort');
});

test('a 5xx leaves an error line with the request id and the stack, and the client only the public message', async () => {
  script = { steps: [], error: { code: 'internal_error', message: 'the runner lost /tmp/worker.sock' } };
  const response = await chat(gateway, { requestId: 'req-500' });
  assert.equal(response.status, 500);
  assert.equal(response.headers.get('x-request-id'), 'req-500');
  assert.ok(!(await response.text()).includes('worker.sock'));
  const errorLine = await log.waitFor((entry) => entry.request_id === 'req-500' && entry.level === 'error', 'the error line');
  assert.equal(errorLine.msg, 'request failed');
  const err = errorLine.err as { stack: string; detail: string };
  assert.match(err.stack, /ApiError/);
  assert.match(err.detail, /worker\.sock/);
  const line = await log.accessLine('req-500');
  assert.equal(line.status, 500);
  assert.equal(line.finish_reason, 'error');
});
