// Latency under load (issue 39), every figure from one run: `conduit serve --model DIR` with its
// defaults (performance_mode: interactivity) and with performance_mode: throughput (prompts
// packed into each step, as the scheduler did before), and llama-server beside them when a
// binary is given, on the 125 M benchmark model:
//
// - closed loop, streaming completions of 256-token prompts and 128 output tokens (ignore_eos),
//   1, 8 and 32 clients; at 8 clients also the same prompts with output lengths spread over
//   96-160 tokens (seeded, mean 128 exactly): with every output the same length the clients'
//   requests stay in the lockstep the opening burst set (each arrives during the step that
//   computes the one before it), which real traffic's varied lengths do not keep. The fixed
//   point is the issue's measure; the spread one shows what the same load gives without the
//   lockstep;
// - shared prefix: 8 clients, one 1,024-token prefix plus 32 tokens of their own, 64 out.
//
// Before any server starts, the machine's compute ceiling (tools/prefill-ceiling.ts): the peak of
// the instruction the prefill's matmuls run, the prefill rate a forward pass of two 256-token
// prompts achieves, both on CPU time, and the lower bound they set on TTFT p99 at 32 clients
// (the opening burst's prompts alone), printed beside that target as a ratio to llama-server's.
//
// --part replay runs the fixed loads without servers (tools/scheduler-replay.ts): the real
// Scheduler and forward pass in this process, on a clock of the passes' CPU time, so the policy
// can be measured on a machine shared with other work; for the 32-client p99 it prints where the
// time went (steps' fixed cost, prompt tokens, decode rows).
//
// Per point: output tokens/s, TTFT p50 / p99 and ITL p50 / p99, where ITL is the gap between two
// consecutive streamed tokens (loadtest's chunk_gap_ms: a prefill that stalls the decodes shows
// in its tail), and for Conduit where its mean TTFT went (its own histograms: the worker's
// queue, the prompt's steps, the gateway, HTTP and the client). Then the issue's targets as
// ratios, and the policies alone on a simulated clock (tools/scheduler-sim.ts) calibrated on
// this run and on the issue's figures. Every server gets the same prompt texts (built once with
// Conduit's tokenizer), so llama-server computes the same tokens; the tokenizer covers all of
// the model's ids (bench-model.ts), so every token streams text and a client's first text is
// the first token.
//
//   npm run bench:latency [-- --llama-server PATH] [--rounds 2] [--servers interactivity,throughput,llama]
//                         [--part served|simulated|both|replay] [--points 1,8,32,shared (which load points run; 8 runs the spread point too)]
//                         [--threads N (llama-server's -t; default the CPUs)] [--scale 0.25 (fewer requests, a quick look)]
//   LLAMA_SERVER=PATH npm run bench:latency
//
// llama-server is never built here: give the path of one built beside the project. The bench
// writes the benchmark checkpoint as GGUF (tools/llama-gguf.ts) and runs llama-server -t THREADS
// -np 32 -c 16384 for the fixed loads (the issue's setting) and -np 8 -c 16384 for the shared
// prefix (with 32 slots of 512 tokens it refuses 1,056-token prompts), and sends it a
// `chat_parser` that accepts any output (LLAMA_ACCEPT_ANY_OUTPUT: current servers otherwise fail
// a third of the random model's streams); builds from Feb 2025 (c392e5094) to Aug 2026 (b10472)
// serve it. Servers alternate within
// each round, so the machine's drift does not pass for a difference. Every process shares the
// machine with the load generator, as on a one-box deployment.
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';
import { mirroredUniformLengths } from '../loadtest/length-distribution.ts';
import { TokenizedPromptBuilder } from '../loadtest/prompt-builder.ts';
import { createRng } from '../loadtest/random.ts';
import { runLoadtest } from '../loadtest/run.ts';
import { ServerTokenizer } from '../loadtest/server-tokenizer.ts';
import { median, percentileOfSorted, summarize } from '../loadtest/stats.ts';
import type { WorkloadEntry } from '../loadtest/workload.ts';
import { BENCH_SHAPE, describeCpu, ensureBenchCheckpoint, writeServableBenchModel } from './bench-model.ts';
import { freePort } from './free-port.ts';
import { writeLlamaGguf } from './llama-gguf.ts';
import { simulateClosedLoop, type SimulatedFigures, type StepCostModel } from './scheduler-sim.ts';
import { fitStepCost, openReplayer, splitTime } from './scheduler-replay.ts';
import { prefillLimitsFor, type PerformanceMode } from '../engine/scheduler.ts';
import { burstTtftBoundMs, describePrefillCeiling, measurePrefillCeiling, peakPrefillTokensPerSecond, type PrefillCeiling } from './prefill-ceiling.ts';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const conduitBin = path.join(repoRoot, 'bin', 'conduit.js');
const HEALTH_TIMEOUT_MS = 300_000;
const SERVED_NAME = 'bench-125m';

