// A soak: `conduit serve` on its default configuration (conduit-tiny and the KServe models)
// under steady load for a while, with the resident memory of the gateway and of each of its
// engine workers sampled every minute (VmRSS from /proc). After a warm-up, a least-squares line
// through each process's samples gives its growth in MB per 10 minutes; the run fails when any
// process grows faster than the threshold, or when any request fails. Before the clock starts,
// every KV-cache block is written once (see fillKvCache), so the worker's pool counts in full.
//
//   npm run soak [-- --minutes 30 --streams 2 --kserve-clients 1 --sample-s 60 --warmup-minutes 5 --max-slope-mb 5]
//
// Load: `--streams` clients each looping streamed chat completions (64 tokens) and
// `--kserve-clients` clients each looping KServe v2 JSON infers on digits, fraud and
// digits_pipeline in turn, with a short pause between infers so the machine stays usable.
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { readFileSync, readdirSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';
import { freePort } from './free-port.ts';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const conduitBin = path.join(repoRoot, 'bin', 'conduit.js');
const HEALTH_TIMEOUT_MS = 180_000;
const REQUEST_TIMEOUT_MS = 60_000;
const KSERVE_PAUSE_MS = 20;

const { values } = parseArgs({
  options: {
    minutes: { type: 'string', default: '30' },
    streams: { type: 'string', default: '2' },
    'kserve-clients': { type: 'string', default: '1' },
    'sample-s': { type: 'string', default: '60' },
    'warmup-minutes': { type: 'string', default: '5' },
    'max-slope-mb': { type: 'string', default: '5' },
  },
});
const durationMs = Number(values.minutes) * 60_000;
const sampleMs = Number(values['sample-s']) * 1000;
const warmupMs = Number(values['warmup-minutes']) * 60_000;
const maxSlopeMbPer10Min = Number(values['max-slope-mb']);

/** VmRSS of a process in MB, or null once it is gone. */
function rssMb(pid: number): number | null {
  try {
    const match = /^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return match ? Number(match[1]) / 1024 : null;
  } catch {
    return null;
  }
}

/** The pids of the gateway's engine workers: its children whose command line is `conduit worker`. */
function workerPids(gatewayPid: number): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const parentPid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (parentPid !== gatewayPid) continue;
      const argv = readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0');
      if (argv.includes('worker')) pids.push(Number(entry));
    } catch {
      // the process exited between listing and reading
    }
  }
  return pids.sort((a, b) => a - b);
}

/** Least-squares slope of ys over xs. */
function slope(xs: readonly number[], ys: readonly number[]): number {
  const n = xs.length;
  const meanX = xs.reduce((a, b) => a + b, 0) / n;
  const meanY = ys.reduce((a, b) => a + b, 0) / n;
  let num = 0;
  let den = 0;
  for (let i = 0; i < n; i++) {
    num += (xs[i] - meanX) * (ys[i] - meanY);
    den += (xs[i] - meanX) ** 2;
  }
  return den === 0 ? 0 : num / den;
}

