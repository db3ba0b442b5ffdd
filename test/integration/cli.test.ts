// `conduit serve --model DIR` as a user runs it: a real process serving a checkpoint of
// another family, streamed from over HTTP, stopped with SIGTERM.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import net from 'node:net';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { DEFAULT_OPTIONS, writeRandomCheckpoint } from '../../tools/make-checkpoint.ts';
import { defaultModelDir, openaiClient, within } from './harness.ts';
import { freePort } from '../../tools/free-port.ts';
import { childProcesses, groupEmptied, startCli } from './cli-process.ts';

test('conduit serve --model DIR serves a sharded Qwen2 checkpoint under its folder name', { timeout: 120_000 }, async (t) => {
  const workDir = mkdtempSync(path.join(os.tmpdir(), 'conduit-cli-'));
  t.after(() => rmSync(workDir, { recursive: true, force: true }));
  const modelDir = path.join(workDir, 'qwen-mini');
  writeRandomCheckpoint({
    ...DEFAULT_OPTIONS,
    outDir: modelDir,
    arch: 'qwen2',
    hiddenSize: 64,
    numLayers: 2,
    numHeads: 4,
    numKvHeads: 2,
    intermediateSize: 96,
    vocabSize: 50257,
    dtype: 'fp16',
    tieWordEmbeddings: false,
    numShards: 2,
    maxPositionEmbeddings: 512,
    bosTokenId: 50256,
    eosTokenId: 50256,
    seed: 7,
  });
  writeFileSync(path.join(modelDir, 'tokenizer_config.json'), JSON.stringify({
    tiktoken_encoding: 'gpt2',
    bos_token: '<|endoftext|>',
    eos_token: '<|endoftext|>',
    chat_template: "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}",
  }));

  const server = startCli(t, ['serve', '--model', modelDir, '--http-port', '0', '--metrics-port', '0']);
  const client = openaiClient(`${(await server.serving()).http}/v1`);
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ['qwen-mini']);
  const stream = await client.chat.completions.create({
    model: 'qwen-mini',
    messages: [{ role: 'user', content: 'Hi' }],
    max_tokens: 5,
    ignore_eos: true,
    stream: true,
    stream_options: { include_usage: true },
  } as OpenAI.Chat.ChatCompletionCreateParamsStreaming);
  let numCompletionTokens = 0;
  for await (const chunk of stream) numCompletionTokens = chunk.usage?.completion_tokens ?? numCompletionTokens;
  assert.equal(numCompletionTokens, 5);

  server.child.kill('SIGTERM');
  assert.equal(await within(server.exited, 'exit after SIGTERM'), 0);
  assert.ok(!server.events().includes('worker_stop_killed'), 'the worker exits on its own after SIGTERM');
});

test('a bad configuration or command line, found before the logger, is one plain line on stderr naming the file or flag: exit code 2, nothing on stdout', async (t) => {
  const workDir = mkdtempSync(path.join(os.tmpdir(), 'conduit-cli-'));
  t.after(() => rmSync(workDir, { recursive: true, force: true }));
  const configFile = path.join(workDir, 'bad.yaml');
  writeFileSync(configFile, 'models:\n  - path: x\n    max_num_seqs: lots\n');
  const badFile = startCli(t, ['serve', '--config', configFile]);
  assert.equal(await within(badFile.exited, 'exit on a bad configuration'), 2);
  assert.match(badFile.stderr(), /^conduit: .*bad\.yaml: models\.0\.max_num_seqs.*\n$/);
  assert.deepEqual(badFile.stdoutLines(), []);

  const badFlag = startCli(t, ['serve', '--model', defaultModelDir, '--http-port', '99999']);
  assert.equal(await within(badFlag.exited, 'exit on a bad flag'), 2);
  assert.match(badFlag.stderr(), /^conduit: command line: --http-port 99999: .*\n$/);
  assert.deepEqual(badFlag.stdoutLines(), []);
});

test('Ctrl-C to the process group stops the server and its worker, with no respawn', { timeout: 120_000 }, async (t) => {
  // A terminal's Ctrl-C signals the whole foreground process group: gateway and worker at once.
  const server = startCli(t, ['serve', '--model', defaultModelDir, '--http-port', '0', '--metrics-port', '0']);
  const client = openaiClient(`${(await server.serving()).http}/v1`);
  assert.equal((await client.completions.create({ model: 'conduit-tiny', prompt: 'Hi', max_tokens: 2 })).choices.length, 1);

  // A stream in flight when Ctrl-C comes runs to its end.
  const stream = await client.completions.create({ model: 'conduit-tiny', prompt: 'Once', max_tokens: 64, ignore_eos: true, stream: true } as OpenAI.Completions.CompletionCreateParamsStreaming);
  const iterator = stream[Symbol.asyncIterator]();
  await iterator.next();
  process.kill(-server.pid, 'SIGINT');
  let finishReason: string | null = null;
  for (let chunk = await iterator.next(); !chunk.done; chunk = await iterator.next()) finishReason = chunk.value.choices[0]?.finish_reason ?? finishReason;
  assert.equal(finishReason, 'length', 'the stream in flight finished');
  assert.equal(await within(server.exited, 'exit after SIGINT to the group'), 0);
  assert.deepEqual(server.events(), ['listening', 'serving', 'draining', 'stopped'], 'no worker respawned during shutdown, nor killed: it exits on its own');
  assert.equal(server.logEntries().find((entry) => entry.event === 'draining')?.cause, 'SIGINT');
  assert.equal(server.logEntries().find((entry) => entry.event === 'stopped')?.exit_code, 0);
  // Nothing of the group is left: signalling it finds no process.
  await within(groupEmptied(server.pid), 'the process group to empty');
});

