// Served throughput with 1 compute thread per worker against N: `conduit serve` on conduit-tiny,
// driven by `conduit loadtest` (a closed loop of 16 clients, 32-token prompts, 128 generated
// tokens each), the two thread counts alternating round after round so that the machine's drift
// does not pass for a difference. Prints output tok/s and TTFT per run, then the medians and the
// median of the per-round ratios.
//
//   npm run bench:served [-- --threads 2 --clients 16 --requests 64 --rounds 3]
//
// With --kernels A,B (e.g. amx,avx512) it compares two kernel paths instead, both on --threads
// threads: output tok/s and TTFT p99 per path, alternating round after round, and the median of
// the per-round ratios A / B. The issue's served figure for AMX is
//   npm run bench:served -- --kernels amx,avx512 --clients 32 --input-tokens 256
//
// Every process (gateway, worker, load generator) shares the machine, as on a one-box deployment.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';
import type { KernelPath } from '../native/api.ts';
import { kernelSupported } from '../native/index.ts';
import { freePort } from './free-port.ts';
import { median } from '../loadtest/stats.ts';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const conduitBin = path.join(repoRoot, 'bin', 'conduit.js');
const HEALTH_TIMEOUT_MS = 120_000;

interface Run {
  outputTokensPerSecond: number;
  ttftP50Ms: number;
  ttftP99Ms: number;
}

/** One served configuration: compute threads per worker and the kernel path it forces. */
interface Setup {
  label: string;
  threads: number;
  kernel: string;
}

