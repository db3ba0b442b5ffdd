// `conduit serve`'s own life, started as a process: it listens before its models load (503
// `starting` meanwhile), a start that cannot succeed ends with exit code 1 and one line, and an
// error caught nowhere drains and exits 1. Workers that hang: hung-workers.test.ts.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { copyFileSync, mkdirSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { once } from 'node:events';
import path from 'node:path';
import OpenAI from 'openai';
import { freePort } from '../../tools/free-port.ts';
import { groupEmptied, startCli } from './cli-process.ts';
import { boundedFetch, defaultModelDir, openaiClient, repoRoot, within } from './harness.ts';
import { tempDir, writeConfig } from './config-files.ts';
import { connectInferenceClient } from '../../gateway/kserve/test/grpc-client.ts';

function serverReady(grpcAddress: string): Promise<boolean> {
  const client = connectInferenceClient(grpcAddress);
  return within(new Promise<boolean>((resolve, reject) => {
    client.ServerReady({}, (err: Error | null, response: { ready: boolean }) => (err ? reject(err) : resolve(response.ready)));
  }), 'gRPC ServerReady').finally(() => client.close());
}

test('the ports answer before the models load: 503 starting, live but not ready; ready once the worker serves', { timeout: 120_000 }, async (t) => {
  const dir = tempDir(t);
  const [httpPort, metricsPort, grpcPort] = [await freePort(), await freePort(), await freePort()];
  const workerAddress = `unix:${path.join(dir, 'worker.sock')}`;
  // A worker of its own, started below by hand: until then the gateway is starting, as long as we look.
  const configFile = writeConfig(dir, {
    server: { host: '127.0.0.1', http_port: httpPort, metrics_port: metricsPort, grpc_port: grpcPort },
    models: [{ path: defaultModelDir, num_workers: 0, remote_workers: [workerAddress] }],
    model_repository: { path: path.join(repoRoot, 'models'), model_control_mode: 'explicit', load_models: ['fraud'] },
  });
  const server = startCli(t, ['serve', '--config', configFile]);
  await server.waitFor('listening');
  const base = `http://127.0.0.1:${httpPort}`;

  const health = await boundedFetch(`${base}/health`);
  assert.equal(health.status, 503);
  assert.equal(health.headers.get('retry-after'), '5');
  assert.equal((await health.json()).state, 'starting');
  assert.equal((await boundedFetch(`${base}/v2/health/live`)).status, 200, 'live while the models load');
  assert.equal((await boundedFetch(`${base}/v2/health/ready`)).status, 400, "Triton's not ready");
  const chat = await boundedFetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'conduit-tiny', messages: [{ role: 'user', content: 'Hi' }] }),
  });
  assert.equal(chat.status, 503);
  assert.equal(chat.headers.get('retry-after'), '5');
  assert.equal((await chat.json()).error.code, 'server_starting');
  const kserve = await boundedFetch(`${base}/v2/models/fraud`);
  assert.equal(kserve.status, 503);
  assert.match((await kserve.json()).error, /starting/, "KServe's body under /v2");
  assert.equal(await serverReady(`127.0.0.1:${grpcPort}`), false);
  assert.match(await (await boundedFetch(`http://127.0.0.1:${metricsPort}/metrics`)).text(), /conduit_worker_restarts_total/);

  const worker = spawn(process.execPath, [
    path.join(repoRoot, 'bin', 'conduit.js'), 'worker', '--model', defaultModelDir, '--listen', workerAddress,
    '--threads', '1', '--kv-cache-blocks', '64', '--max-model-len', '512',
  ], { stdio: ['ignore', 'ignore', 'inherit'] });
  const workerExited = new Promise((resolve) => worker.once('exit', resolve));
  t.after(() => worker.kill('SIGKILL'));
  await server.waitFor('serving', 'serving once the worker serves');
  const models = await openaiClient(`${base}/v1`).models.list();
  assert.equal((models.data[0] as unknown as { max_model_len: number }).max_model_len, 512, "the context length the worker reported, filled in after the gateway was built");
  assert.equal((await boundedFetch(`${base}/health`)).status, 200);
  assert.equal((await boundedFetch(`${base}/v2/health/ready`)).status, 200);
  assert.equal(await serverReady(`127.0.0.1:${grpcPort}`), true);

  server.child.kill('SIGTERM');
  assert.equal(await within(server.exited, 'exit after SIGTERM'), 0);
  worker.kill('SIGTERM');
  await within(workerExited, 'the worker to exit');
});

