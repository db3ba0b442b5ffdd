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

test('multi-turn chat users with a context document, a think time and a warm-up session, from the command line', async () => {
  const runDir = path.join(outDir, 'multi-turn');
  const exitCode = await loadtestMain([
    '--url', server.httpAddress, '--model', 'conduit-tiny', '--scenario', 'multi-turn', '--turns', '2',
    '--input-tokens', '8', '--output-tokens', '4', '--requests', '6', '--concurrency', '2',
    '--think-time-ms', '120', '--warmup', '1', '--context-tokens', '40', '--out', runDir, '--quiet',
  ]);
  assert.equal(exitCode, 0);
  const results = JSON.parse(readFileSync(path.join(runDir, 'results.json'), 'utf8'));
  assert.equal(results.errors.total, 0);
  assert.equal(results.requests.length, 4, 'the warm-up conversation is left out');
  assert.ok(!results.requests.some((request: { session: string }) => request.session === 'conversation-0'));
  for (const second of results.requests.filter((request: { turn: number }) => request.turn === 1)) {
    const first = results.requests.find((request: { session: string; turn: number }) => request.session === second.session && request.turn === 0);
    assert.ok(second.start_ms - (first.start_ms + first.e2e_ms) >= 118, 'the second turn waits the think time');
    assert.ok(first.input_tokens >= 40, `a first turn carries its document: ${first.input_tokens} prompt tokens`);
    assert.ok(second.cached_tokens >= 32, `a second turn finds its document and first turn cached: ${second.cached_tokens} tokens`);
  }
});

test('a negative think time, a fractional warm-up or context is a usage error', async () => {
  for (const flags of [['--think-time-ms', '-5'], ['--warmup', '1.5'], ['--context-tokens', '2.5']]) {
    const exitCode = await loadtestMain(['--url', server.httpAddress, '--model', 'conduit-tiny', '--scenario', 'multi-turn', ...flags, '--quiet']);
    assert.equal(exitCode, 2, flags.join(' '));
  }
});
