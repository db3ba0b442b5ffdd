// The real `conduit serve` on conduit-tiny: its stdout is JSON lines (its lifecycle lines too), a
// request's id reaches the gateway's access line and the worker's line about it, and /metrics has
// the worker's figures.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { startCli } from './cli-process.ts';
import { boundedFetch, defaultModelDir, within } from './harness.ts';

test('conduit serve logs JSON lines on stdout: an access line per request under its id, the worker\'s line of an abort under the same id', { timeout: 120_000 }, async (t) => {
  const server = startCli(t, ['serve', '--model', defaultModelDir, '--http-port', '0', '--metrics-port', '0', '--log-level', 'info']);
  const { http: httpAddress, metrics: metricsAddress } = await server.serving();

  const requestId = 'itest-logs-1';
  const response = await boundedFetch(`${httpAddress}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-request-id': requestId },
    body: JSON.stringify({ model: 'conduit-tiny', prompt: 'Once upon a time', max_tokens: 6, ignore_eos: true }),
  });
  assert.equal(response.status, 200);
  assert.equal(response.headers.get('x-request-id'), requestId);
  await response.json();
  const access = await server.waitFor((entry) => entry.request_id === requestId && entry.msg === 'request completed', 'the access line');
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
  const workerLine = await server.waitFor((entry) => entry.request_id === stoppedId && entry.role === 'worker', 'the worker\'s abort line');
  assert.equal(workerLine.msg, 'request aborted');
  const stoppedLine = await server.waitFor((entry) => entry.request_id === stoppedId && entry.role === 'gateway', 'the gateway\'s access line');
  assert.equal(stoppedLine.finish_reason, 'stop');

  const metrics = await (await boundedFetch(`${metricsAddress}/metrics`)).text();
  assert.match(metrics, /conduit_request_queue_time_seconds_count\{model_name="conduit-tiny"\} [1-9]/);
  assert.match(metrics, /conduit_request_success_total\{model_name="conduit-tiny",finished_reason="length"\} 1/);
  // The worker's RSS, from its step reports: a loaded model holds more than 10 MB.
  const rss = /conduit_worker_resident_memory_bytes\{model_name="conduit-tiny",worker="[^"]+"\} (\d+)/.exec(metrics);
  assert.ok(rss !== null && Number(rss[1]) > 10_000_000, 'the worker\'s resident memory');

  server.child.kill('SIGTERM');
  assert.equal(await within(server.exited, 'exit after SIGTERM'), 0);
  // Every line on stdout, the gateway's and the worker's, lifecycle lines too, is one JSON object.
  const lines = server.stdoutLines();
  assert.ok(lines.length >= 4);
  for (const line of lines) assert.doesNotThrow(() => JSON.parse(line), `not JSON: ${line}`);
  assert.ok(server.logEntries().some((entry) => entry.msg === 'worker serving'));
  // The lifecycle lines, at info, with the addresses as fields.
  const [listening, serving] = server.logEntries().filter((entry) => entry.event !== undefined);
  assert.deepEqual([listening.event, listening.level, listening.role], ['listening', 'info', 'gateway']);
  assert.deepEqual([serving.event, serving.level], ['serving', 'info']);
  assert.equal((serving.http_address as string).replace('0.0.0.0', '127.0.0.1'), httpAddress);
  assert.match(serving.msg as string, /^serving on http:\/\/\S+ \(metrics http:\/\/\S+\)$/);
  assert.deepEqual(server.events(), ['listening', 'serving', 'draining', 'stopped']);
});