test('SIGTERM while the models load stops the start: exit code 0, its worker stopped, nothing left', { timeout: 120_000 }, async (t) => {
  const dir = tempDir(t);
  // A remote worker that never comes keeps the server starting for as long as the test needs.
  const configFile = writeConfig(dir, {
    server: { host: '127.0.0.1', http_port: 0, metrics_port: 0 },
    models: [{ path: defaultModelDir, num_workers: 1, remote_workers: [`unix:${path.join(dir, 'absent.sock')}`] }],
  });
  const server = startCli(t, ['serve', '--config', configFile]);
  await server.waitFor('listening');
  await server.waitFor((entry) => entry.msg === 'worker serving', 'the local worker to load');
  server.child.kill('SIGTERM');
  assert.equal(await within(server.exited, 'exit after SIGTERM'), 0);
  assert.deepEqual(server.events(), ['listening'], 'not serving, no worker restarted or killed');
  await within(groupEmptied(server.pid), 'the process group to empty');
});

test('a worker that exits before it ever served ends conduit serve with exit code 1, not 503 forever', { timeout: 120_000 }, async (t) => {
  // A checkpoint whose tokenizer loads (the gateway's part) and whose weights do not (the worker's).
  const modelDir = path.join(tempDir(t), 'not-a-checkpoint');
  mkdirSync(modelDir);
  for (const file of ['config.json', 'generation_config.json', 'tokenizer.json', 'tokenizer_config.json']) {
    copyFileSync(path.join(defaultModelDir, file), path.join(modelDir, file));
  }
  writeFileSync(path.join(modelDir, 'model.safetensors'), 'not safetensors');
  const server = startCli(t, ['serve', '--model', modelDir, '--http-port', '0', '--metrics-port', '0']);
  assert.equal(await within(server.exited, 'exit on a worker that cannot load'), 1);
  const fatal = await server.waitFor('fatal');
  // The worker said why before it exited; the gateway's one line carries it.
  assert.match(fatal.msg as string, /^worker 0-0 cannot start: .*model\.safetensors/);
  assert.equal(fatal.level, 'fatal');
  assert.equal(fatal.exit_code, 1);
  assert.deepEqual(server.events(), ['listening', 'fatal'], 'not restarted: it would only fail again');
  await within(groupEmptied(server.pid), 'the process group to empty');
});

test('a worker not serving within server.worker_ready_timeout_s ends conduit serve with one fatal line naming it and the setting, exit code 1', { timeout: 120_000 }, async (t) => {
  const dir = tempDir(t);
  const absentAddress = `unix:${path.join(dir, 'absent.sock')}`;
  const configFile = writeConfig(dir, {
    server: { host: '127.0.0.1', http_port: 0, metrics_port: 0, worker_ready_timeout_s: 1 },
    models: [{ path: defaultModelDir, num_workers: 0, remote_workers: [absentAddress] }],
  });
  const server = startCli(t, ['serve', '--config', configFile]);
  // Well within the wait bound: 1 s, not the 300 s default.
  assert.equal(await within(server.exited, 'exit on a worker that never serves'), 1);
  const fatal = await server.waitFor('fatal');
  assert.match(fatal.msg as string, new RegExp(`^worker ${absentAddress.replaceAll('.', '\\.')} not serving after 1 s \\(server\\.worker_ready_timeout_s\\)`));
  assert.equal(fatal.exit_code, 1);
  assert.deepEqual(server.events(), ['listening', 'fatal']);
  await within(groupEmptied(server.pid), 'the process group to empty');
});

