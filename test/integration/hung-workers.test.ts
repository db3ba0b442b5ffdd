// Workers that hang once serving, as `conduit serve` meets them: a local one stopped (SIGSTOP)
// while serving or right after it is ready is killed and restarted, which the metrics and the log
// show. (Apart from lifecycle.test.ts so each file stays well inside the runner's per-file bound.)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { childProcesses, startCli } from './cli-process.ts';
import { boundedFetch, defaultModelDir, openaiClient, within } from './harness.ts';
import { pollUntil } from '../wait.ts';
import { tempDir, writeConfig } from './config-files.ts';

test('a hung worker (SIGSTOP) is killed and restarted: its stream ends with an error, the server serves again, each restart is counted by reason', { timeout: 120_000 }, async (t) => {
  const dir = tempDir(t);
  const configFile = writeConfig(dir, {
    server: { host: '127.0.0.1', http_port: 0, metrics_port: 0, worker_heartbeat_timeout_s: 3 },
    models: [{ path: defaultModelDir, num_workers: 1, max_num_seqs: 4, kv_cache_bytes: 64 * 1024 * 1024 }],
  });
  const server = startCli(t, ['serve', '--config', configFile]);
  const { http: httpAddress, metrics: metricsAddress } = await server.serving();
  const [worker] = childProcesses(server.pid).filter((child) => / worker /.test(child.commandLine));
  assert.ok(worker !== undefined, 'the worker is a child of the gateway');

  // A long stream in flight when the worker hangs.
  const stream = await boundedFetch(`${httpAddress}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'conduit-tiny', prompt: 'Once', max_tokens: 500, ignore_eos: true, stream: true }),
  });
  const reader = stream.body!.getReader();
  const decoder = new TextDecoder();
  let text = decoder.decode((await reader.read()).value);
  process.kill(worker.pid, 'SIGSTOP');
  for (let chunk = await within(reader.read(), 'the stream to end'); !chunk.done; chunk = await within(reader.read(), 'the stream to end')) {
    text += decoder.decode(chunk.value, { stream: true });
  }
  assert.match(text, /"code":"engine_unavailable"/, 'the client of the hung worker got a clean error');
  const hung = await server.waitFor('worker_hung');
  assert.equal(hung.level, 'warn');
  assert.equal(hung.worker, '0-0');
  assert.ok((hung.silent_ms as number) > 3_000, 'silent past the timeout');
  assert.match(hung.msg as string, /^worker 0-0 sent nothing on its engine stream for \d+\.\d s; killing it as hung$/);
  const restart = await server.waitFor('worker_restarting', 'the restart');
  assert.deepEqual([restart.level, restart.worker, restart.reason, typeof restart.delay_ms], ['warn', '0-0', 'hung', 'number']);
  assert.match(restart.msg as string, /^worker 0-0 exited \(hung\); restarting in \d+ ms$/);

  const client = openaiClient(`${httpAddress}/v1`);
  await pollUntil(async () => {
    const completion = await client.completions.create({ model: 'conduit-tiny', prompt: 'Hi', max_tokens: 2 }).catch(() => null);
    if (completion === null) await new Promise((resolve) => setTimeout(resolve, 200));
    return completion !== null;
  }, 'a completion from the restarted worker');
  const [restarted] = childProcesses(server.pid).filter((child) => / worker /.test(child.commandLine));
  assert.notEqual(restarted?.pid, worker.pid, 'a new worker process');
  // A crash, beside the hang, counts under its signal.
  process.kill(restarted.pid, 'SIGKILL');
  await server.waitFor((entry) => entry.event === 'worker_restarting' && entry.reason === 'SIGKILL', 'the restart after a crash');
  const metrics = await (await boundedFetch(`${metricsAddress}/metrics`)).text();
  assert.match(metrics, /conduit_worker_restarts_total\{model_name="conduit-tiny",worker="unix:[^"]+",reason="hung"\} 1/);
  assert.match(metrics, /conduit_worker_restarts_total\{model_name="conduit-tiny",worker="unix:[^"]+",reason="SIGKILL"\} 1/);

  server.child.kill('SIGTERM');
  assert.equal(await within(server.exited, 'exit after SIGTERM'), 0);
});

test('a restarted worker that hangs (SIGSTOP) right after it is ready, before its engine stream carries anything, is killed as hung too', { timeout: 120_000 }, async (t) => {
  const dir = tempDir(t);
  const configFile = writeConfig(dir, {
    server: { host: '127.0.0.1', http_port: 0, metrics_port: 0, worker_heartbeat_timeout_s: 3 },
    models: [{ path: defaultModelDir, num_workers: 1, max_num_seqs: 4, kv_cache_bytes: 64 * 1024 * 1024 }],
  });
  const server = startCli(t, ['serve', '--config', configFile]);
  const { http: httpAddress } = await server.serving();
  const workerPid = () => childProcesses(server.pid).find((child) => / worker /.test(child.commandLine))?.pid;
  const first = workerPid()!;
  process.kill(first, 'SIGKILL');
  await server.waitFor((entry) => entry.event === 'worker_restarting' && entry.reason === 'SIGKILL', 'the restart after a crash');
  // The restarted worker logs that it serves (its model loaded); the gateway's stream to it
  // reopens with a backoff, so the stop lands before the worker's first message on it.
  await server.waitFor((entry) => entry.msg === 'worker serving' && entry.pid !== first, 'the restarted worker to listen');
  const restarted = workerPid();
  assert.ok(restarted !== undefined && restarted !== first, 'a new worker process');
  process.kill(restarted, 'SIGSTOP');
  const hung = await server.waitFor('worker_hung', 'the silent restarted worker killed as hung');
  assert.equal(hung.worker, '0-0');
  await server.waitFor((entry) => entry.event === 'worker_restarting' && entry.reason === 'hung', 'its restart');
  const client = openaiClient(`${httpAddress}/v1`);
  await pollUntil(async () => {
    const completion = await client.completions.create({ model: 'conduit-tiny', prompt: 'Hi', max_tokens: 2 }).catch(() => null);
    if (completion === null) await new Promise((resolve) => setTimeout(resolve, 200));
    return completion !== null;
  }, 'a completion from the worker restarted after the hang');
  server.child.kill('SIGTERM');
  assert.equal(await within(server.exited, 'exit after SIGTERM'), 0);
});
