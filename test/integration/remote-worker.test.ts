// A worker started on its own (`conduit worker --listen`), as on another machine, served by a
// gateway whose configuration names it by address and spawns no worker of its own. The worker
// runs int8 weights, so the quantization setting is exercised from the flag to the runtime.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import OpenAI from 'openai';
import { boundedFetch, defaultModelDir, openaiClient, repoRoot, startServer, within } from './harness.ts';
import { workerServing } from './worker-serving.ts';

test('a gateway serves a remote worker named in its configuration', { timeout: 120_000 }, async (t) => {
  const worker = spawn(process.execPath, [
    path.join(repoRoot, 'bin', 'conduit.js'), 'worker', '--model', defaultModelDir,
    '--listen', '127.0.0.1:0', '--threads', '1', '--kv-cache-blocks', '64', '--quantization', 'int8',
  ], { stdio: ['ignore', 'pipe', 'pipe'] });
  const exited = new Promise<number | null>((resolve) => worker.once('exit', resolve));
  t.after(() => worker.kill('SIGKILL'));
  const address = await within(workerServing(worker).address, 'serving');

  const server = await startServer([{ path: defaultModelDir, num_workers: 0, remote_workers: [address] }]);
  try {
    const client = openaiClient(`${server.httpAddress}/v1`);
    const completion = await client.completions.create({ model: 'conduit-tiny', prompt: 'Hello', max_tokens: 4, ignore_eos: true } as OpenAI.CompletionCreateParamsNonStreaming);
    assert.equal(completion.usage?.completion_tokens, 4);
    const metrics = await (await boundedFetch(`${server.metricsAddress}/metrics`)).text();
    assert.match(metrics, new RegExp(`conduit_kv_blocks_total\\{model_name="conduit-tiny",worker="${address}"\\} 64`));
  } finally {
    await server.close();
  }
  // The gateway closing its connection leaves a remote worker running for other gateways.
  assert.equal(worker.exitCode, null);
  worker.kill('SIGTERM');
  assert.equal(await within(exited, 'exit after SIGTERM'), 0);
});
