// The real `conduit serve` on conduit-tiny: its stdout is JSON lines, a request's id reaches the
// gateway's access line and the worker's line about it, and /metrics has the worker's figures.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { boundedFetch, defaultModelDir, repoRoot, within } from './harness.ts';

type LogEntry = Record<string, unknown>;

test('conduit serve logs JSON lines on stdout: an access line per request under its id, the worker\'s line of an abort under the same id', { timeout: 120_000 }, async (t) => {
  const server = spawn(
    process.execPath,
    [path.join(repoRoot, 'bin', 'conduit.js'), 'serve', '--model', defaultModelDir, '--http-port', '0', '--metrics-port', '0', '--log-level', 'info'],
    { stdio: ['ignore', 'pipe', 'pipe'], detached: true },
  );
  const exited = new Promise<number | null>((resolve) => server.once('exit', (code) => resolve(code)));
  t.after(() => {
    try {
      process.kill(-server.pid!, 'SIGKILL');
    } catch {
      // Gone already.
    }
  });
  const lines: string[] = [];
  const waiters: { matches: (entry: LogEntry) => boolean; resolve: (entry: LogEntry) => void }[] = [];
  createInterface({ input: server.stdout }).on('line', (line) => {
    lines.push(line);
    let entry: LogEntry;
    try {
      entry = JSON.parse(line);
    } catch {
      return;
    }
    for (const waiter of waiters.filter((w) => w.matches(entry))) {
      waiters.splice(waiters.indexOf(waiter), 1);
      waiter.resolve(entry);
    }
  });
  const lineLike = (matches: (entry: LogEntry) => boolean, what: string) =>
    within(new Promise<LogEntry>((resolve) => {
      const seen = lines.map((line) => { try { return JSON.parse(line) as LogEntry; } catch { return null; } }).find((e) => e !== null && matches(e));
      if (seen) resolve(seen);
      else waiters.push({ matches, resolve });
    }), what);

  let stderr = '';
  const [httpAddress, metricsAddress] = await within(new Promise<string[]>((resolve, reject) => {
    server.stderr.on('data', (data: Buffer) => {
      stderr += data.toString();
      const match = /serving on (http:\/\/\S+) \(metrics (http:\/\/[^\s,)]+)/.exec(stderr);
      if (match) resolve([match[1], match[2]].map((url) => url.replace('0.0.0.0', '127.0.0.1')));
    });
    server.once('exit', () => reject(new Error(`server exited before serving:\n${stderr}`)));
  }), 'serving');

  const requestId = 'itest-logs-1';
  const response = await boundedFetch(`${httpAddress}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-request-id': requestId },
    body: JSON.stringify({ model: 'conduit-tiny', prompt: 'Once upon a time', max_tokens: 6, ignore_eos: true }),
  });
  assert.equal(response.status, 200);
  assert.equal(response.headers.get('x-request-id'), requestId);
  await response.json();
  const access = await lineLike((entry) => entry.request_id === requestId && entry.msg === 'request completed', 'the access line');
  assert.equal(access.role, 'gateway');
  assert.equal(access.model, 'conduit-tiny');
  assert.equal(access.status, 200);
  assert.equal(access.completion_tokens, 6);
  assert.equal(access.finish_reason, 'length');
  assert.equal(typeof access.ttft_ms, 'number');
  assert.ok(!JSON.stringify(access).includes('Once upon'), 'no prompt text at info');

  // A stop string ends a request the worker would run on: the gateway aborts it there, and the
  // worker logs the abort under the same id. (Any text of this model holds a space soon.)
  const stoppedId = `${requestId}-stopped`;
  const stopped = await boundedFetch(`${httpAddress}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-request-id': stoppedId },
    body: JSON.stringify({ model: 'conduit-tiny', prompt: 'Twice', max_tokens: 2000, ignore_eos: true, stop: [' '] }),
  });
  assert.equal(((await stopped.json()) as { choices: { finish_reason: string }[] }).choices[0].finish_reason, 'stop');
  const workerLine = await lineLike((entry) => entry.request_id === stoppedId && entry.role === 'worker', 'the worker\'s abort line');
  assert.equal(workerLine.msg, 'request aborted');
  const stoppedLine = await lineLike((entry) => entry.request_id === stoppedId && entry.role === 'gateway', 'the gateway\'s access line');
  assert.equal(stoppedLine.finish_reason, 'stop');

  const metrics = await (await boundedFetch(`${metricsAddress}/metrics`)).text();
  assert.match(metrics, /conduit_request_queue_time_seconds_count\{model_name="conduit-tiny"\} [1-9]/);
  assert.match(metrics, /conduit_request_success_total\{model_name="conduit-tiny",finished_reason="length"\} 1/);
  // The worker's RSS, from its step reports: a loaded model holds more than 10 MB.
  const rss = /conduit_worker_resident_memory_bytes\{model_name="conduit-tiny",worker="[^"]+"\} (\d+)/.exec(metrics);
  assert.ok(rss !== null && Number(rss[1]) > 10_000_000, 'the worker\'s resident memory');

  process.kill(server.pid!, 'SIGTERM');
  assert.equal(await within(exited, 'exit after SIGTERM'), 0);
  // Every line on stdout, the gateway's and the worker's, is one JSON object.
  assert.ok(lines.length >= 4);
  for (const line of lines) assert.doesNotThrow(() => JSON.parse(line), `not JSON: ${line}`);
  assert.ok(lines.some((line) => JSON.parse(line).msg === 'worker serving'));
});
