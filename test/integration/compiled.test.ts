// `conduit` runs the compiled JavaScript in dist/ (`npm run build`, which `npm test` runs first):
// no TypeScript loader beside the server, every file the compiled modules read found from dist/,
// and a missing or stale build refused in one line.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test, type TestContext } from 'node:test';
import { MAX_INLINE_PROMPT_CHARS } from '../../gateway/prompt-encoder.ts';
import { heldOutDigits } from '../../tools/make-classic-models.ts';
import { startCli, type CliProcess } from './cli-process.ts';
import { boundedFetch, defaultModelDir, openaiClient, repoRoot, within } from './harness.ts';
import { connectInferenceClient } from '../../gateway/kserve/test/grpc-client.ts';

const conduitBin = path.join(repoRoot, 'bin', 'conduit.js');

/** Runs a command to its end: exit code and output. */
async function run(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (data: Buffer) => (stdout += data.toString()));
  child.stderr!.on('data', (data: Buffer) => (stderr += data.toString()));
  const code = await within(new Promise<number | null>((resolve) => child.once('exit', resolve)), `${args.join(' ')} exits`);
  return { code, stdout, stderr };
}

/** The command lines of every process in a process group (Linux's /proc). */
function groupCommandLines(groupId: number): string[] {
  const commandLines: string[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      // pid (comm) state ppid pgrp ...: comm may hold spaces, so fields count from its last ')'.
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const [, , groupField] = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      if (Number(groupField) === groupId) commandLines.push(readFileSync(`/proc/${entry}/cmdline`, 'utf8').replaceAll('\0', ' ').trim());
    } catch {
      // The process ended while being read.
    }
  }
  return commandLines;
}

/** `conduit serve ARGS` on free ports in a process group of its own, ended with the test. */
function startServe(t: TestContext, args: string[]): CliProcess {
  return startCli(t, ['serve', ...args, '--http-port', '0', '--metrics-port', '0', '--grpc-port', '0']);
}

async function stop(server: CliProcess): Promise<void> {
  server.child.kill('SIGTERM');
  assert.equal(await within(server.exited, 'exit after SIGTERM'), 0);
}

test('conduit --help runs from dist/', async () => {
  const { code, stdout } = await run([conduitBin, '--help']);
  assert.equal(code, 0);
  assert.match(stdout, /^usage: conduit serve\|worker\|rank\|loadtest .*\n[\s\S]*\nusage: conduit serve \[--config FILE\]/);
});

test('a missing or stale dist/ is refused in one line, a current one runs', async (t) => {
  // A package of its own: conduit.js, a source file, and (in turn) no build, an older one, a newer one.
  const packageDir = mkdtempSync(path.join(os.tmpdir(), 'conduit-dist-'));
  t.after(() => rmSync(packageDir, { recursive: true, force: true }));
  mkdirSync(path.join(packageDir, 'bin'));
  copyFileSync(conduitBin, path.join(packageDir, 'bin', 'conduit.js'));
  const sourceFile = path.join(packageDir, 'bin', 'cli.ts');
  writeFileSync(sourceFile, 'export {};\n');
  const refusal = 'conduit: dist/ is missing or stale; run npm run build\n';
  const packageBin = path.join(packageDir, 'bin', 'conduit.js');
  assert.deepEqual(await run([packageBin, '--help']), { code: 1, stdout: '', stderr: refusal });

  mkdirSync(path.join(packageDir, 'dist', 'bin'), { recursive: true });
  writeFileSync(path.join(packageDir, 'dist', 'bin', 'cli.js'), 'export async function main(argv) { console.log(`compiled ${argv.join(" ")}`); return 0; }\n');
  const buildInfoFile = path.join(packageDir, 'dist', '.tsbuildinfo');
  writeFileSync(buildInfoFile, JSON.stringify({ fileNames: ['../node_modules/typescript/lib/lib.es5.d.ts', '../bin/cli.ts'] }));
  const builtAt = new Date('2026-01-01T00:00:00Z');
  utimesSync(buildInfoFile, builtAt, builtAt);
  utimesSync(sourceFile, new Date(builtAt.getTime() + 1000), new Date(builtAt.getTime() + 1000));
  assert.deepEqual(await run([packageBin, '--help']), { code: 1, stdout: '', stderr: refusal }, 'a source changed after the build');

  utimesSync(sourceFile, new Date(builtAt.getTime() - 1000), new Date(builtAt.getTime() - 1000));
  assert.deepEqual(await run([packageBin, '--help']), { code: 0, stdout: 'compiled --help\n', stderr: '' });
});

