// Bad input gives a clear message and a report that counts the failures, never a crash.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { main } from '../cli.ts';
import { runLoadtest } from '../run.ts';
import { startScriptedServer } from '../scripted-sse-server.ts';

/** A port with nothing listening: bind one, then close it. */
async function closedPortUrl(): Promise<string> {
  const server = http.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return `http://127.0.0.1:${port}`;
}

test('server errors mid-stream are counted by type and the other requests still measured', async () => {
  const endings = ['done', 'error', 'hangup', 'done', 'http', 'done'] as const;
  const server = await startScriptedServer({
    script: (_request, index) => {
      const ending = endings[index % endings.length];
      if (ending === 'http') return { status: 500, chunks: [] };
      return { chunks: [{ delayMs: 5, text: 'x' }, { delayMs: 5, text: 'y' }], ending, usage: { promptTokens: 3, completionTokens: 2 } };
    },
  });
  try {
    const results = await runLoadtest({
      url: server.baseUrl,
      model: 'scripted',
      endpoint: 'completions',
      workload: { kind: 'scenario', scenario: { name: 'fixed', inputTokens: 4, outputTokens: 2 }, numRequests: 12 },
      load: { kind: 'concurrency', numClientsList: [1] },
    });
    assert.equal(results.num_requests, 12);
    assert.equal(results.num_succeeded, 6);
    assert.deepEqual(results.errors.by_type, { stream_error: 2, stream_incomplete: 2, http_500: 2 });
    assert.equal(results.errors.total, 6);
    assert.match(results.errors.examples.stream_error, /scripted mid-stream failure/);
    assert.match(results.errors.examples.http_500, /scripted failure 500/);
    assert.equal(results.e2e_ms.count, 6);
    assert.match(results.prompt_lengths, /^estimated: one word per token \(POST \/tokenize answered 404\)/);
    assert.equal(results.requests.filter((request) => request.error !== null).length, 6);
  } finally {
    await server.close();
  }
});

for (const numClients of [1, 4]) test(`a kept-alive connection the server resets as the next request arrives (llama-server does) is retried once on a new one, at ${numClients} client(s)`, async () => {
  const numRequestsBySocket = new Map<unknown, number>();
  let numReset = 0;
  const server = http.createServer((request, response) => {
    const numBefore = numRequestsBySocket.get(request.socket) ?? 0;
    numRequestsBySocket.set(request.socket, numBefore + 1);
    if (request.url !== '/v1/completions') return void response.writeHead(404).end();
    // Every connection answers one request; a second on it is reset before any answer.
    if (numBefore > 0) {
      numReset++;
      return void request.socket.resetAndDestroy();
    }
    request.resume().on('end', () => {
      response.writeHead(200, { 'content-type': 'text/event-stream' });
      response.end(`data: ${JSON.stringify({ choices: [{ text: 'x' }] })}\n\ndata: [DONE]\n\n`);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  try {
    const { port } = server.address() as AddressInfo;
    const results = await runLoadtest({
      url: `http://127.0.0.1:${port}`,
      model: 'resets',
      endpoint: 'completions',
      // Several clients leave several used connections in the pool: the retry must not take one of them.
      workload: { kind: 'scenario', scenario: { name: 'fixed', inputTokens: 4, outputTokens: 1 }, numRequests: 4 * numClients },
      load: { kind: 'concurrency', numClientsList: [numClients] },
    });
    assert.deepEqual(results.errors.by_type, {});
    assert.equal(results.num_succeeded, 4 * numClients);
    assert.ok(numReset >= 1, 'no request went out on a kept-alive connection: the test measured nothing');
  } finally {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
});

test('a /tokenize of another shape (llama-server reads content, not prompt) is not taken for a tokenizer', async () => {
  const server = await startScriptedServer({ tokenizer: 'content', script: () => ({ chunks: [{ text: 'a', delayMs: 0 }, { text: 'b', delayMs: 0 }] }) });
  try {
    const results = await runLoadtest({
      url: server.baseUrl,
      model: 'scripted',
      endpoint: 'completions',
      workload: { kind: 'scenario', scenario: { name: 'fixed', inputTokens: 4, outputTokens: 2 }, numRequests: 2 },
      load: { kind: 'concurrency', numClientsList: [1] },
    });
    assert.equal(results.num_succeeded, 2);
    assert.match(results.prompt_lengths, /^estimated: one word per token \(POST \/tokenize gave a word no tokens/);
  } finally {
    await server.close();
  }
});

test('an unreachable server gives a report of connection failures and exit code 1', async (t) => {
  const url = await closedPortUrl();
  const results = await runLoadtest({
    url,
    model: 'none',
    endpoint: 'chat',
    workload: { kind: 'scenario', scenario: { name: 'fixed', inputTokens: 4, outputTokens: 2 }, numRequests: 3 },
    load: { kind: 'rate', ratesPerS: [100] },
  });
  assert.deepEqual(results.errors.by_type, { connection: 3 });
  assert.equal(results.errors.examples.connection, 'ECONNREFUSED');
  assert.equal(results.num_succeeded, 0);
  assert.equal(results.ttft_ms.count, 0);

  const outDir = await mkdtemp(path.join(os.tmpdir(), 'loadtest-'));
  const errors: string[] = [];
  t.mock.method(console, 'error', (message: string) => errors.push(message));
  t.mock.method(console, 'log', () => {});
  try {
    const code = await main(['--url', url, '--model', 'none', '--scenario', 'fixed', '--requests', '2', '--quiet', '--out', outDir]);
    assert.equal(code, 1);
    assert.match(errors.join('\n'), new RegExp(`every request to ${url} failed \\(2 × connection: ECONNREFUSED\\)`));
    const written = JSON.parse(await readFile(path.join(outDir, 'results.json'), 'utf8'));
    assert.deepEqual(written.errors.by_type, { connection: 2 });
    assert.equal(written.ttft_ms.p50, null);
  } finally {
    await rm(outDir, { recursive: true, force: true });
  }
});

test('a malformed workload file or bad flags exit 2 with the reason, before any request', async (t) => {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'loadtest-'));
  const errors: string[] = [];
  t.mock.method(console, 'error', (message: string) => errors.push(message));
  try {
    const file = path.join(dir, 'bad.jsonl');
    await writeFile(file, '{"input_tokens": 8, "output_tokens": 4}\n{"input_tokens": 8, "output_tokens": "four"}\n');
    const url = await closedPortUrl();
    assert.equal(await main(['--url', url, '--model', 'm', '--scenario', file]), 2);
    assert.match(errors.pop()!, /bad\.jsonl:2: expected a positive integer for output_tokens but received "four" of type string/);
    assert.equal(await main(['--url', url, '--model', 'm', '--scenario', path.join(dir, 'missing.jsonl')]), 2);
    assert.match(errors.pop()!, /cannot read workload file .*missing\.jsonl/);
    assert.equal(await main(['--url', url, '--model', 'm', '--scenario', 'sharedprefix']), 2);
    assert.match(errors.pop()!, /unknown scenario "sharedprefix"/);
    assert.equal(await main(['--url', url, '--model', 'm', '--scenario', 'fixed', '--rate', '0']), 2);
    assert.match(errors.pop()!, /expected positive numbers for --rate but received "0"/);
    assert.equal(await main(['--url', url, '--scenario', 'fixed', '--bogus']), 2);
    assert.match(errors.pop()!, /Unknown option '--bogus'/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
