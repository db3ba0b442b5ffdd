// A soak: `conduit serve` on its default configuration (conduit-tiny and the KServe models)
// under steady load for a while, with the resident memory of the gateway and of each of its
// engine workers sampled every minute (VmRSS from /proc). After a warm-up, a least-squares line
// through each process's samples gives its growth in MB per 10 minutes; the run fails when any
// process grows faster than the threshold, or when any request fails. Before the clock starts,
// every KV-cache block is written once (see fillKvCache), so the worker's pool counts in full.
//
//   npm run soak [-- --minutes 30 --streams 2 --kserve-clients 1 --sample-s 60 --warmup-minutes 5 --max-slope-mb 5
//                   --gzip-clients 1 --grpc-auth-clients 1 --store-clients 1 --slow-ws-clients 1 --store-max-mb 16]
//
// The server runs with an API key (every client sends it) and a Responses store of
// `--store-max-mb`. Load: `--streams` clients each looping streamed chat completions (64 tokens)
// and `--kserve-clients` clients each looping KServe v2 JSON infers on digits, fraud and
// digits_pipeline in turn, with a short pause between infers so the machine stays usable; and the
// hostile cases, each counted and checked:
// - `--gzip-clients`: KServe infers with gzip bodies, every 20th a gzip bomb (64 MiB of zeros in
//   64 KB), which must be a 413;
// - `--grpc-auth-clients`: KServe gRPC calls without a key (UNAUTHENTICATED), with the key
//   (ModelInfer OK) and administrative ones with it (LogSettings: PERMISSION_DENIED, a user key);
// - `--store-clients`: Responses stored with 20 log-probabilities per token, each read back; an
//   older one's eviction (404) shows the store's byte bound at work;
// - `--slow-ws-clients`: Responses WebSockets that ask for 2,000 tokens with 20 log-probabilities
//   each and stop reading for 45 s; each must be cut (client_too_slow, close 1008; or, still
//   paused past ws's close timeout, dropped: 1006) or have finished before the bound, its memory freed.
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';
import { gzipSync } from 'node:zlib';
import * as grpc from '@grpc/grpc-js';
import { WebSocket } from 'ws';
import { loadConfigFile } from '../configs/schema.ts';
import { connectInferenceClient } from '../gateway/kserve/grpc.ts';
import { freePort } from './free-port.ts';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const conduitBin = path.join(repoRoot, 'bin', 'conduit.js');
const HEALTH_TIMEOUT_MS = 180_000;
const REQUEST_TIMEOUT_MS = 60_000;
const KSERVE_PAUSE_MS = 20;
/** The API key the soak's server takes, and every client sends. */
const API_KEY = 'soak-key-8c1f';
const AUTHORIZATION = { authorization: `Bearer ${API_KEY}` };
/**
 * A slow WebSocket reader stops reading this long: long enough for its 2,000 tokens to finish
 * under the soak's other load (20-40 s when the worker is shared) and for its closing events to
 * wait past the 10 s grace. The server then closes it (1008); a reader still paused 30 s after
 * that (ws's close timeout) is dropped without the close frame (1006): a cut either way.
 */
const SLOW_READER_PAUSE_MS = 45_000;
const GZIP_BOMB = gzipSync(Buffer.alloc(64 * 1024 * 1024));

