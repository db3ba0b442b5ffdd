// KV-cache-aware routing against round-robin, in one run:
//
// 1. Served: `conduit serve` with 4 workers of the 125 M benchmark model (1 thread each) behind
//    one gateway, driven by `conduit loadtest`'s multi-turn and shared-prefix scenarios, once
//    per policy: prefix-cache hit rate and TTFT p50 / p99, and round-robin's over kv-aware's.
//    First closed loop (8 clients, each sending its next request when the last ends: the
//    servers saturated), which measures round-robin's capacity; then open loop, sessions
//    arriving at random (Poisson) at OPEN_LOOP_LOAD_FRACTION of that capacity, the same rate for
//    both policies: a server below saturation, as a deployment runs (Dynamo's router A/B
//    replays its trace at 0.8 x speed), where routing decides whether requests queue. Open-loop
//    chat users think between turns, so many conversations are live at once, as in a
//    deployment. Each group's system prompt is sent once before a shared-prefix measurement.
// 2. Simulated (tools/router-sim.ts): 64 workers behind 2 gateway replicas with the real
//    routers and a timing model of prefill and decode, the same two workloads, and the time of
//    each routing decision with the index at its full size.
//
//   npm run bench:router [-- --part served|simulated|both]
//
// Every process shares the machine; on 2 cores the served part takes a few minutes.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';
import { runLoadtest } from '../loadtest/run.ts';
import type { LoadSpec } from '../loadtest/run.ts';
import { createRng } from '../loadtest/random.ts';
import { generateWorkload, type ScenarioSpec } from '../loadtest/scenarios.ts';
import type { WorkloadEntry } from '../loadtest/workload.ts';
import type { RoutingPolicy } from '../router/settings.ts';
import { describeCpu, writeServableBenchModel } from './bench-model.ts';
import { quantile, simulate, type SimSettings, type SimWorkload } from './router-sim.ts';
import { freePort } from './free-port.ts';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const conduitBin = path.join(repoRoot, 'bin', 'conduit.js');
const HEALTH_TIMEOUT_MS = 300_000;
// Round-robin first: its closed-loop throughput sets the open-loop rate of both.
const POLICIES: readonly RoutingPolicy[] = ['round-robin', 'kv-aware'];
const SERVED_NAME = 'bench-125m';

interface Figures {
  hitRate: number;
  ttftP50Ms: number;
  ttftP99Ms: number;
}

interface MeasuredFigures extends Figures {
  requestsPerS: number;
  meanE2eMs: number;
}

/** Open loop at this fraction of round-robin's closed-loop throughput, for both policies. */
const OPEN_LOOP_LOAD_FRACTION = 0.8;

interface ServedScenario {
  label: string;
  scenario: ScenarioSpec;
  closedLoop: { numRequests: number; numClients: number };
  /** Enough requests that the p99, the target's tail, is not just the slowest two or three. */
  openLoop: { numRequests: number };
}

// Sized for 4 single-threaded workers on a small machine: under kv-aware each worker's KV cache
// holds the prefixes of its share of the conversations and groups; under round-robin each sees
// all of them and cannot hold them. Conversations are shaped as vLLM's multi-turn benchmark
// generates them (a document of about 7 user messages' length that the conversation is about,
// then 6 to 9 user turns), scaled down: a 256-token document, 8 turns of 48 new tokens and 16
// generated, ending 768 tokens long. The shared-prefix groups keep SGLang's generated-shared-prefix
// proportions (a 2,048-token system prompt to a 128-token question), scaled down to 512 and 32:
// kv-aware's 2 groups per worker take 64 of its 128 blocks, round-robin's 8 would take 256.
const SERVED_SCENARIOS: readonly ServedScenario[] = [
  {
    label: 'multi-turn',
    scenario: { name: 'multi-turn', numTurns: 8, inputTokens: 48, outputTokens: 16, contextTokens: 256 },
    closedLoop: { numRequests: 64, numClients: 8 },
    openLoop: { numRequests: 384 },
  },
  {
    label: 'shared-prefix',
    scenario: { name: 'shared-prefix', numGroups: 8, systemPromptTokens: 512, inputTokens: 32, outputTokens: 16 },
    closedLoop: { numRequests: 64, numClients: 8 },
    openLoop: { numRequests: 256 },
  },
];
/**
 * Open-loop chat users read and type between turns. The think time is set from the arrival rate
 * so that as many conversations are live as kv-aware can hold at their longest in this fraction
 * of each worker's cache (the rest for the running sequences' new blocks): 2 per worker here,
 * all of them on every worker under round-robin. (Sized instead at llm-d's 73 % of all the
 * caches, the live set overflows kv-aware's own workers: with 8 turns of 48 tokens and no
 * document, its hit rate fell to 46 %.) A conversation lives for its turns' service as well as
 * its thinking; sized on thinking alone, about 12 were live instead of 8, and kv-aware's hit
 * rate fell from 72 % to 48 % over 384 requests as its caches thrashed.
 */