async function waitForHealth(url: string, server: ReturnType<typeof spawn>): Promise<void> {
  const deadline = Date.now() + HEALTH_TIMEOUT_MS;
  while (Date.now() < deadline) {
    if (server.exitCode !== null) throw new Error(`conduit serve exited with code ${server.exitCode}`);
    const healthy = await fetch(`${url}/health`).then((response) => response.ok, () => false);
    if (healthy) return;
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  throw new Error(`conduit serve did not become healthy within ${HEALTH_TIMEOUT_MS / 1000} s`);
}

async function runOnce(workDir: string, setup: Setup, values: Record<string, string>): Promise<Run> {
  const numThreads = setup.threads;
  const [httpPort, metricsPort] = [await freePort(), await freePort()];
  const configPath = path.join(workDir, `threads-${numThreads}-${setup.kernel}.yaml`);
  writeFileSync(configPath, [
    'server:',
    `  host: 127.0.0.1`,
    `  http_port: ${httpPort}`,
    `  metrics_port: ${metricsPort}`,
    'models:',
    `  - path: ${JSON.stringify(path.join(repoRoot, 'models', 'conduit-tiny'))}`,
    '    num_workers: 1',
    '    max_num_seqs: 32',
    `    threads_per_worker: ${numThreads}`,
    `    kernel: ${setup.kernel}`,
    '',
  ].join('\n'));
  // Its log (JSON on stdout, a failed start's fatal line among it) goes to a file, read only on a failure.
  const logFile = path.join(workDir, `threads-${numThreads}.log`);
  const logFd = openSync(logFile, 'w');
  const server = spawn(process.execPath, [conduitBin, 'serve', '--config', configPath], { stdio: ['ignore', logFd, 'pipe'] });
  closeSync(logFd);
  const serverLog: Buffer[] = [];
  server.stderr!.on('data', (chunk: Buffer) => serverLog.push(chunk));
  const url = `http://127.0.0.1:${httpPort}`;
  try {
    await waitForHealth(url, server).catch((err: Error) => {
      throw new Error(`${err.message}:\n${readFileSync(logFile, 'utf8')}${Buffer.concat(serverLog).toString()}`);
    });
    const outDir = path.join(workDir, `out-${numThreads}`);
    const loadtest = spawn(process.execPath, [
      conduitBin, 'loadtest', '--url', url, '--model', 'conduit-tiny', '--scenario', 'fixed',
      '--input-tokens', values['input-tokens'], '--output-tokens', '128', '--requests', values.requests,
      '--concurrency', values.clients, '--seed', '1', '--out', outDir,
    ], { stdio: ['ignore', 'ignore', 'pipe'] });
    const loadtestLog: Buffer[] = [];
    loadtest.stderr!.on('data', (chunk: Buffer) => loadtestLog.push(chunk));
    const [code] = await once(loadtest, 'exit');
    if (code !== 0) throw new Error(`conduit loadtest exited with code ${code}:\n${Buffer.concat(loadtestLog).toString()}`);
    const results = JSON.parse(readFileSync(path.join(outDir, 'results.json'), 'utf8'));
    if (results.num_succeeded !== results.num_requests) throw new Error(`${results.num_requests - results.num_succeeded} requests failed`);
    return { outputTokensPerSecond: results.output_token_throughput, ttftP50Ms: results.ttft_ms.p50, ttftP99Ms: results.ttft_ms.p99 };
  } finally {
    server.kill('SIGTERM');
    if (server.exitCode === null) await once(server, 'exit');
  }
}


async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      threads: { type: 'string', default: '2' },
      clients: { type: 'string', default: '16' },
      requests: { type: 'string', default: '64' },
      rounds: { type: 'string', default: '3' },
      'input-tokens': { type: 'string', default: '32' },
      kernels: { type: 'string' },
    },
  });
  const numThreads = Number(values.threads);
  const kernels = values.kernels?.split(',');
  if (kernels !== undefined && kernels.length !== 2) throw new Error('--kernels takes two kernel paths, e.g. amx,avx512');
  const unsupported = kernels?.filter((kernel) => !kernelSupported(kernel as KernelPath));
  if (unsupported !== undefined && unsupported.length > 0) {
    console.log(`CPU: ${os.cpus()[0]?.model.trim()}: cannot compare ${kernels!.join(' and ')}: this CPU cannot run ${unsupported.join(', ')}` +
      `${unsupported.includes('amx') ? ' (no AMX on this CPU, or the OS refused its tile state)' : ''}`);
    return;
  }
  const setups: Setup[] = kernels === undefined
    ? [{ label: '1 thread', threads: 1, kernel: 'auto' }, { label: `${numThreads} threads`, threads: numThreads, kernel: 'auto' }]
    : kernels.map((kernel) => ({ label: kernel, threads: numThreads, kernel }));
  console.log(`CPU: ${os.cpus()[0]?.model.trim()}, ${os.availableParallelism()} CPUs`);
  console.log(`conduit-tiny served, ${values.clients} clients, ${values.requests} requests of ${values['input-tokens']} + 128 tokens per run; ` +
    `${setups[0].label} vs ${setups[1].label}`);
  const workDir = mkdtempSync(path.join(os.tmpdir(), 'conduit-bench-served-'));
  const runs = new Map<Setup, Run[]>(setups.map((setup) => [setup, []]));
  try {
    for (let round = 0; round < Number(values.rounds); round++) {
      for (const setup of setups) {
        const run = await runOnce(workDir, setup, values);
        runs.get(setup)!.push(run);
        console.log(`round ${round + 1}, ${setup.label}: ${run.outputTokensPerSecond.toFixed(1)} tok/s, TTFT p50 ${run.ttftP50Ms.toFixed(1)} ms, p99 ${run.ttftP99Ms.toFixed(1)} ms`);
      }
    }
  } finally {
    rmSync(workDir, { recursive: true, force: true });
  }
  const [first, second] = setups.map((setup) => runs.get(setup)!);
  if (kernels !== undefined) {
    const ratio = median(first.map((run, round) => run.outputTokensPerSecond / second[round].outputTokensPerSecond));
    const ttftRatio = median(first.map((run, round) => run.ttftP99Ms / second[round].ttftP99Ms));
    console.log(`\n${setups.map((setup, i) => `${setup.label}: ${median([first, second][i].map((run) => run.outputTokensPerSecond)).toFixed(1)} tok/s, ` +
      `TTFT p99 ${median([first, second][i].map((run) => run.ttftP99Ms)).toFixed(1)} ms`).join('; ')}; ` +
      `${kernels[0]} / ${kernels[1]}: tok/s ${ratio.toFixed(2)}, TTFT p99 ${ttftRatio.toFixed(2)} (medians of the rounds' ratios)`);
    return;
  }
  const one = first;
  const many = second;
  const ratio = median(many.map((run, round) => run.outputTokensPerSecond / one[round].outputTokensPerSecond));
  console.log(`\n1 thread: ${median(one.map((run) => run.outputTokensPerSecond)).toFixed(1)} tok/s; ` +
    `${numThreads} threads: ${median(many.map((run) => run.outputTokensPerSecond)).toFixed(1)} tok/s; ` +
    `${numThreads} / 1 = ${ratio.toFixed(2)} (median of the rounds' ratios; target >= 1)`);
}

await main();