async function waitForHealth(url: string, server: ChildProcess, log: Buffer[]): Promise<void> {
  const deadline = Date.now() + HEALTH_TIMEOUT_MS;
  while (Date.now() < deadline) {
    if (server.exitCode !== null) throw new Error(`conduit serve exited with code ${server.exitCode}:\n${Buffer.concat(log)}`);
    const ready = await fetch(`${url}/v2/health/ready`).then((response) => response.ok, () => false);
    if (ready) return;
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  throw new Error(`conduit serve not ready within ${HEALTH_TIMEOUT_MS / 1000} s:\n${Buffer.concat(log)}`);
}

interface Counts { streams: number; tokens: number; infers: number; errors: number; firstErrors: string[] }

function recordError(counts: Counts, what: string): void {
  counts.errors++;
  if (counts.firstErrors.length < 10) counts.firstErrors.push(what);
}

async function streamLoop(url: string, counts: Counts, stop: () => boolean): Promise<void> {
  for (let turn = 0; !stop(); turn++) {
    try {
      const response = await fetch(`${url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          model: 'conduit-tiny',
          messages: [{ role: 'user', content: `Tell me a story about the number ${turn % 97}.` }],
          max_tokens: 64,
          stream: true,
          stream_options: { include_usage: true },
        }),
        signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
      });
      const text = await response.text();
      if (response.status !== 200 || !text.includes('data: [DONE]')) {
        recordError(counts, `chat stream: ${response.status} ${text.slice(0, 200)}`);
        continue;
      }
      const usage = /"completion_tokens":(\d+)/.exec(text);
      counts.streams++;
      counts.tokens += usage ? Number(usage[1]) : 0;
    } catch (err) {
      recordError(counts, `chat stream: ${(err as Error).message}`);
    }
  }
}

const kserveRequests: { model: string; body: unknown }[] = [
  { model: 'digits', body: { inputs: [{ name: 'pixels', shape: [1, 64], datatype: 'FP32', data: Array.from({ length: 64 }, (_, i) => (i % 17) / 16) }] } },
  { model: 'fraud', body: { inputs: [{ name: 'features', shape: [1, 8], datatype: 'FP32', data: [0.1, 0.5, 0.2, 0.9, 0.3, 0.0, 1.0, 0.4] }] } },
  { model: 'digits_pipeline', body: { inputs: [{ name: 'RAW_PIXELS', shape: [1, 64], datatype: 'UINT8', data: Array.from({ length: 64 }, (_, i) => (i * 7) % 17) }] } },
];

async function kserveLoop(url: string, counts: Counts, stop: () => boolean): Promise<void> {
  for (let turn = 0; !stop(); turn++) {
    const { model, body } = kserveRequests[turn % kserveRequests.length];
    try {
      const response = await fetch(`${url}/v2/models/${model}/infer`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
        signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
      });
      const text = await response.text();
      if (response.status !== 200) recordError(counts, `${model} infer: ${response.status} ${text.slice(0, 200)}`);
      else counts.infers++;
    } catch (err) {
      recordError(counts, `${model} infer: ${(err as Error).message}`);
    }
    await new Promise((resolve) => setTimeout(resolve, KSERVE_PAUSE_MS));
  }
}

/** Block size of configs/default.yaml's model (the schema's default). */
const BLOCK_SIZE_TOKENS = 16;
const FILL_PROMPT_TOKENS = 1000;

/**
 * Touches every KV-cache block once before the soak: the pool is allocated up front but its pages
 * become resident only when first written, and the free queue hands out never-used blocks before
 * cached ones, so under steady load a worker's RSS would climb for many minutes as it reaches
 * blocks it never wrote. Distinct prompts of FILL_PROMPT_TOKENS token ids, enough to cover the
 * pool of every worker.
 */
async function fillKvCache(url: string, metricsUrl: string): Promise<number> {
  const text = await (await fetch(`${metricsUrl}/metrics`)).text();
  const numBlocks = [...text.matchAll(/^conduit_kv_blocks_total\{[^}]*\} (\S+)$/gm)].reduce((sum, match) => sum + Number(match[1]), 0);
  const numPrompts = Math.ceil((numBlocks * BLOCK_SIZE_TOKENS * 1.25) / FILL_PROMPT_TOKENS);
  for (let i = 0; i < numPrompts; i++) {
    const prompt = Array.from({ length: FILL_PROMPT_TOKENS }, (_, j) => 10 + ((i * 7919 + j * 104729) % 4000));
    const response = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'conduit-tiny', prompt, max_tokens: 1 }),
      signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
    });
    if (response.status !== 200) throw new Error(`filling the KV cache: ${response.status} ${await response.text()}`);
  }
  return numBlocks;
}

async function main(): Promise<number> {
  console.log(`CPU: ${os.cpus()[0]?.model.trim()}, ${os.availableParallelism()} CPUs; ${new Date().toISOString()}`);
  console.log(`soak: conduit serve (configs/default.yaml) for ${values.minutes} min, ${values.streams} chat streams + ` +
    `${values['kserve-clients']} KServe clients; RSS every ${values['sample-s']} s; slope after ${values['warmup-minutes']} min, ` +
    `limit ${maxSlopeMbPer10Min} MB per 10 min`);
  const [httpPort, metricsPort, grpcPort] = [await freePort(), await freePort(), await freePort()];
  const server = spawn(process.execPath, [
    conduitBin, 'serve', '--http-port', String(httpPort), '--metrics-port', String(metricsPort), '--grpc-port', String(grpcPort),
  ], { stdio: ['ignore', 'pipe', 'pipe'] });
  // The latest of its output, its log (stdout: lifecycle and fatal lines among the access lines) and stderr, for a failure's message.
  const serverLog: Buffer[] = [];
  const keep = (chunk: Buffer) => {
    serverLog.push(chunk);
    if (serverLog.length > 200) serverLog.shift();
  };
  server.stdout!.on('data', keep);
  server.stderr!.on('data', keep);
  const url = `http://127.0.0.1:${httpPort}`;
  const counts: Counts = { streams: 0, tokens: 0, infers: 0, errors: 0, firstErrors: [] };
  let stopping = false;
  try {
    await waitForHealth(url, server, serverLog);
    const numBlocks = await fillKvCache(url, `http://127.0.0.1:${metricsPort}`);
    console.log(`every KV block written once first (${numBlocks} blocks of ${BLOCK_SIZE_TOKENS} tokens)`);
    const gatewayPid = server.pid!;
    const startedMs = Date.now();
    const loops = [
      ...Array.from({ length: Number(values.streams) }, () => streamLoop(url, counts, () => stopping)),
      ...Array.from({ length: Number(values['kserve-clients']) }, () => kserveLoop(url, counts, () => stopping)),
    ];
    const names = ['gateway', ...workerPids(gatewayPid).map((pid, i) => `worker ${i} (${pid})`)];
    const pids = [gatewayPid, ...workerPids(gatewayPid)];
    const samples: { minute: number; rssMb: (number | null)[] }[] = [];
    console.log(`\n| minute | ${names.join(' MB | ')} MB | streams | tokens | infers | errors |`);
    console.log(`| --- |${names.map(() => ' --- |').join('')} --- | --- | --- | --- |`);
    const sample = () => {
      const minute = (Date.now() - startedMs) / 60_000;
      const rss = pids.map(rssMb);
      samples.push({ minute, rssMb: rss });
      console.log(`| ${minute.toFixed(1)} | ${rss.map((mb) => mb === null ? 'gone' : mb.toFixed(1)).join(' | ')} | ` +
        `${counts.streams} | ${counts.tokens} | ${counts.infers} | ${counts.errors} |`);
    };
    sample();
    while (Date.now() - startedMs < durationMs) {
      await new Promise((resolve) => setTimeout(resolve, Math.min(sampleMs, durationMs - (Date.now() - startedMs))));
      if (server.exitCode !== null) throw new Error(`conduit serve exited with code ${server.exitCode}`);
      sample();
    }
    stopping = true;
    await Promise.all(loops);
    const elapsedS = (Date.now() - startedMs) / 1000;
    console.log(`\n${counts.streams} streams (${counts.tokens} tokens, ${(counts.tokens / elapsedS).toFixed(1)} tok/s), ` +
      `${counts.infers} infers (${(counts.infers / elapsedS).toFixed(1)}/s), ${counts.errors} errors in ${elapsedS.toFixed(0)} s`);
    for (const error of counts.firstErrors) console.log(`  error: ${error}`);
    const kept = samples.filter((s) => s.minute * 60_000 >= warmupMs);
    let failed = counts.errors > 0;
    if (kept.length < 3) {
      console.log(`fewer than 3 samples after the warm-up: no slope`);
    } else {
      for (const [i, name] of names.entries()) {
        const points = kept.filter((s) => s.rssMb[i] !== null);
        if (points.length !== kept.length) {
          console.log(`${name}: exited during the soak`);
          failed = true;
          continue;
        }
        const mbPer10Min = slope(points.map((s) => s.minute), points.map((s) => s.rssMb[i]!)) * 10;
        const verdict = mbPer10Min <= maxSlopeMbPer10Min ? 'ok' : 'FAIL';
        if (verdict === 'FAIL') failed = true;
        console.log(`${name}: ${mbPer10Min >= 0 ? '+' : ''}${mbPer10Min.toFixed(2)} MB per 10 min after the warm-up ` +
          `(${points[0].rssMb[i]!.toFixed(1)} -> ${points[points.length - 1].rssMb[i]!.toFixed(1)} MB): ${verdict}`);
      }
    }
    console.log(failed ? 'soak: FAIL' : 'soak: pass');
    return failed ? 1 : 0;
  } finally {
    stopping = true;
    if (server.exitCode === null) {
      server.kill('SIGTERM');
      await once(server, 'exit');
    }
  }
}

process.exitCode = await main();