const { values } = parseArgs({
  options: {
    minutes: { type: 'string', default: '30' },
    streams: { type: 'string', default: '2' },
    'kserve-clients': { type: 'string', default: '1' },
    'sample-s': { type: 'string', default: '60' },
    'warmup-minutes': { type: 'string', default: '5' },
    'max-slope-mb': { type: 'string', default: '5' },
    'gzip-clients': { type: 'string', default: '1' },
    'grpc-auth-clients': { type: 'string', default: '1' },
    'store-clients': { type: 'string', default: '1' },
    'slow-ws-clients': { type: 'string', default: '1' },
    'store-max-mb': { type: 'string', default: '16' },
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
    const ready = await fetch(`${url}/v2/health/ready`, { headers: AUTHORIZATION }).then((response) => response.ok, () => false);
    if (ready) return;
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  throw new Error(`conduit serve not ready within ${HEALTH_TIMEOUT_MS / 1000} s:\n${Buffer.concat(log)}`);
}

interface Counts {
  streams: number; tokens: number; infers: number; errors: number; firstErrors: string[];
  gzipInfers: number; bombsRefused: number;
  grpcInfers: number; grpcRefused: number;
  storedResponses: number; firstEvictedAfter: number | null;
  slowCuts: number; slowDropped: number; slowCompleted: number;
}

function recordError(counts: Counts, what: string): void {
  counts.errors++;
  if (counts.firstErrors.length < 10) counts.firstErrors.push(what);
}

async function streamLoop(url: string, counts: Counts, stop: () => boolean): Promise<void> {
  for (let turn = 0; !stop(); turn++) {
    try {
      const response = await fetch(`${url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...AUTHORIZATION },
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
        headers: { 'content-type': 'application/json', ...AUTHORIZATION },
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

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** KServe infers with gzip bodies; every 20th a bomb, which must be refused at the body limit (413). */
async function gzipLoop(url: string, counts: Counts, stop: () => boolean): Promise<void> {
  for (let turn = 0; !stop(); turn++) {
    const isBomb = turn % 20 === 19;
    const { model, body } = kserveRequests[turn % kserveRequests.length];
    try {
      const response = await fetch(`${url}/v2/models/${model}/infer`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'content-encoding': 'gzip', ...AUTHORIZATION },
        body: new Uint8Array(isBomb ? GZIP_BOMB : gzipSync(JSON.stringify(body))),
        signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
      });
      const text = await response.text();
      if (response.status === (isBomb ? 413 : 200)) {
        if (isBomb) counts.bombsRefused++;
        else counts.gzipInfers++;
      } else {
        recordError(counts, `gzip ${isBomb ? 'bomb' : model}: ${response.status} ${text.slice(0, 200)}`);
      }
    } catch (err) {
      recordError(counts, `gzip infer: ${(err as Error).message}`);
    }
    await sleep(KSERVE_PAUSE_MS);
  }
}

/** KServe gRPC without a key (refused), with it (served), and an administrative call with it (refused: not admin). */
async function grpcAuthLoop(grpcAddress: string, counts: Counts, stop: () => boolean): Promise<void> {
  const client = connectInferenceClient(grpcAddress);
  const withKey = new grpc.Metadata();
  withKey.set('authorization', `Bearer ${API_KEY}`);
  const call = (rpc: string, request: unknown, metadata: grpc.Metadata) => new Promise<grpc.status>((resolve) => {
    client[rpc](request, metadata, { deadline: Date.now() + REQUEST_TIMEOUT_MS }, (err: grpc.ServiceError | null) => resolve(err?.code ?? grpc.status.OK));
  });
  const infer = {
    model_name: 'fraud', inputs: [{ name: 'features', datatype: 'FP32', shape: ['1', '8'] }],
    raw_input_contents: [Buffer.from(new Float32Array([0.1, 0.5, 0.2, 0.9, 0.3, 0.0, 1.0, 0.4]).buffer)],
  };
  try {
    while (!stop()) {
      const expected: [string, unknown, grpc.Metadata, grpc.status][] = [
        ['ModelInfer', infer, new grpc.Metadata(), grpc.status.UNAUTHENTICATED],
        ['LogSettings', { settings: { log_verbose_level: { uint32_param: 2 } } }, new grpc.Metadata(), grpc.status.UNAUTHENTICATED],
        ['LogSettings', { settings: { log_verbose_level: { uint32_param: 2 } } }, withKey, grpc.status.PERMISSION_DENIED],
        ['ModelInfer', infer, withKey, grpc.status.OK],
      ];
      for (const [rpc, request, metadata, status] of expected) {
        const code = await call(rpc, request, metadata);
        if (code !== status) recordError(counts, `gRPC ${rpc}: ${grpc.status[code]}, expected ${grpc.status[status]}`);
        else if (code === grpc.status.OK) counts.grpcInfers++;
        else counts.grpcRefused++;
      }
      await sleep(KSERVE_PAUSE_MS);
    }
  } finally {
    client.close();
  }
}

/**
 * Stored responses with 20 log-probabilities per token, each read back once; every tenth turn an
 * older one, never read since (a read would make it recently used), is asked for: its 404 shows
 * the store's byte bound at work.
 */
async function storeLoop(url: string, counts: Counts, stop: () => boolean): Promise<void> {
  const storedIds: string[] = [];
  let numProbed = 0;
  for (let turn = 0; !stop(); turn++) {
    try {
      const response = await fetch(`${url}/v1/responses`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...AUTHORIZATION },
        body: JSON.stringify({
          model: 'conduit-tiny', input: `Count to ${turn % 89}.`, max_output_tokens: 128, ignore_eos: true,
          include: ['message.output_text.logprobs'], top_logprobs: 20, store: true,
        }),
        signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
      });
      const created = await response.json() as { id: string };
      if (response.status !== 200) {
        recordError(counts, `store: ${response.status} ${JSON.stringify(created).slice(0, 200)}`);
        continue;
      }
      storedIds.push(created.id);
      const read = await fetch(`${url}/v1/responses/${created.id}`, { headers: AUTHORIZATION, signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS) });
      await read.arrayBuffer();
      if (read.status !== 200) recordError(counts, `store: the response just stored answered ${read.status}`);
      counts.storedResponses++;
      if (counts.firstEvictedAfter === null && turn % 10 === 9) {
        const old = await fetch(`${url}/v1/responses/${storedIds[numProbed++]}`, { headers: AUTHORIZATION, signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS) });
        await old.arrayBuffer();
        if (old.status === 404) counts.firstEvictedAfter = counts.storedResponses;
      }
    } catch (err) {
      recordError(counts, `store: ${(err as Error).message}`);
    }
  }
}

/** Responses WebSockets that stop reading a long response with log-probabilities: each must be cut (1008, client_too_slow). */
async function slowWebSocketLoop(wsUrl: string, counts: Counts, stop: () => boolean): Promise<void> {
  while (!stop()) {
    const socket = new WebSocket(wsUrl, { headers: AUTHORIZATION });
    socket.on('error', () => {});
    try {
      await once(socket, 'open');
      const closed = once(socket, 'close');
      socket.send(JSON.stringify({
        type: 'response.create', model: 'conduit-tiny', input: 'Tell a long story.', max_output_tokens: 2000, ignore_eos: true,
        include: ['message.output_text.logprobs'], top_logprobs: 20, store: false,
      }));
      await once(socket, 'message');
      socket.pause();
      await sleep(SLOW_READER_PAUSE_MS);
      let last = '';
      socket.on('message', (data: Buffer) => {
        last = data.toString();
      });
      socket.resume();
      let timer: NodeJS.Timeout | undefined;
      const outcome = await Promise.race([closed, new Promise<null>((resolve) => { timer = setTimeout(resolve, REQUEST_TIMEOUT_MS, null); })]);
      clearTimeout(timer);
      const code = outcome === null ? null : (outcome as [number])[0];
      const isCompleted = last.includes('"type":"response.incomplete"') || last.includes('"type":"response.completed"');
      if (code === 1008 && last.includes('"code":"client_too_slow"')) counts.slowCuts++;
      else if (code === 1006 && !isCompleted) counts.slowDropped++;
      else if (isCompleted) counts.slowCompleted++;
      else recordError(counts, `slow WebSocket: closed ${code ?? 'never'}, last event ${last.slice(0, 120)}`);
    } catch (err) {
      recordError(counts, `slow WebSocket: ${(err as Error).message}`);
    } finally {
      socket.terminate();
    }
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
      headers: { 'content-type': 'application/json', ...AUTHORIZATION },
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
  // configs/default.yaml with an API key and a Responses store of --store-max-mb (paths made absolute).
  const configDir = mkdtempSync(path.join(os.tmpdir(), 'conduit-soak-'));
  const base = loadConfigFile(path.join(repoRoot, 'configs', 'default.yaml'));
  const configFile = path.join(configDir, 'soak.yaml');
  writeFileSync(configFile, JSON.stringify({
    server: {
      http_port: base.server.http_port, metrics_port: base.server.metrics_port,
      api_keys: [{ key: API_KEY, name: 'soak' }],
      response_store_max_bytes: Number(values['store-max-mb']) * 1024 * 1024,
    },
    models: base.models.map(({ path: modelPath, num_workers, max_num_seqs, kv_cache_bytes }) => ({ path: modelPath, num_workers, max_num_seqs, kv_cache_bytes })),
    model_repository: base.model_repository,
  }));
  const server = spawn(process.execPath, [
    conduitBin, 'serve', '--config', configFile, '--http-port', String(httpPort), '--metrics-port', String(metricsPort), '--grpc-port', String(grpcPort),
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
  const counts: Counts = {
    streams: 0, tokens: 0, infers: 0, errors: 0, firstErrors: [], gzipInfers: 0, bombsRefused: 0, grpcInfers: 0, grpcRefused: 0,
    storedResponses: 0, firstEvictedAfter: null, slowCuts: 0, slowDropped: 0, slowCompleted: 0,
  };
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
      ...Array.from({ length: Number(values['gzip-clients']) }, () => gzipLoop(url, counts, () => stopping)),
      ...Array.from({ length: Number(values['grpc-auth-clients']) }, () => grpcAuthLoop(`127.0.0.1:${grpcPort}`, counts, () => stopping)),
      ...Array.from({ length: Number(values['store-clients']) }, () => storeLoop(url, counts, () => stopping)),
      ...Array.from({ length: Number(values['slow-ws-clients']) }, () => slowWebSocketLoop(`ws://127.0.0.1:${httpPort}/v1/responses`, counts, () => stopping)),
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
    console.log(`hostile cases: ${counts.gzipInfers} gzip infers, ${counts.bombsRefused} gzip bombs refused (413); ` +
      `${counts.grpcInfers} gRPC infers with the key, ${counts.grpcRefused} gRPC calls refused (no key, or not admin); ` +
      `${counts.storedResponses} responses stored with logprobs (the first eviction seen after ${counts.firstEvictedAfter ?? 'none yet'}); ` +
      `${counts.slowCuts} slow WebSocket readers cut (1008, client_too_slow), ${counts.slowDropped} dropped while still paused (1006), ` +
      `${counts.slowCompleted} finished before the bound`);
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
    rmSync(configDir, { recursive: true, force: true });
  }
}

process.exitCode = await main();
