// Tensor parallelism served: conduit-tiny under two names, one worker each, one at
// tensor_parallel_size 2 (the worker is rank 0 and starts a `conduit rank` process). Through the
// official `openai` client over HTTP, the split model answers with the very tokens and logprobs of
// the whole one, greedy and seeded, plain and streamed. Then as on several machines: a worker and
// its rank started by MPICH's mpiexec, joined over MPI's TCP transport, served as a remote worker.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import OpenAI from 'openai';
import type { RunningServer } from '../../bin/serve.ts';
import { findOnPath } from '../system-tools.ts';
import { defaultModelDir, openaiClient, repoRoot, startServer, within } from './harness.ts';
import { workerServing } from './worker-serving.ts';

let server: RunningServer;
let client: OpenAI;

before(async () => {
  const common = { path: defaultModelDir, num_workers: 1, kv_cache_blocks: 256, max_num_seqs: 8 };
  server = await startServer([
    { ...common, served_name: 'tiny-tp1', threads_per_worker: 2 },
    { ...common, served_name: 'tiny-tp2', threads_per_worker: 1, tensor_parallel_size: 2 },
  ]);
  client = openaiClient(`${server.httpAddress}/v1`);
});

after(async () => {
  await server?.close();
});

type Params = OpenAI.Completions.CompletionCreateParamsNonStreaming & { ignore_eos?: boolean };

test('completions at TP 2 are those of TP 1: text, token logprobs and top logprobs, greedy and seeded', async () => {
  const prompts = ['Once upon a time there was a little fox.', 'The king said to the queen'];
  for (const [index, prompt] of prompts.entries()) {
    const request = (model: string): Params =>
      ({ model, prompt, max_tokens: 24, temperature: index === 0 ? 0 : 0.9, seed: 5, logprobs: 3, ignore_eos: true });
    const [whole, split] = await Promise.all([client.completions.create(request('tiny-tp1')), client.completions.create(request('tiny-tp2'))]);
    assert.equal(split.usage?.completion_tokens, 24);
    assert.equal(whole.choices[0].logprobs?.top_logprobs?.length, 24, 'the reference reports logprobs');
    assert.equal(split.choices[0].text, whole.choices[0].text, prompt);
    assert.deepEqual(split.choices[0].logprobs, whole.choices[0].logprobs, prompt);
  }
});

test('a streamed chat completion at TP 2 streams the text of TP 1', async () => {
  const collect = async (model: string) => {
    let text = '';
    const stream = await client.chat.completions.create({
      model, messages: [{ role: 'user', content: 'Tell me about foxes.' }], max_tokens: 32, temperature: 0, stream: true,
    });
    for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? '';
    return text;
  };
  const [whole, split] = await Promise.all([collect('tiny-tp1'), collect('tiny-tp2')]);
  assert.ok(whole.length > 0);
  assert.equal(split, whole);
});

const mpiexec = findOnPath('mpiexec.mpich');

test('TP 2 over MPI (mpiexec: a worker and its rank over TCP) serves the completions of TP 1', {
  skip: mpiexec === null && 'MPICH is not installed (apt-get install mpich): the MPI transport is not tested here',
}, async (t) => {
  const conduit = path.join(repoRoot, 'bin', 'conduit.js');
  const common = ['--model', defaultModelDir, '--tensor-parallel-size', '2', '--threads', '1', '--kv-cache-blocks', '256'];
  const job = spawn(mpiexec!, [
    '-genv', 'MPIR_CVAR_NOLOCAL', '1', '-genv', 'UCX_TLS', 'tcp,self', '-genv', 'UCX_NET_DEVICES', 'lo',
    '-n', '1', process.execPath, conduit, 'worker', ...common, '--listen', '127.0.0.1:0', '--served-name', 'tiny-mpi', '--tensor-parallel-transport', 'mpi',
    ':', '-n', '1', process.execPath, conduit, 'rank', ...common, '--rank', '1', '--connect', 'mpi',
  ], { stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  t.after(() => {
    try {
      process.kill(-job.pid!, 'SIGKILL');
    } catch {
      // The job has ended.
    }
  });
  const address = await within(workerServing(job).address, 'the MPI worker serving');
  const remote = await startServer([{ path: defaultModelDir, served_name: 'tiny-mpi', num_workers: 0, remote_workers: [address] }]);
  try {
    const remoteClient = openaiClient(`${remote.httpAddress}/v1`);
    const request = (model: string): Params =>
      ({ model, prompt: 'Once upon a time there was a little fox.', max_tokens: 16, temperature: 0, logprobs: 3, ignore_eos: true });
    const [whole, split] = await Promise.all([client.completions.create(request('tiny-tp1')), remoteClient.completions.create(request('tiny-mpi'))]);
    assert.equal(split.usage?.completion_tokens, 16);
    assert.equal(split.choices[0].text, whole.choices[0].text);
    assert.deepEqual(split.choices[0].logprobs, whole.choices[0].logprobs);
  } finally {
    await remote.close();
  }
});