test('SIGTERM to the process group (a process manager stopping the group) drains: the streams in flight finish, exit 0, nothing left', { timeout: 120_000 }, async (t) => {
  const server = startCli(t, ['serve', '--model', defaultModelDir, '--http-port', '0', '--metrics-port', '0']);
  const client = openaiClient(`${(await server.serving()).http}/v1`);
  const workerIds = childProcesses(server.pid).map((child) => child.pid);
  assert.equal(workerIds.length, 1, 'one worker');
  // Four streams in flight, each past its first chunk, when the group gets SIGTERM.
  const iterators = await Promise.all(Array.from({ length: 4 }, async (_, i) => {
    const stream = await client.completions.create({ model: 'conduit-tiny', prompt: `Once ${i}`, max_tokens: 48, ignore_eos: true, stream: true } as OpenAI.Completions.CompletionCreateParamsStreaming);
    const iterator = stream[Symbol.asyncIterator]();
    await iterator.next();
    return iterator;
  }));
  process.kill(-server.pid, 'SIGTERM');
  const finishReasons = await Promise.all(iterators.map(async (iterator) => {
    let finishReason: string | null = null;
    for (let chunk = await iterator.next(); !chunk.done; chunk = await iterator.next()) finishReason = chunk.value.choices[0]?.finish_reason ?? finishReason;
    return finishReason;
  }));
  assert.deepEqual(finishReasons, ['length', 'length', 'length', 'length'], 'every stream in flight finished');
  assert.equal(await within(server.exited, 'exit after SIGTERM to the group'), 0);
  assert.deepEqual(server.events(), ['listening', 'serving', 'draining', 'stopped'], 'no worker restarted or killed during the drain');
  assert.equal(server.logEntries().find((entry) => entry.event === 'draining')?.cause, 'SIGTERM');
  await within(groupEmptied(server.pid), 'the process group to empty');
});

test('a taken metrics port ends conduit serve with one line naming the flag, before any worker starts, leaving nothing serving', { timeout: 120_000 }, async (t) => {
  const taken = net.createServer().listen(0, '127.0.0.1');
  await once(taken, 'listening');
  t.after(() => taken.close());
  const metricsPort = (taken.address() as net.AddressInfo).port;
  const httpPort = await freePort();
  const server = startCli(t, ['serve', '--model', defaultModelDir, '--http-port', String(httpPort), '--metrics-port', String(metricsPort)]);
  assert.equal(await within(server.exited, 'exit on a taken port'), 1);
  const fatal = await server.waitFor('fatal');
  assert.equal(fatal.msg, `cannot listen on 0.0.0.0:${metricsPort} (server.metrics_port / --metrics-port): address already in use`);
  assert.deepEqual([fatal.level, fatal.exit_code, fatal.err], ['fatal', 1, undefined], 'a fatal line with no stack');
  assert.deepEqual(server.events(), ['fatal'], 'one line, before listening');
  // A worker would have loaded the model and said so.
  assert.ok(!server.logEntries().some((entry) => entry.role === 'worker'), 'no worker started');
  await within(groupEmptied(server.pid), 'the process group to empty');
  // The HTTP port it had bound is free again: nothing is left answering 503 there.
  const again = net.createServer().listen(httpPort, '127.0.0.1');
  await once(again, 'listening');
  again.close();
});

test('SIGTERM to `npm start` (what a process manager sends) stops the server and its worker', { timeout: 120_000 }, async (t) => {
  const npm = startCli(t, ['--http-port', '0', '--metrics-port', '0', '--grpc-port', '0'], { command: ['npm', 'start', '--'] });
  await npm.waitFor('serving', 'npm start serving');
  npm.child.kill('SIGTERM');
  await within(npm.exited, 'npm to exit');
  assert.deepEqual(npm.events(), ['listening', 'serving', 'draining', 'stopped']);
  assert.equal(npm.logEntries().find((entry) => entry.event === 'draining')?.cause, 'SIGTERM');
  // Every line of the server's is JSON, the model repository's too; only npm's own are not.
  assert.ok(npm.logEntries().some((entry) => entry.component === 'model_repository' && entry.model === 'digits' && entry.msg === 'unloaded digits'));
  assert.doesNotMatch(npm.stderr(), /^(?!npm ).+/m);
  // npm's child, the gateway, and its worker all share npm's process group: none may be left.
  await within(groupEmptied(npm.pid), 'the server and its worker to exit');
});
