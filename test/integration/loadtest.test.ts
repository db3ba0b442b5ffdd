// A short real load test against Conduit's default model, through the `conduit loadtest` CLI.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { RunningServer } from '../../bin/serve.ts';
import { main as loadtestMain } from '../../loadtest/cli.ts';
import { startServer, defaultModelDir } from './harness.ts';

let server: RunningServer;
let outDir: string;

before(async () => {
  server = await startServer([{ path: defaultModelDir, threads_per_worker: 1, kv_cache_blocks: 256, max_num_seqs: 16 }]);
  outDir = mkdtempSync(path.join(os.tmpdir(), 'conduit-loadtest-'));
});

after(async () => {
  await server?.close();
  rmSync(outDir, { recursive: true, force: true });
});

test('fixed-length chat load: exact prompt and output lengths, no errors, a report', async () => {
  const exitCode = await loadtestMain([
    '--url', server.httpAddress, '--model', 'conduit-tiny', '--scenario', 'fixed',
    '--input-tokens', '32', '--output-tokens', '16', '--requests', '8', '--concurrency', '4',
    '--out', outDir, '--quiet',
  ]);
  assert.equal(exitCode, 0);
  const results = JSON.parse(readFileSync(path.join(outDir, 'results.json'), 'utf8'));
  assert.equal(results.errors.total, 0);
  assert.match(results.prompt_lengths, /^exact/);
  assert.equal(results.ttft_ms.count, 8);
  assert.equal(results.output_tokens.mean, 16);
  assert.ok(results.ttft_ms.p50 > 0 && results.ttft_ms.p50 <= results.e2e_ms.p50);
  assert.ok(results.output_token_throughput > 0);
  assert.match(readFileSync(path.join(outDir, 'report.html'), 'utf8'), /<svg/);
});
