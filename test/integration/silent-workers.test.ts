// Workers that go silent, as `conduit serve` meets them: a restarted local one whose load hangs
// is killed once server.worker_ready_timeout_s passes; a remote one silent past the heartbeat
// timeout leaves routing until it answers again. (Apart from lifecycle.test.ts and
// hung-workers.test.ts so each file stays well inside the runner's per-file bound.)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { childProcesses, startCli } from './cli-process.ts';
import { boundedFetch, defaultModelDir, openaiClient, within } from './harness.ts';
import { pollUntil } from '../wait.ts';
import { startWorkerProcess } from './worker-process.ts';
import { tempDir, writeConfig } from './config-files.ts';

test('a restarted worker whose load hangs (SIGSTOP before it listens) is killed once server.worker_ready_timeout_s passes, and restarted', { timeout: 120_000 }, async (t) => {
  const dir = tempDir(t);
  const configFile = writeConfig(dir, {
    server: { host: '127.0.0.1', http_port: 0, metrics_port: 0, worker_heartbeat_timeout_s: 3, worker_ready_timeout_s: 20 },
    models: [{ path: defaultModelDir, num_workers: 1, max_num_seqs: 4, kv_cache_bytes: 64 * 1024 * 1024 }],
  });
  const server = startCli(t, ['serve', '--config', configFile]);
  const { http: httpAddress } = await server.serving();
  const workerPid = () => childProcesses(server.pid).find((child) => / worker /.test(child.commandLine))?.pid;
  const socketPath = path.join(os.tmpdir(), `conduit-${server.pid}-0-0.sock`);
  const first = workerPid()!;
  process.kill(first, 'SIGKILL');
  // Stopped as soon as it exists: node takes far longer to start than this poll to find it.
  let restarted: number | undefined;
  await pollUntil(async () => {
    await new Promise((resolve) => setTimeout(resolve, 5));
    restarted = workerPid();
    return restarted !== undefined && restarted !== first;
  }, 'the restarted worker process');
  process.kill(restarted!, 'SIGSTOP');
  assert.equal(existsSync(socketPath), false, 'stopped before it listens (its model not loaded)');
  const notReady = await server.waitFor('worker_not_ready', 'the restarted worker killed for not loading in time');
  assert.equal(notReady.worker, '0-0');
  assert.ok((notReady.loading_ms as number) >= 20_000);
  await server.waitFor((entry) => entry.event === 'worker_restarting' && entry.reason === 'not ready', 'its restart');
  const client = openaiClient(`${httpAddress}/v1`);
  await pollUntil(async () => {
    const completion = await client.completions.create({ model: 'conduit-tiny', prompt: 'Hi', max_tokens: 2 }).catch(() => null);
    if (completion === null) await new Promise((resolve) => setTimeout(resolve, 200));
    return completion !== null;
  }, 'a completion from the worker restarted after the hung load');
  server.child.kill('SIGTERM');
  assert.equal(await within(server.exited, 'exit after SIGTERM'), 0);
});

test('a remote worker silent past the heartbeat timeout is out of routing: its stream ends with a clean error, others serve on, and it is used again once it answers', { timeout: 120_000 }, async (t) => {
  const [silent, steady] = await Promise.all([startWorkerProcess(['--kv-cache-blocks', '256']), startWorkerProcess(['--kv-cache-blocks', '256'])]);
  t.after(() => Promise.all([silent.stop('SIGKILL'), steady.stop('SIGKILL')]));
  const dir = tempDir(t);
  const configFile = writeConfig(dir, {
    server: { host: '127.0.0.1', http_port: 0, metrics_port: 0, worker_heartbeat_timeout_s: 2 },
    // Round robin: the two streams below go one to each worker.
    models: [{ path: defaultModelDir, num_workers: 0, remote_workers: [silent.address, steady.address], routing_policy: 'round-robin' }],
  });
  const server = startCli(t, ['serve', '--config', configFile]);
  const { http: httpAddress, metrics: metricsAddress } = await server.serving();
  const openStream = async () => {
    const response = await boundedFetch(`${httpAddress}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'conduit-tiny', prompt: 'Once', max_tokens: 400, ignore_eos: true, stream: true }),
    });
    const reader = response.body!.getReader();
    const decoder = new TextDecoder();
    let text = decoder.decode((await within(reader.read(), 'the first chunk')).value);
    return async () => {
      for (let chunk = await within(reader.read(), 'the stream to end'); !chunk.done; chunk = await within(reader.read(), 'the stream to end')) {
        text += decoder.decode(chunk.value, { stream: true });
      }
      return text;
    };
  };
  const streams = [await openStream(), await openStream()];
  process.kill(silent.child.pid!, 'SIGSTOP');
  const texts = await Promise.all(streams.map((readRest) => readRest()));
  const failed = texts.filter((text) => text.includes('"code":"engine_unavailable"'));
  assert.equal(failed.length, 1, 'the silent worker\'s stream ended with a clean error');
  assert.match(texts.find((text) => !failed.includes(text))!, /"finish_reason":"length"/, 'the other worker\'s stream finished');
  const down = await server.waitFor('worker_unresponsive');
  assert.deepEqual([down.level, down.worker], ['warn', silent.address]);
  assert.ok((down.silent_ms as number) > 2_000);

  // While it is silent, every request goes to the other worker.
  const client = openaiClient(`${httpAddress}/v1`);
  for (let i = 0; i < 4; i++) assert.equal((await client.completions.create({ model: 'conduit-tiny', prompt: `Hi ${i}`, max_tokens: 2 })).usage?.completion_tokens, 2);
  const metrics = await (await boundedFetch(`${metricsAddress}/metrics`)).text();
  assert.match(metrics, new RegExp(`conduit_worker_unresponsive_total\\{model_name="conduit-tiny",worker="${silent.address}"\\} 1`));

  process.kill(silent.child.pid!, 'SIGCONT');
  const back = await server.waitFor('worker_answered', 'the worker answering again');
  assert.equal(back.worker, silent.address);
  // Round robin again: of two requests now, one is the answering worker's (its admissions count prompt tokens).
  const queriedTokens = async () => {
    const text = await (await boundedFetch(`${metricsAddress}/metrics`)).text();
    return Number(new RegExp(`conduit_prefix_cache_queries_total\\{model_name="conduit-tiny",worker="${silent.address}"\\} (\\d+)`).exec(text)?.[1] ?? 0);
  };
  const queriedBefore = await queriedTokens();
  for (let i = 0; i < 2; i++) assert.equal((await client.completions.create({ model: 'conduit-tiny', prompt: `Again ${i}`, max_tokens: 2 })).usage?.completion_tokens, 2);
  await pollUntil(async () => (await queriedTokens()) > queriedBefore, 'a request served by the worker that answered again');
  server.child.kill('SIGTERM');
  assert.equal(await within(server.exited, 'exit after SIGTERM'), 0);
});