test('the compiled server and its worker run with no TypeScript loader beside them', { timeout: 120_000 }, async (t) => {
  // No model repository: its script models are users' TypeScript, which tsx (and esbuild) loads.
  const server = startServe(t, ['--model', defaultModelDir]);
  const addresses = await server.serving();
  const client = openaiClient(`${addresses.http}/v1`);
  assert.equal((await client.completions.create({ model: 'conduit-tiny', prompt: 'In the beginning', max_tokens: 2 })).usage?.completion_tokens, 2);

  const commandLines = groupCommandLines(server.pid);
  assert.ok(commandLines.some((commandLine) => commandLine.includes('conduit.js worker')), `the worker is in the group: ${commandLines.join('\n')}`);
  // Under tsx each gateway and worker had an esbuild service process beside it.
  assert.deepEqual(commandLines.filter((commandLine) => /esbuild|tsx/.test(commandLine)), []);
  await stop(server);
});

test('the compiled server finds every file it reads', { timeout: 120_000 }, async (t) => {
  // The model repository brings ONNX Runtime's worker threads and script models; the gRPC port the
  // KServe protos; GET / the chat page; a long prompt the offload pool's threads; the LLM's worker
  // engine.proto and the native addon.
  const server = startServe(t, ['--model', defaultModelDir, '--model-repository', path.join(repoRoot, 'models')]);
  const addresses = await server.serving();

  const page = await boundedFetch(`${addresses.http}/`);
  assert.equal(page.status, 200);
  assert.match(await page.text(), /^<!doctype html>/);

  const client = openaiClient(`${addresses.http}/v1`);
  const completion = await client.completions.create({ model: 'conduit-tiny', prompt: 'In the beginning', max_tokens: 2, temperature: 0 });
  assert.equal(completion.usage?.completion_tokens, 2);

  const longPrompt = 'And God said, Let there be light. '.repeat(Math.ceil((MAX_INLINE_PROMPT_CHARS + 1) / 34));
  const tokenized = await boundedFetch(`${addresses.http}/tokenize`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'conduit-tiny', prompt: longPrompt }) });
  assert.equal(tokenized.status, 200);
  assert.ok(((await tokenized.json()) as { tokens: number[] }).tokens.length > 100);

  const { images } = heldOutDigits(1, 5);
  const digits = await boundedFetch(`${addresses.http}/v2/models/digits/infer`, {
    method: 'POST',
    body: JSON.stringify({ inputs: [{ name: 'pixels', shape: [1, 64], datatype: 'FP32', data: Array.from(images[0], (value) => value / 255) }] }),
  });
  assert.equal(digits.status, 200);
  assert.equal(((await digits.json()) as { outputs: { data: number[] }[] }).outputs[0].data.length, 10);

  const grpcClient = connectInferenceClient(addresses.grpc!);
  t.after(() => grpcClient.close());
  const pipeline = await within(new Promise<any>((resolve, reject) => grpcClient.ModelInfer({
    model_name: 'digits_pipeline', inputs: [{ name: 'RAW_PIXELS', datatype: 'UINT8', shape: [1, 64] }], outputs: [{ name: 'LABEL' }],
    raw_input_contents: [Buffer.from(images[0])],
  }, (err: Error | null, response: unknown) => (err ? reject(err) : resolve(response)))), 'ModelInfer');
  assert.equal(pipeline.raw_output_contents.length, 1);
  await stop(server);
});