test('a repository model that fails to load at start ends conduit serve with exit code 1 (as Triton exits)', { timeout: 120_000 }, async (t) => {
  const repoDir = tempDir(t);
  mkdirSync(path.join(repoDir, 'fraud', '1'), { recursive: true });
  copyFileSync(path.join(repoRoot, 'models', 'fraud', 'config.pbtxt'), path.join(repoDir, 'fraud', 'config.pbtxt'));
  writeFileSync(path.join(repoDir, 'fraud', '1', 'model.onnx'), 'not onnx');
  const server = startCli(t, [
    'serve', '--model', defaultModelDir, '--model-repository', repoDir,
    '--http-port', '0', '--metrics-port', '0', '--grpc-port', '0',
  ]);
  assert.equal(await within(server.exited, 'exit on a model that cannot load'), 1);
  assert.match((await server.waitFor('fatal')).msg as string, /^model repository: fraud failed to load/);
  await within(groupEmptied(server.pid), 'the process group, its worker too, to empty');
});

test('a taken gRPC port is one line naming the flag, before any worker starts', { timeout: 120_000 }, async (t) => {
  const taken = net.createServer().listen(0, '127.0.0.1');
  await once(taken, 'listening');
  t.after(() => taken.close());
  const grpcPort = (taken.address() as net.AddressInfo).port;
  const server = startCli(t, [
    'serve', '--model', defaultModelDir, '--model-repository', path.join(repoRoot, 'models'), '--model-control-mode', 'explicit',
    '--http-port', '0', '--metrics-port', '0', '--grpc-port', String(grpcPort),
  ]);
  assert.equal(await within(server.exited, 'exit on a taken port'), 1);
  const fatal = await server.waitFor('fatal');
  assert.equal(fatal.msg, `cannot listen on 0.0.0.0:${grpcPort} (server.grpc_port / --grpc-port): address already in use`);
  assert.equal(fatal.err, undefined, 'no stack');
  assert.deepEqual(server.events(), ['fatal'], 'one line, before listening');
  assert.ok(!server.logEntries().some((entry) => entry.role === 'worker'), 'no worker started');
});

test('an error thrown and caught nowhere, once serving, is one line, a drain (the stream in flight finishes) and exit code 1', { timeout: 120_000 }, async (t) => {
  // A bug on demand: SIGUSR2 throws from a signal handler, outside any request.
  const injectBug = 'data:text/javascript,process.on("SIGUSR2",()=>{throw new Error("injected bug")})';
  const server = startCli(t, ['serve', '--model', defaultModelDir, '--http-port', '0', '--metrics-port', '0'], { nodeArgs: ['--import', injectBug] });
  const { http: httpAddress } = await server.serving();
  const client = openaiClient(`${httpAddress}/v1`);
  const stream = await client.completions.create({ model: 'conduit-tiny', prompt: 'Once', max_tokens: 64, ignore_eos: true, stream: true } as OpenAI.Completions.CompletionCreateParamsStreaming);
  const iterator = stream[Symbol.asyncIterator]();
  await iterator.next();
  process.kill(server.pid, 'SIGUSR2');
  let finishReason: string | null = null;
  for (let chunk = await iterator.next(); !chunk.done; chunk = await iterator.next()) finishReason = chunk.value.choices[0]?.finish_reason ?? finishReason;
  assert.equal(finishReason, 'length', 'the stream in flight finished');
  assert.equal(await within(server.exited, 'exit after the bug'), 1);
  assert.deepEqual(server.events(), ['listening', 'serving', 'fatal', 'draining', 'stopped']);
  assert.equal(server.logEntries().find((entry) => entry.event === 'stopped')?.exit_code, 1);
  const fatal = await server.waitFor('fatal');
  assert.equal(fatal.msg, 'stopping on an uncaught error: Error: injected bug');
  assert.equal(fatal.exit_code, 1);
  assert.match((fatal.err as { stack: string }).stack, /injected bug\n\s+at /, 'the stack, as a field');
  await within(groupEmptied(server.pid), 'the process group to empty');
});