/** One closed-loop load point; the first entry is a warm-up sent alone and left out of the figures. */
interface LoadPoint {
  label: string;
  numClients: number;
  phase: 'fixed' | 'shared-prefix';
  entries: WorkloadEntry[];
}

const FIXED = { inputTokens: 256, outputTokens: 128 };
/** The spread point's output lengths: FIXED.outputTokens ± this, uniform, mean FIXED.outputTokens exactly. */
const SPREAD_HALF_WIDTH_TOKENS = 32;
const SPREAD_LABEL = 'spread outputs, 8 clients';
const SHARED = { prefixTokens: 1024, inputTokens: 32, outputTokens: 64, numClients: 8 };
/** Requests per point, besides the warm-up: a few per client, more where the clients are few. */
const NUM_REQUESTS: Readonly<Record<string, number>> = { 'fixed, 1 client': 8, 'fixed, 8 clients': 64, [SPREAD_LABEL]: 64, 'fixed, 32 clients': 128, 'shared prefix, 8 clients': 32 };

/** A point's requests at the run's --scale, never fewer than one per client. */
function numRequestsAt(scale: number, label: string, numClients: number): number {
  return Math.max(numClients, Math.round(NUM_REQUESTS[label] * scale));
}

/** Issue 39's Intel Xeon (2 vCPUs): ITL p50 17 ms at 8 clients, a 256-token prompt's step about 0.25 s. */
const ISSUE_INTEL_COST: StepCostModel = { fixedMs: 9.5, msPerToken: 0.94 };

interface Figures {
  outputTokensPerS: number;
  /** Conduit's own mean first-scheduling-to-first-token (NaN for llama-server). */
  prefillMs: number;
  ttftP50Ms: number;
  ttftP99Ms: number;
  /**
   * TTFT p50 without the opening burst (each client's first request, all sent at once: a burst's
   * queue, not the load's). What remains still holds the rounds the streams take to spread out
   * after it (tools/scheduler-sim.ts shows them), so more requests per point weigh them less.
   */
  ttftP50AfterBurstMs: number;
  itlP50Ms: number;
  itlP99Ms: number;
}

type ServerName = 'interactivity' | 'throughput' | 'llama';

interface RunningServer {
  url: string;
  /** Conduit's Prometheus endpoint; null for llama-server. */
  metricsUrl: string | null;
  /** Fields this server needs in every request's body beside the common ones (none for Conduit). */
  requestFields: Readonly<Record<string, unknown>>;
  stop(): Promise<void>;
}

/** Where a request's time to first token went, in mean milliseconds (Conduit's own histograms). */
interface TtftSplit {
  /** From the worker's receipt to its first scheduling: the step in flight, and prompts ahead. */
  queueMs: number;
  /** From its first scheduling to its first token: its prompt's steps. */
  prefillMs: number;
  /** The gateway's TTFT beyond the worker's: parsing, tokenizing, routing, the gRPC hops. */
  gatewayMs: number;
  /** The client's TTFT beyond the gateway's: HTTP and SSE over loopback, the load generator. */
  clientMs: number;
  /** The worker's steps over the point: how many, their mean time, its engine-loop part (outside the forward pass), their mean tokens. */
  numSteps: number;
  stepMs: number;
  engineLoopMs: number;
  tokensPerStep: number;
}

const SPLIT_HISTOGRAMS = [
  'conduit_time_to_first_token_seconds', 'conduit_request_queue_time_seconds', 'conduit_request_prefill_time_seconds',
  'conduit_engine_step_duration_seconds', 'conduit_engine_scheduling_duration_seconds', 'conduit_engine_tokens_per_step',
] as const;

/** Each histogram's sum and count. */
async function scrapeHistograms(metricsUrl: string): Promise<Map<string, { sum: number; count: number }>> {
  const text = await (await fetch(`${metricsUrl}/metrics`)).text();
  const histograms = new Map<string, { sum: number; count: number }>();
  for (const name of SPLIT_HISTOGRAMS) {
    const value = (suffix: string) => Number(new RegExp(`^${name}_${suffix}\\{[^}]*\\} (\\S+)$`, 'm').exec(text)?.[1] ?? 0);
    histograms.set(name, { sum: value('sum'), count: value('count') });
  }
  return histograms;
}