const OPEN_LOOP_KV_HOLD_FRACTION = 0.75;
const SERVED_KV_BLOCKS_PER_WORKER = 128;
const SERVED_NUM_WORKERS = 4;
/** The engine's block size, which the KV figures count in. */
const SERVED_BLOCK_SIZE_TOKENS = 16;

async function waitForHealth(url: string, server: ReturnType<typeof spawn>, log: Buffer[], logFile: string): Promise<void> {
  const deadline = Date.now() + HEALTH_TIMEOUT_MS;
  while (Date.now() < deadline) {
    if (server.exitCode !== null) throw new Error(`conduit serve exited with code ${server.exitCode}:\n${readFileSync(logFile, 'utf8')}${Buffer.concat(log).toString()}`);
    if (await fetch(`${url}/health`).then((response) => response.ok, () => false)) return;
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  throw new Error(`conduit serve did not become healthy within ${HEALTH_TIMEOUT_MS / 1000} s:\n${readFileSync(logFile, 'utf8')}${Buffer.concat(log).toString()}`);
}

/** The open loop's offer to both policies, from round-robin's closed loop. */
interface OpenLoopOffer {
  sessionsPerS: number;
  /** A turn's mean end-to-end latency, which a conversation's lifetime counts besides thinking. */
  turnServiceMs: number;
}

interface ServedFigures {
  closedLoop: MeasuredFigures;
  openLoop: MeasuredFigures;
  offer: OpenLoopOffer;
}

/** Multi-turn's think time for the live conversations OPEN_LOOP_KV_HOLD_FRACTION sizes, at the offer's rate. */
function withThinkTime(scenario: ScenarioSpec, offer: OpenLoopOffer): ScenarioSpec {
  if (scenario.name !== 'multi-turn') return scenario;
  const maxHistoryTokens = (scenario.contextTokens ?? 0) + scenario.numTurns * (scenario.inputTokens + scenario.outputTokens);
  const heldTokensPerWorker = OPEN_LOOP_KV_HOLD_FRACTION * SERVED_KV_BLOCKS_PER_WORKER * SERVED_BLOCK_SIZE_TOKENS;
  const numLiveConversations = SERVED_NUM_WORKERS * Math.floor(heldTokensPerWorker / maxHistoryTokens);
  // Little's law: live conversations = arrival rate × lifetime, which is its turns' service and the thinking between them.
  const lifetimeMs = 1000 * numLiveConversations / offer.sessionsPerS;
  const thinkingMs = Math.max(0, lifetimeMs - scenario.numTurns * offer.turnServiceMs);
  return { ...scenario, thinkTimeMs: thinkingMs / (scenario.numTurns - 1) };
}

function sessionTurnsOf(scenario: ScenarioSpec): number {
  return scenario.name === 'multi-turn' ? scenario.numTurns : 1;
}

/**
 * One server per policy, both scenarios against it, closed loop then open loop (each run's
 * prompts are its own, by seed: no cross-talk). offers: the open loop of each scenario; null:
 * derive it from this run's closed loop.
 */
async function servedRun(
  workDir: string, modelDir: string, policy: RoutingPolicy, offers: ReadonlyMap<string, OpenLoopOffer> | null,
): Promise<Map<string, ServedFigures>> {
  const [httpPort, metricsPort] = [await freePort(), await freePort()];
  const configPath = path.join(workDir, `${policy}.yaml`);
  writeFileSync(configPath, [
    'server:',
    '  host: 127.0.0.1',
    `  http_port: ${httpPort}`,
    `  metrics_port: ${metricsPort}`,
    'models:',
    `  - path: ${JSON.stringify(modelDir)}`,
    `    num_workers: ${SERVED_NUM_WORKERS}`,
    '    threads_per_worker: 1',
    '    max_num_seqs: 8',
    `    kv_cache_blocks: ${SERVED_KV_BLOCKS_PER_WORKER}`,
    '    max_model_len: 1024',
    `    routing_policy: ${policy}`,
    '',
  ].join('\n'));
  // Its log (JSON on stdout, a failed start's fatal line among it) goes to a file, read only on a failure.
  const logFile = path.join(workDir, `${policy}.log`);
  const logFd = openSync(logFile, 'w');
  const server = spawn(process.execPath, [conduitBin, 'serve', '--config', configPath], { stdio: ['ignore', logFd, 'pipe'] });
  closeSync(logFd);
  const log: Buffer[] = [];
  server.stderr!.on('data', (chunk: Buffer) => log.push(chunk));
  const url = `http://127.0.0.1:${httpPort}`;
  const figures = new Map<string, ServedFigures>();
  const measure = async (label: string, scenario: ScenarioSpec, numRequests: number, load: LoadSpec, seed: number): Promise<MeasuredFigures> => {
    // A deployment's system prompts are warm: each group's is sent once before the measurement.
    const warmupEntries: WorkloadEntry[] = scenario.name === 'shared-prefix'
      ? Array.from({ length: scenario.numGroups }, (_, i) => ({ prefix: { id: `group-${i}`, tokens: scenario.systemPromptTokens }, input_tokens: 1, output_tokens: 1 }))
      : [];
    const entries = [...warmupEntries, ...generateWorkload(scenario, numRequests, createRng(seed))];
    const results = await runLoadtest({
      url, model: SERVED_NAME, endpoint: 'completions', workload: { kind: 'entries', name: label, entries }, load, seed, warmupSessions: warmupEntries.length,
    });
    if (results.num_succeeded !== results.num_requests) {
      throw new Error(`${policy}, ${label}: ${results.num_requests - results.num_succeeded} of ${results.num_requests} requests failed: ${JSON.stringify(results.errors)}`);
    }
    return {
      hitRate: results.prefix_cache_hit_rate ?? 0, ttftP50Ms: results.ttft_ms.p50, ttftP99Ms: results.ttft_ms.p99,
      requestsPerS: results.request_throughput, meanE2eMs: results.e2e_ms.mean,
    };
  };
  try {
    await waitForHealth(url, server, log, logFile);
    for (const { label, scenario, closedLoop: closed, openLoop: open } of SERVED_SCENARIOS) {
      const closedLoop = await measure(label, scenario, closed.numRequests, { kind: 'concurrency', numClientsList: [closed.numClients] }, 1);
      console.log(`  ${policy}, ${label}, closed loop: ${describe(closedLoop)}, ${closedLoop.requestsPerS.toFixed(2)} requests/s`);
      const offer = offers?.get(label) ?? {
        sessionsPerS: OPEN_LOOP_LOAD_FRACTION * closedLoop.requestsPerS / sessionTurnsOf(scenario), turnServiceMs: closedLoop.meanE2eMs,
      };
      const openScenario = withThinkTime(scenario, offer);
      const openLoop = await measure(label, openScenario, open.numRequests, { kind: 'rate', ratesPerS: [offer.sessionsPerS] }, 2);
      const thinking = openScenario.name === 'multi-turn' ? ` (think time ${openScenario.thinkTimeMs!.toFixed(0)} ms)` : '';
      console.log(`  ${policy}, ${label}, open loop at ${offer.sessionsPerS.toFixed(3)} sessions/s${thinking}: ${describe(openLoop)}`);
      figures.set(label, { closedLoop, openLoop, offer });
    }
  } finally {
    server.kill('SIGTERM');
    if (server.exitCode === null) await once(server, 'exit');
  }
  return figures;
}

function describe(figures: Figures): string {
  return `prefix hit rate ${(100 * figures.hitRate).toFixed(1)} %, TTFT p50 ${figures.ttftP50Ms.toFixed(1)} ms, p99 ${figures.ttftP99Ms.toFixed(1)} ms`;
}

function printComparison(label: string, kvAware: Figures, roundRobin: Figures): void {
  console.log(
    `${label}: kv-aware ${describe(kvAware)}\n${' '.repeat(label.length)}  round-robin ${describe(roundRobin)}\n` +
    `${' '.repeat(label.length)}  round-robin / kv-aware: TTFT p50 ${(roundRobin.ttftP50Ms / kvAware.ttftP50Ms).toFixed(2)}x, ` +
    `p99 ${(roundRobin.ttftP99Ms / kvAware.ttftP99Ms).toFixed(2)}x (target >= 3x)`,
  );
}

async function benchServed(): Promise<void> {
  console.log(`\n## Served: ${SERVED_NUM_WORKERS} workers of the 125 M model, 1 thread each, ${SERVED_KV_BLOCKS_PER_WORKER} KV blocks of ${SERVED_BLOCK_SIZE_TOKENS} tokens each, one gateway`);
  for (const { label, scenario, closedLoop, openLoop } of SERVED_SCENARIOS) {
    console.log(`  ${label}: ${JSON.stringify(scenario)}; closed loop ${closedLoop.numRequests} requests, ${closedLoop.numClients} clients; ` +
      `open loop ${openLoop.numRequests} requests (completions)`);
  }
  const workDir = mkdtempSync(path.join(os.tmpdir(), 'conduit-bench-router-'));
  try {
    // Its tokenizer covers all 32,000 ids, so every sampled token streams text (bench-model.ts).
    const modelDir = writeServableBenchModel(workDir, SERVED_NAME);
    const byPolicy = new Map<RoutingPolicy, Map<string, ServedFigures>>();
    let offers: Map<string, OpenLoopOffer> | null = null;
    for (const policy of POLICIES) {
      const figures = await servedRun(workDir, modelDir, policy, offers);
      byPolicy.set(policy, figures);
      offers ??= new Map([...figures].map(([label, served]) => [label, served.offer]));
    }
    console.log('');
    for (const { label } of SERVED_SCENARIOS) {
      const [kvAware, roundRobin] = [byPolicy.get('kv-aware')!.get(label)!, byPolicy.get('round-robin')!.get(label)!];
      printComparison(`${label}, closed loop`, kvAware.closedLoop, roundRobin.closedLoop);
      printComparison(`${label}, open loop at ${OPEN_LOOP_LOAD_FRACTION} x round-robin's throughput`, kvAware.openLoop, roundRobin.openLoop);
    }
  } finally {
    rmSync(workDir, { recursive: true, force: true });
  }
}

// A GPU-class worker: 20k prefill tokens/s, 20 ms per decoded token; 4,096 blocks of 16 tokens.
const SIM_BASE = {
  numWorkers: 64,
  numGateways: 2,
  blockSizeTokens: 16,
  numKvBlocksPerWorker: 4096,
  timing: { prefillOverheadMs: 5, prefillMsPerToken: 0.05, decodeMsPerToken: 20 },
  seed: 7,
} as const;

// Each at a moderate load and at a high one (round-robin's workers near saturation), where
// routing matters most: the ratios depend on the load, and both are printed.
const SIM_WORKLOADS: readonly SimWorkload[] = [
  { kind: 'multi-turn', numConversations: 1500, numTurns: 6, inputTokens: 256, outputTokens: 64, conversationsPerS: 150, thinkMs: 2000 },
  { kind: 'multi-turn', numConversations: 2000, numTurns: 6, inputTokens: 256, outputTokens: 64, conversationsPerS: 200, thinkMs: 2000 },
  { kind: 'shared-prefix', numRequests: 12000, numGroups: 64, systemPromptTokens: 2048, inputTokens: 128, outputTokens: 64, requestsPerS: 500 },
  { kind: 'shared-prefix', numRequests: 15000, numGroups: 64, systemPromptTokens: 2048, inputTokens: 128, outputTokens: 64, requestsPerS: 750 },
];

function benchSimulated(): void {
  console.log(`\n## Simulated: ${SIM_BASE.numWorkers} workers, ${SIM_BASE.numGateways} gateway replicas (the real routers), timing model ${JSON.stringify(SIM_BASE.timing)}, ` +
    `${SIM_BASE.numKvBlocksPerWorker} KV blocks of ${SIM_BASE.blockSizeTokens} tokens per worker`);
  for (const workload of SIM_WORKLOADS) {
    const label = `${workload.kind} at ${workload.kind === 'multi-turn' ? `${workload.conversationsPerS} conversations/s` : `${workload.requestsPerS} requests/s`}`;
    console.log(`  ${label}: ${JSON.stringify(workload)}`);
    const figures = new Map<RoutingPolicy, Figures>();
    for (const policy of POLICIES) {
      const settings: SimSettings = { ...SIM_BASE, policy, workload };
      const result = simulate(settings);
      figures.set(policy, { hitRate: result.prefixHitRate, ttftP50Ms: quantile(result.ttftsMs, 0.5), ttftP99Ms: quantile(result.ttftsMs, 0.99) });
      console.log(
        `  ${policy}: ${result.numRequests} requests; routing decision p50 ${quantile(result.decisionsUs, 0.5).toFixed(1)} us, ` +
        `p99 ${quantile(result.decisionsUs, 0.99).toFixed(1)} us (CPU time p50 ${quantile(result.decisionsCpuUs, 0.5).toFixed(0)} us, ` +
        `p99 ${quantile(result.decisionsCpuUs, 0.99).toFixed(0)} us), hashing included (hashing all of a prompt's blocks alone, as the router does: ` +
        `p50 ${quantile(result.hashingUs, 0.5).toFixed(1)} us); index ${result.numIndexedBlocks} blocks at the end`,
      );
    }
    printComparison(label, figures.get('kv-aware')!, figures.get('round-robin')!);
  }
}

async function main(): Promise<void> {
  const { values } = parseArgs({ options: { part: { type: 'string', default: 'both' } } });
  if (!['served', 'simulated', 'both'].includes(values.part!)) throw new Error(`--part: expected served, simulated or both, got ${values.part}`);
  console.log(`CPU: ${describeCpu()}`);
  if (values.part !== 'served') benchSimulated();
  if (values.part !== 'simulated') await benchServed();
}

await main();