async function waitForHealth(url: string, server: ChildProcess, describeFailure: () => string): Promise<void> {
  const deadline = Date.now() + HEALTH_TIMEOUT_MS;
  while (Date.now() < deadline) {
    if (server.exitCode !== null) throw new Error(`the server exited with code ${server.exitCode}:\n${describeFailure()}`);
    if (await fetch(`${url}/health`).then((response) => response.ok, () => false)) return;
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  throw new Error(`the server did not become healthy within ${HEALTH_TIMEOUT_MS / 1000} s:\n${describeFailure()}`);
}

/** Starts a server whose output goes to a log file, read only when it fails to start. */
async function startProcess(
  command: string, args: string[], logFile: string, url: string, metricsUrl: string | null, requestFields: Readonly<Record<string, unknown>> = {},
): Promise<RunningServer> {
  const logFd = openSync(logFile, 'w');
  const server = spawn(command, args, { stdio: ['ignore', logFd, logFd] });
  closeSync(logFd);
  const stop = async () => {
    if (server.exitCode !== null || server.signalCode !== null) return;
    server.kill('SIGTERM');
    await once(server, 'exit');
  };
  try {
    await waitForHealth(url, server, () => readFileSync(logFile, 'utf8').slice(-4000));
  } catch (err) {
    await stop();
    throw err;
  }
  return { url, metricsUrl, requestFields, stop };
}

async function startConduit(workDir: string, modelDir: string, mode: 'interactivity' | 'throughput'): Promise<RunningServer> {
  const [httpPort, metricsPort] = [await freePort(), await freePort()];
  const configPath = path.join(workDir, `conduit-${mode}.yaml`);
  // `conduit serve --model DIR`'s defaults, on loopback ports, in the given mode.
  writeFileSync(configPath, [
    'server:',
    '  host: 127.0.0.1',
    `  http_port: ${httpPort}`,
    `  metrics_port: ${metricsPort}`,
    '  grpc_port: 0',
    'models:',
    `  - path: ${JSON.stringify(modelDir)}`,
    `    performance_mode: ${mode}`,
    '',
  ].join('\n'));
  return startProcess(
    process.execPath, [conduitBin, 'serve', '--config', configPath], path.join(workDir, `conduit-${mode}.log`),
    `http://127.0.0.1:${httpPort}`, `http://127.0.0.1:${metricsPort}`,
  );
}

/**
 * llama-server's `chat_parser` request field: a PEG parser (common/peg-parser.cpp's JSON form)
 * that matches the empty text and always succeeds. Current llama-servers (2026) run their chat
 * output parser over every streamed response, /v1/completions included, and end the stream with
 * an error when it fails; the default (Content-only: all the text, then the end) fails on invalid
 * UTF-8, which the random benchmark model emits in about one response in three (a lone byte
 * token such as 0x80). /v1/completions streams the raw text, never the parsed message, so this
 * parser changes no byte a client sees and no token computed; servers without the field ignore it.
 */
const LLAMA_ACCEPT_ANY_OUTPUT = { chat_parser: JSON.stringify({ parsers: [{ type: 'epsilon' }], rules: {}, root: 0 }) };

async function startLlamaServer(workDir: string, binary: string, ggufFile: string, numThreads: number, numSlots: number): Promise<RunningServer> {
  const port = await freePort();
  const args = ['-m', ggufFile, '--host', '127.0.0.1', '--port', String(port), '-t', String(numThreads), '-np', String(numSlots), '-c', '16384'];
  return startProcess(binary, args, path.join(workDir, `llama-server-np${numSlots}.log`), `http://127.0.0.1:${port}`, null, LLAMA_ACCEPT_ANY_OUTPUT);
}

/** Prompt texts of exact token counts (Conduit's tokenizer, which the GGUF carries too), the same for every server. */
async function buildLoadPoints(conduitUrl: string, scale: number): Promise<LoadPoint[]> {
  const numRequests = (label: string, numClients: number) => numRequestsAt(scale, label, numClients);
  const tokenizer = await ServerTokenizer.probe(conduitUrl, SERVED_NAME);
  if (!(tokenizer instanceof ServerTokenizer)) throw new Error(`Conduit's /tokenize: ${tokenizer.unavailable}`);
  const rng = createRng(39);
  const builder = await TokenizedPromptBuilder.create(tokenizer, rng);
  const points: LoadPoint[] = [];
  for (const numClients of [1, 8, 32]) {
    const label = `fixed, ${numClients} client${numClients === 1 ? '' : 's'}`;
    const entries: WorkloadEntry[] = [];
    for (let i = 0; i <= numRequests(label, numClients); i++) entries.push({ text: await builder.build(FIXED.inputTokens, rng), output_tokens: FIXED.outputTokens });
    points.push({ label, numClients, phase: 'fixed', entries });
  }
  // As the loadtest's completions transport joins a system prompt and the user's text.
  const prefix = await builder.build(SHARED.prefixTokens, rng);
  const label = `shared prefix, ${SHARED.numClients} clients`;
  const entries: WorkloadEntry[] = [];
  for (let i = 0; i <= numRequests(label, SHARED.numClients); i++) {
    entries.push({ text: `${prefix}\n\n${await builder.build(SHARED.inputTokens, rng)}`, output_tokens: SHARED.outputTokens });
  }
  points.push({ label, numClients: SHARED.numClients, phase: 'shared-prefix', entries });
  // Prompts of its own (the fixed point's would be cached by then), drawn after every other
  // point's so theirs stay as they were; run right after the fixed 8-client point.
  // The warm-up (first) at the mean; the measured requests' lengths average it exactly.
  const outputTokens = [FIXED.outputTokens, ...mirroredUniformLengths(createRng(3939), numRequests(SPREAD_LABEL, 8), FIXED.outputTokens, SPREAD_HALF_WIDTH_TOKENS)];
  const spread: WorkloadEntry[] = [];
  for (const numOutputTokens of outputTokens) spread.push({ text: await builder.build(FIXED.inputTokens, rng), output_tokens: numOutputTokens });
  points.splice(points.findIndex((point) => point.label === 'fixed, 8 clients') + 1, 0, { label: SPREAD_LABEL, numClients: 8, phase: 'fixed', entries: spread });
  return points;
}

async function measure(server: RunningServer, point: LoadPoint): Promise<{ figures: Figures; split: TtftSplit | null }> {
  // The warm-up request lands in the histograms too: scraped after it, by a loadtest of its own.
  await runLoadtest({
    url: server.url, model: SERVED_NAME, endpoint: 'completions', workload: { kind: 'entries', name: 'warm-up', entries: point.entries.slice(0, 1) },
    load: { kind: 'concurrency', numClientsList: [1] }, seed: 39,
    requestFields: server.requestFields,
  });
  const before = server.metricsUrl === null ? null : await scrapeHistograms(server.metricsUrl);
  const results = await runLoadtest({
    url: server.url,
    model: SERVED_NAME,
    endpoint: 'completions',
    workload: { kind: 'entries', name: point.label, entries: point.entries.slice(1) },
    load: { kind: 'concurrency', numClientsList: [point.numClients] },
    seed: 39,
    requestFields: server.requestFields,
  });
  if (results.num_succeeded !== results.num_requests) {
    throw new Error(`${point.label}: ${results.num_requests - results.num_succeeded} of ${results.num_requests} requests failed: ${JSON.stringify(results.errors)}`);
  }
  const afterBurst = [...results.requests].sort((a, b) => a.start_ms - b.start_ms).slice(point.numClients).map((request) => request.ttft_ms!);
  const figures: Figures = {
    outputTokensPerS: results.output_token_throughput,
    prefillMs: Number.NaN,
    ttftP50Ms: results.ttft_ms.p50!,
    ttftP99Ms: results.ttft_ms.p99!,
    ttftP50AfterBurstMs: point.numClients === 1 || afterBurst.length === 0 ? Number.NaN : summarize(afterBurst).p50,
    itlP50Ms: results.chunk_gap_ms.p50!,
    itlP99Ms: results.chunk_gap_ms.p99!,
  };
  if (before === null) return { figures, split: null };
  const after = await scrapeHistograms(server.metricsUrl!);
  const mean = (name: string) => {
    const [a, b] = [after.get(name)!, before.get(name)!];
    return (a.sum - b.sum) / (a.count - b.count);
  };
  const [gatewayTtftMs, queueMs, prefillMs, stepMs, engineLoopMs] = SPLIT_HISTOGRAMS.slice(0, 5).map((name) => 1000 * mean(name));
  figures.prefillMs = prefillMs;
  const steps = SPLIT_HISTOGRAMS[3];
  return {
    figures,
    split: {
      queueMs, prefillMs, gatewayMs: gatewayTtftMs - queueMs - prefillMs, clientMs: results.ttft_ms.mean! - gatewayTtftMs,
      numSteps: after.get(steps)!.count - before.get(steps)!.count, stepMs, engineLoopMs, tokensPerStep: mean('conduit_engine_tokens_per_step'),
    },
  };
}


const ms = (value: number) => (value >= 1000 ? `${(value / 1000).toFixed(2)} s` : `${value.toFixed(0)} ms`);

function describe(figures: Figures): string {
  const afterBurst = Number.isNaN(figures.ttftP50AfterBurstMs) ? '' : ` (p50 ${ms(figures.ttftP50AfterBurstMs)} after the opening burst)`;
  return `${figures.outputTokensPerS.toFixed(1)} tok/s, TTFT p50 ${ms(figures.ttftP50Ms)} p99 ${ms(figures.ttftP99Ms)}${afterBurst}, ` +
    `ITL p50 ${ms(figures.itlP50Ms)} p99 ${ms(figures.itlP99Ms)}`;
}

/** The lower bounds on TTFT p99 at 32 clients: the opening burst's prompts at the compute peak, and at the prefill rate measured. */
interface BurstBounds {
  atPeakMs: number;
  atAchievedMs: number;
}

/**
 * The compute peak and the achieved prefill rate (tools/prefill-ceiling.ts), measured before any
 * server starts, printed with the bound they set on the 32-client TTFT p99. Null, with a line
 * saying why, where this machine has no probe.
 */
async function measureBurstBounds(numThreads: number, scale: number): Promise<BurstBounds | null> {
  let ceiling: PrefillCeiling;
  try {
    // Two prompts: a step of the burst at the default budget (max_num_batched_tokens 512).
    ceiling = await measurePrefillCeiling(ensureBenchCheckpoint(), numThreads, { promptTokens: FIXED.inputTokens, numPrompts: 2, shape: BENCH_SHAPE });
  } catch (err) {
    console.log(`compute peak and prefill rate: not measured (${(err as Error).message})`);
    return null;
  }
  console.log(describePrefillCeiling(ceiling));
  const numClients = 32;
  const numRequests = numRequestsAt(scale, 'fixed, 32 clients', numClients);
  const bound = (tokensPerSecond: number) => burstTtftBoundMs(numClients, numRequests, FIXED.inputTokens, tokensPerSecond, 0.99);
  const bounds = { atPeakMs: bound(peakPrefillTokensPerSecond(ceiling)), atAchievedMs: bound(ceiling.achievedTokensPerSecond) };
  if (Number.isNaN(bounds.atPeakMs)) return null;
  console.log(`TTFT p99 at ${numClients} clients (${numRequests} requests, the first ${numClients} at once) is at least ${ms(bounds.atPeakMs)} at the compute peak, ` +
    `${ms(bounds.atAchievedMs)} at the prefill rate measured (the k-th of a burst's ${FIXED.inputTokens}-token prompts waits for k prompts' compute, whatever the order)`);
  return bounds;
}

/** One line per target: the figure, its reference from this run, and whether it holds. */
function printTargets(figures: Map<ServerName, Map<string, Figures[]>>, burstBounds: BurstBounds | null): void {
  const get = (server: ServerName, label: string, key: keyof Figures): number | null => {
    const runs = figures.get(server)?.get(label);
    return runs === undefined ? null : median(runs.map((run) => run[key]));
  };
  const line = (text: string, value: number | null, reference: number | null, limit: number, unit: 'x' | 'ms' = 'x') => {
    if (value === null || reference === null) return;
    const ratio = unit === 'x' ? value / reference : value;
    const shown = unit === 'x' ? `${ratio.toFixed(2)}x` : ms(ratio);
    const bound = unit === 'x' ? `${limit}x` : ms(limit);
    console.log(`  ${text}: ${shown} (target <= ${bound}: ${ratio <= limit ? 'met' : 'NOT met'})`);
  };
  console.log('\nTargets (medians over the rounds; interactivity is the default mode):');
  const c1 = 'fixed, 1 client';
  const c8 = 'fixed, 8 clients';
  const c32 = 'fixed, 32 clients';
  const shared = `shared prefix, ${SHARED.numClients} clients`;
  line('TTFT p50 at 8 clients / TTFT p50 at 1 client', get('interactivity', c8, 'ttftP50Ms'), get('interactivity', c1, 'ttftP50Ms'), 1.5);
  line('  the same without the opening burst', get('interactivity', c8, 'ttftP50AfterBurstMs'), get('interactivity', c1, 'ttftP50Ms'), 1.5);
  line(`  the same with output lengths ${FIXED.outputTokens - SPREAD_HALF_WIDTH_TOKENS}-${FIXED.outputTokens + SPREAD_HALF_WIDTH_TOKENS} (${SPREAD_LABEL}; not the issue's measure)`,
    get('interactivity', SPREAD_LABEL, 'ttftP50Ms'), get('interactivity', c1, 'ttftP50Ms'), 1.5);
  line('TTFT p50 at 8 clients / llama-server\'s', get('interactivity', c8, 'ttftP50Ms'), get('llama', c8, 'ttftP50Ms'), 1);
  line('TTFT p99 at 32 clients / llama-server\'s', get('interactivity', c32, 'ttftP99Ms'), get('llama', c32, 'ttftP99Ms'), 0.5);
  const llamaP99Ms = get('llama', c32, 'ttftP99Ms');
  const conduitP99Ms = get('interactivity', c32, 'ttftP99Ms');
  if (llamaP99Ms === null && conduitP99Ms !== null) console.log(`  TTFT p99 at 32 clients: ${ms(conduitP99Ms)} (llama-server not measured)`);
  if (burstBounds !== null && (llamaP99Ms !== null || conduitP99Ms !== null)) {
    const against = (boundMs: number) => [
      llamaP99Ms === null ? '' : ` = ${(boundMs / llamaP99Ms).toFixed(2)}x llama-server's p99`,
      conduitP99Ms === null ? '' : ` = ${(boundMs / conduitP99Ms).toFixed(2)}x Conduit's`,
    ].join('');
    console.log(`    its lower bound (the burst's prompts alone, no decodes, no serving): ${ms(burstBounds.atPeakMs)} at the compute peak${against(burstBounds.atPeakMs)}; ` +
      `${ms(burstBounds.atAchievedMs)} at this run's prefill rate${against(burstBounds.atAchievedMs)}`);
  }
  line('ITL p99 at 8 clients', get('interactivity', c8, 'itlP99Ms'), 0, 250, 'ms');
  line('ITL p99 at 8 clients, spread outputs', get('interactivity', SPREAD_LABEL, 'itlP99Ms'), 0, 250, 'ms');
  line('ITL p99 at 32 clients', get('interactivity', c32, 'itlP99Ms'), 0, 500, 'ms');
  // Below 1 is a loss: the reference is the scheduler's former way, prompts packed.
  for (const label of [c8, SPREAD_LABEL, c32, shared]) {
    const value = get('interactivity', label, 'outputTokensPerS');
    const reference = get('throughput', label, 'outputTokensPerS');
    if (value !== null && reference !== null) console.log(`  tok/s, ${label}: interactivity / throughput mode ${(value / reference).toFixed(2)}x (target >= 1: ${value >= reference ? 'met' : 'NOT met'})`);
  }
  line(`TTFT p50, ${shared}: interactivity / throughput mode`, get('interactivity', shared, 'ttftP50Ms'), get('throughput', shared, 'ttftP50Ms'), 1);
}

/**
 * The policies alone (tools/scheduler-sim.ts): the real Scheduler, with defaults as served, on a
 * clock that advances by cost per step, the same loads with as many requests as the served
 * points at this --scale (the opening burst and the rounds after it weigh as they do served), a
 * 3 ms round trip from a request's end to its client's next request at the worker. No gateway,
 * no wire, no neighbours.
 */
async function printSimulated(label: string, cost: StepCostModel, scale: number): Promise<void> {
  console.log(`\nSimulated, ${label}: a step takes ${cost.fixedMs.toFixed(1)} ms + ${cost.msPerToken.toFixed(2)} ms per token`);
  const fixed = (numClients: number) => {
    const loadLabel = `fixed, ${numClients} client${numClients === 1 ? '' : 's'}`;
    return { label: loadLabel, numClients, numRequests: numRequestsAt(scale, loadLabel, numClients), sharedPrefixTokens: 0, ownPromptTokens: FIXED.inputTokens, outputTokens: FIXED.outputTokens };
  };
  const sharedLabel = `shared prefix, ${SHARED.numClients} clients`;
  const loads = [
    fixed(1), fixed(8), fixed(32),
    // The loadtest's completions join the prefix and the question with a blank line (one more token).
    { label: sharedLabel, numClients: SHARED.numClients, numRequests: numRequestsAt(scale, sharedLabel, SHARED.numClients), sharedPrefixTokens: SHARED.prefixTokens + 1, ownPromptTokens: SHARED.inputTokens, outputTokens: SHARED.outputTokens },
  ];
  for (const mode of ['interactivity', 'throughput'] as PerformanceMode[]) {
    for (const { label: loadLabel, ...load } of loads) {
      const result = await simulateClosedLoop(prefillLimitsFor(mode, 64, 512), cost, { ...load, roundTripMs: 3 });
      console.log(`  ${mode}, ${loadLabel}: ${describe(loopFigures(result, load.numClients, load.numRequests))}`);
    }
  }
}

/** A closed loop's figures (simulated or replayed), quantiles as the loadtest takes them. */
function loopFigures(result: SimulatedFigures, numClients: number, numRequests: number): Figures {
  const quantile = (values: number[], q: number) => percentileOfSorted([...values].sort((a, b) => a - b), 100 * q);
  return {
    outputTokensPerS: result.outputTokensPerS,
    prefillMs: Number.NaN,
    ttftP50Ms: quantile(result.ttftsMs, 0.5),
    ttftP99Ms: quantile(result.ttftsMs, 0.99),
    ttftP50AfterBurstMs: numClients > 1 && numRequests > numClients ? quantile(result.ttftsMs.slice(numClients), 0.5) : Number.NaN,
    itlP50Ms: quantile(result.itlsMs, 0.5),
    itlP99Ms: quantile(result.itlsMs, 0.99),
  };
}

/** From a request's end to its client's next request at the worker, served on this machine (issue 39's step traces: about 12 ms). */
const REPLAY_ROUND_TRIP_MS = 12;

/**
 * The fixed loads replayed (tools/scheduler-replay.ts): the real Scheduler as each mode presets
 * it and the real forward pass of the benchmark model in this process, on a clock of the passes'
 * CPU time. Prints each point, where the 32-client p99 went (a step's cost fitted over the
 * point's steps: fixed, per prompt token, per decode row), and the targets on that clock.
 */
async function printReplayed(modes: PerformanceMode[], pointKeys: Set<string>, scale: number, numRounds: number, numThreads: number, burstBounds: BurstBounds | null): Promise<void> {
  console.log(`\nReplayed on a CPU-time clock: the real Scheduler and forward pass, ${numThreads} threads, in this process; a step takes its forward's CPU time / ${numThreads}; ` +
    `${REPLAY_ROUND_TRIP_MS} ms from a request's end to its client's next at the worker; no gateway, HTTP or client (the served figures add them)`);
  const replayer = await openReplayer(ensureBenchCheckpoint(), numThreads, { maxNumBatchedTokens: 512, maxNumSeqs: 64, numKvBlocks: 2048 });
  const figures = new Map<ServerName, Map<string, Figures[]>>();
  try {
    for (let round = 1; round <= numRounds; round++) {
      for (const mode of modes) {
        for (const numClients of [1, 8, 32].filter((n) => pointKeys.has(String(n)))) {
          const label = `fixed, ${numClients} client${numClients === 1 ? '' : 's'}`;
          const numRequests = numRequestsAt(scale, label, numClients);
          const result = await replayer.replay(prefillLimitsFor(mode, 64, 512), {
            numClients, numRequests, roundTripMs: REPLAY_ROUND_TRIP_MS, sharedPrefixTokens: 0, ownPromptTokens: FIXED.inputTokens, outputTokens: FIXED.outputTokens,
          });
          const pointFigures = loopFigures(result, numClients, numRequests);
          const byLabel = figures.get(mode) ?? figures.set(mode, new Map()).get(mode)!;
          (byLabel.get(label) ?? byLabel.set(label, []).get(label)!).push(pointFigures);
          const busyMs = result.steps.reduce((sum, step) => sum + step.ms, 0);
          console.log(`round ${round}, replayed ${mode}, ${label}: ${describe(pointFigures)}; ${result.steps.length} steps of ${(busyMs / result.steps.length).toFixed(1)} ms`);
          const cost = numClients === 32 ? fitStepCost(result.steps) : null;
          if (cost !== null) {
            const split = splitTime(result.steps, cost, pointFigures.ttftP99Ms);
            console.log(`  a step ${cost.fixedMs.toFixed(1)} ms + ${cost.msPerPromptToken.toFixed(3)} ms per prompt token + ${cost.msPerDecodeRow.toFixed(2)} ms per decode row (fitted); ` +
              `until the p99 (${ms(pointFigures.ttftP99Ms)}): ${split.numSteps} steps = fixed ${ms(split.fixedMs)} + ${split.numPromptTokens} prompt tokens ${ms(split.promptMs)} + ` +
              `${split.numDecodeRows} decode rows ${ms(split.decodeMs)}`);
          }
        }
      }
    }
  } finally {
    replayer.close();
  }
  printTargets(figures, burstBounds);
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      'llama-server': { type: 'string', default: process.env.LLAMA_SERVER },
      rounds: { type: 'string', default: '1' },
      servers: { type: 'string', default: 'interactivity,throughput,llama' },
      threads: { type: 'string', default: String(os.availableParallelism()) },
      scale: { type: 'string', default: '1' },
      part: { type: 'string', default: 'both' },
      points: { type: 'string', default: '1,8,32,shared' },
    },
  });
  if (!['served', 'simulated', 'both', 'replay'].includes(values.part!)) throw new Error(`--part: expected served, simulated, both or replay, got ${values.part}`);
  const scale = Number(values.scale);
  if (!(scale > 0)) throw new Error(`--scale: expected a positive number, got ${values.scale}`);
  if (values.part === 'simulated') {
    await printSimulated('calibrated on issue 39\'s Intel Xeon figures', ISSUE_INTEL_COST, scale);
    return;
  }
  let llamaServer = values['llama-server'];
  if (llamaServer !== undefined && !existsSync(llamaServer)) {
    console.log(`llama-server leg skipped: ${llamaServer} does not exist (build llama.cpp's llama-server beside the project and pass its path)`);
    llamaServer = undefined;
  }
  const numRounds = Number(values.rounds);
  const pointKeys = new Set(values.points!.split(','));
  for (const key of pointKeys) if (!['1', '8', '32', 'shared'].includes(key)) throw new Error(`--points: expected some of 1,8,32,shared, got ${key}`);
  const keyOf = (point: LoadPoint) => (point.phase === 'fixed' ? String(point.numClients) : 'shared');
  const phases = (['fixed', 'shared-prefix'] as const).filter((phase) => phase === 'fixed' ? ['1', '8', '32'].some((key) => pointKeys.has(key)) : pointKeys.has('shared'));
  if (!(Number.isInteger(numRounds) && numRounds >= 1)) throw new Error(`--rounds: expected a positive integer, got ${values.rounds}`);
  const servers = values.servers!.split(',').filter((name) => name !== 'llama' || llamaServer !== undefined) as ServerName[];
  for (const name of servers) if (!['interactivity', 'throughput', 'llama'].includes(name)) throw new Error(`--servers: unknown server ${name}`);
  // Conduit's tokenizer builds the prompts, so a Conduit server runs first.
  if (servers[0] === 'llama' || servers.length === 0) throw new Error('--servers: name interactivity or throughput first');
  console.log(`CPU: ${describeCpu()}; load average ${os.loadavg().map((load) => load.toFixed(2)).join(' ')}`);
  console.log(`closed loop, streaming completions, ignore_eos: ${FIXED.inputTokens} + ${FIXED.outputTokens} tokens at 1, 8 and 32 clients ` +
    `(at 8 also ${FIXED.outputTokens - SPREAD_HALF_WIDTH_TOKENS}-${FIXED.outputTokens + SPREAD_HALF_WIDTH_TOKENS} tokens out, seeded, mean ${FIXED.outputTokens}); ` +
    `shared prefix ${SHARED.prefixTokens} + ${SHARED.inputTokens} tokens, ${SHARED.outputTokens} out, ${SHARED.numClients} clients; requests per point ${JSON.stringify(NUM_REQUESTS)}${scale === 1 ? '' : ` x ${scale}`} after 1 warm-up`);
  const burstBounds = await measureBurstBounds(Number(values.threads), scale);
  if (values.part === 'replay') {
    await printReplayed(servers.filter((name) => name !== 'llama') as PerformanceMode[], pointKeys, scale, numRounds, Number(values.threads), burstBounds);
    return;
  }
  console.log(`servers: ${servers.join(', ')}${llamaServer === undefined ? ' (llama-server: none given; --llama-server PATH or LLAMA_SERVER)' : ` (llama-server: ${llamaServer} -t ${values.threads})`}`);

  const workDir = mkdtempSync(path.join(os.tmpdir(), 'conduit-bench-latency-'));
  const figures = new Map<ServerName, Map<string, Figures[]>>();
  try {
    const modelDir = writeServableBenchModel(workDir, SERVED_NAME);
    const ggufFile = path.join(workDir, `${SERVED_NAME}.gguf`);
    if (servers.includes('llama')) writeLlamaGguf(modelDir, ggufFile);
    let points: LoadPoint[] | null = null;
    const start = async (server: ServerName, phase: LoadPoint['phase']): Promise<RunningServer> => {
      if (server !== 'llama') return startConduit(workDir, modelDir, server);
      return startLlamaServer(workDir, llamaServer!, ggufFile, Number(values.threads), phase === 'fixed' ? 32 : SHARED.numClients);
    };
    for (let round = 1; round <= numRounds; round++) {
      for (const server of servers) {
        for (const phase of phases) {
          const running = await start(server, phase);
          try {
            points ??= await buildLoadPoints(running.url, scale);
            for (const point of points.filter((p) => p.phase === phase && pointKeys.has(keyOf(p)))) {
              const { figures: result, split } = await measure(running, point);
              const byLabel = figures.get(server) ?? figures.set(server, new Map()).get(server)!;
              (byLabel.get(point.label) ?? byLabel.set(point.label, []).get(point.label)!).push(result);
              console.log(`round ${round}, ${server === 'llama' ? 'llama-server' : `conduit ${server}`}, ${point.label}: ${describe(result)}`);
              if (split !== null) {
                console.log(`  mean TTFT = worker queue ${ms(split.queueMs)} + prefill ${ms(split.prefillMs)} + gateway ${ms(split.gatewayMs)} + HTTP and client ${ms(split.clientMs)}`);
                console.log(`  ${split.numSteps} steps of ${split.tokensPerStep.toFixed(1)} tokens on average, ${split.stepMs.toFixed(1)} ms each, of which ${split.engineLoopMs.toFixed(2)} ms the engine loop's (outside the forward pass)`);
              }
            }
          } finally {
            await running.stop();
          }
        }
      }
    }
  } finally {
    rmSync(workDir, { recursive: true, force: true });
  }
  printTargets(figures, burstBounds);
  // Calibrated on this run: at one client a step is a decode of one token, or the prompt's.
  const alone = values.part === 'served' ? undefined : figures.get('interactivity')?.get('fixed, 1 client') ?? figures.get('throughput')?.get('fixed, 1 client');
  if (alone !== undefined) {
    const decodeMs = median(alone.map((run) => run.itlP50Ms));
    const prefillMs = median(alone.map((run) => run.prefillMs));
    const msPerToken = (prefillMs - decodeMs) / FIXED.inputTokens;
    await printSimulated(`calibrated on this run (one client: a decode step ${ms(decodeMs)}, a prompt's step ${ms(prefillMs)})`, { fixedMs: decodeMs - msPerToken, msPerToken }, scale);
  }
  if (values.part === 'both') await printSimulated('calibrated on issue 39\'s Intel Xeon figures', ISSUE_INTEL_COST, scale);
  console.log(`load average at the end ${os.loadavg().map((load) => load.toFixed(2)).join(' ')}`);
}

await main();
