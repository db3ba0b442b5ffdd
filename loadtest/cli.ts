// `conduit loadtest` / `npm run loadtest --`: parse the command line, run, print a summary and
// write results.json and report.html; `compare` renders results files side by side.

import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { parseLengthDistribution } from './length-distribution.ts';
import type { GoodputTargets } from './metrics.ts';
import { StderrProgress } from './progress.ts';
import { renderReport } from './report-html.ts';
import { type Results, isResults } from './results.ts';
import { type LoadSpec, type WorkloadSource, runLoadtest } from './run.ts';
import { SCENARIO_NAMES, type ScenarioSpec, generateWorkload } from './scenarios.ts';
import { createRng } from './random.ts';
import { WorkloadError, hasTimestamps, readWorkloadFile, writeWorkloadFile } from './workload.ts';

const USAGE = `usage:
  conduit loadtest --url URL --model NAME --scenario NAME|FILE [options]
  conduit loadtest compare A/results.json B/results.json [--out DIR]
  conduit loadtest kserve --url URL --model NAME [--protocol http|grpc]   (ordinary models; conduit loadtest kserve --help)

scenarios: ${SCENARIO_NAMES.join(', ')}, or a JSONL workload file (see loadtest/README.md)
  --input-tokens N         user text per request (fixed, shared-prefix question, multi-turn turn); default 128
  --output-tokens N        generated tokens per request, held with ignore_eos; default 128
  --groups N               shared-prefix: number of system prompts; default 8
  --system-prompt-tokens N shared-prefix: length of each system prompt; default 1024
  --turns N                multi-turn: turns per conversation; default 4
  --think-time-ms MS       multi-turn: pause between a reply and the next turn (a user reading); default 0
  --context-tokens N       multi-turn: a document of its own each conversation carries (a system message); default 0
  --input-dist SPEC        distribution: fixed:N | uniform:MIN:MAX | normal:MEAN:SD | lognormal:MEAN:SD
  --output-dist SPEC       distribution: as --input-dist
  --requests N             requests per load point (generated scenarios); default 100
  --warmup N               send the workload's first N sessions one at a time before each load point,
                           not counted (warm caches); default 0
load (one of; a workload file with timestamp_ms on every line replays as a trace by default):
  --rate R[,R...]          open loop: Poisson arrivals at R requests/s; a list sweeps the rates
  --concurrency N[,N...]   closed loop: N clients back to back; default 1
options:
  --endpoint chat|completions   /v1/chat/completions (default) or /v1/completions
  --goodput ttft:MS,itl:MS,e2e:MS   latency targets for goodput (any subset)
  --out DIR                write results.json and report.html
  --write-workload FILE    write the generated workload as JSONL (and exit unless --url is given)
  --label TEXT             name of this run in reports; --seed N; --timeout-s S (per request, default 600)
  --quiet                  no progress bar`;

class UsageError extends Error {}

const OPTIONS = {
  url: { type: 'string' },
  model: { type: 'string' },
  scenario: { type: 'string' },
  endpoint: { type: 'string', default: 'chat' },
  'input-tokens': { type: 'string', default: '128' },
  'output-tokens': { type: 'string', default: '128' },
  groups: { type: 'string', default: '8' },
  'system-prompt-tokens': { type: 'string', default: '1024' },
  turns: { type: 'string', default: '4' },
  'think-time-ms': { type: 'string', default: '0' },
  'context-tokens': { type: 'string', default: '0' },
  'input-dist': { type: 'string' },
  'output-dist': { type: 'string' },
  requests: { type: 'string', default: '100' },
  warmup: { type: 'string', default: '0' },
  rate: { type: 'string' },
  concurrency: { type: 'string' },
  goodput: { type: 'string' },
  out: { type: 'string' },
  'write-workload': { type: 'string' },
  label: { type: 'string' },
  seed: { type: 'string', default: '0' },
  'timeout-s': { type: 'string', default: '600' },
  quiet: { type: 'boolean', default: false },
  help: { type: 'boolean', short: 'h', default: false },
} as const;

function positiveInteger(value: string, flag: string): number {
  const parsed = Number(value);
  if (!Number.isInteger(parsed) || parsed < 1) throw new UsageError(`expected a positive integer for --${flag} but received "${value}"`);
  return parsed;
}

function nonNegativeNumber(value: string, flag: string, kind: 'integer' | 'number' = 'number'): number {
  const parsed = Number(value);
  const valid = kind === 'integer' ? Number.isInteger(parsed) : Number.isFinite(parsed);
  if (value.trim() === '' || !valid || parsed < 0) throw new UsageError(`expected ${kind === 'integer' ? 'an integer' : 'a number'} >= 0 for --${flag} but received "${value}"`);
  return parsed;
}

function positiveNumbers(value: string, flag: string): number[] {
  return value.split(',').map((part) => {
    const parsed = Number(part);
    if (!Number.isFinite(parsed) || parsed <= 0) throw new UsageError(`expected positive numbers for --${flag} but received "${value}"`);
    return parsed;
  });
}

function parseGoodput(spec: string): GoodputTargets {
  const targets: GoodputTargets = {};
  for (const part of spec.split(',')) {
    const [name, value] = part.split(':');
    const ms = Number(value);
    if (!Number.isFinite(ms) || ms <= 0 || !['ttft', 'itl', 'e2e'].includes(name)) {
      throw new UsageError(`expected --goodput like ttft:500,itl:50,e2e:5000 (milliseconds) but received "${spec}"`);
    }
    targets[`${name as 'ttft' | 'itl' | 'e2e'}Ms`] = ms;
  }
  return targets;
}

type Values = ReturnType<typeof parseArgs<{ options: typeof OPTIONS }>>['values'];

function scenarioSpec(name: (typeof SCENARIO_NAMES)[number], values: Values): ScenarioSpec {
  const inputTokens = positiveInteger(values['input-tokens'], 'input-tokens');
  const outputTokens = positiveInteger(values['output-tokens'], 'output-tokens');
  switch (name) {
    case 'fixed':
      return { name, inputTokens, outputTokens };
    case 'shared-prefix':
      return {
        name,
        numGroups: positiveInteger(values.groups, 'groups'),
        systemPromptTokens: positiveInteger(values['system-prompt-tokens'], 'system-prompt-tokens'),
        inputTokens,
        outputTokens,
      };
    case 'multi-turn':
      return {
        name,
        numTurns: positiveInteger(values.turns, 'turns'),
        inputTokens,
        outputTokens,
        thinkTimeMs: nonNegativeNumber(values['think-time-ms'], 'think-time-ms'),
        contextTokens: nonNegativeNumber(values['context-tokens'], 'context-tokens', 'integer'),
      };
    case 'distribution':
      try {
        return {
          name,
          input: parseLengthDistribution(values['input-dist'] ?? `fixed:${inputTokens}`),
          output: parseLengthDistribution(values['output-dist'] ?? `fixed:${outputTokens}`),
        };
      } catch (err) {
        throw new UsageError(`--input-dist/--output-dist: ${(err as Error).message}`);
      }
  }
}

async function workloadSource(values: Values): Promise<WorkloadSource> {
  const scenario = values.scenario;
  if (!scenario) throw new UsageError('--scenario is required');
  const name = SCENARIO_NAMES.find((known) => known === scenario);
  if (name && !existsSync(scenario)) {
    return { kind: 'scenario', scenario: scenarioSpec(name, values), numRequests: positiveInteger(values.requests, 'requests') };
  }
  if (!existsSync(scenario) && !/\.jsonl?$/.test(scenario)) {
    throw new UsageError(`unknown scenario "${scenario}": expected one of ${SCENARIO_NAMES.join(', ')} or a workload file`);
  }
  return { kind: 'entries', name: path.basename(scenario), entries: await readWorkloadFile(scenario) };
}

function loadSpec(values: Values, source: WorkloadSource): LoadSpec {
  if (values.rate !== undefined && values.concurrency !== undefined) throw new UsageError('give --rate or --concurrency, not both');
  if (values.rate !== undefined) return { kind: 'rate', ratesPerS: positiveNumbers(values.rate, 'rate') };
  if (values.concurrency !== undefined) {
    return { kind: 'concurrency', numClientsList: values.concurrency.split(',').map((part) => positiveInteger(part, 'concurrency')) };
  }
  if (source.kind === 'entries' && hasTimestamps(source.entries)) return { kind: 'trace' };
  return { kind: 'concurrency', numClientsList: [1] };
}

/** A sweep: one line per load point, as report.html's summary table. */
function printLoadPoints(results: Results): void {
  const cell = (value: number, digits: number) => (Number.isFinite(value) ? value.toFixed(digits) : '–');
  const header = ['load', 'sent', 'failed', 'req/s', 'tok/s', 'TTFT p50/p90/p99 (ms)', 'ITL p50/p90/p99 (ms)', 'e2e p50/p90/p99 (ms)'];
  const rows = results.load_points.map((point) => {
    const offered = point.offered_load;
    const load = offered.kind === 'rate' ? `${offered.requests_per_s} req/s`
      : offered.kind === 'concurrency' ? `${offered.clients} client${offered.clients === 1 ? '' : 's'}` : offered.kind;
    const percentiles = (key: 'ttft_ms' | 'itl_ms' | 'e2e_ms') => [point[key].p50, point[key].p90, point[key].p99].map((v) => cell(v, 1)).join(' / ');
    return [load, String(point.num_requests), String(point.errors.total), cell(point.request_throughput, 2),
      cell(point.output_token_throughput, 1), percentiles('ttft_ms'), percentiles('itl_ms'), percentiles('e2e_ms')];
  });
  const widths = header.map((title, i) => Math.max(title.length, ...rows.map((row) => row[i].length)));
  for (const row of [header, ...rows]) console.log(`  ${row.map((value, i) => (i === 0 ? value.padEnd(widths[i]) : value.padStart(widths[i]))).join('  ')}`);
}

function printSummary(results: Results): void {
  const line = (name: string, value: string) => console.log(`  ${name.padEnd(34)} ${value}`);
  const latency = (name: string, key: 'ttft_ms' | 'itl_ms' | 'tpot_ms' | 'e2e_ms' | 'chunk_gap_ms') => {
    const s = results[key];
    line(`${name} (ms) mean/p50/p90/p99`, [s.mean, s.p50, s.p90, s.p99].map((v) => (Number.isFinite(v) ? v.toFixed(2) : '–')).join(' / '));
  };
  console.log(`${results.label}: ${results.num_succeeded}/${results.num_requests} requests succeeded in ${results.duration_s.toFixed(2)} s`);
  if (results.load_points.length > 1) {
    printLoadPoints(results);
  } else {
    latency('time to first token', 'ttft_ms');
    latency('inter-token latency', 'itl_ms');
    latency('time per output token', 'tpot_ms');
    latency('end-to-end latency', 'e2e_ms');
    latency('gap between chunks', 'chunk_gap_ms');
    line('request throughput (req/s)', results.request_throughput.toFixed(2));
    line('output token throughput (tok/s)', results.output_token_throughput.toFixed(1));
  }
  const pooled = results.load_points.length > 1 ? ', all points' : '';
  if (results.goodput) line(`goodput (req/s${pooled})`, `${results.goodput.request_throughput.toFixed(2)} (${(results.goodput.fraction * 100).toFixed(1)}% within targets)`);
  if (results.prefix_cache_hit_rate !== null) line(`prefix cache hit rate${pooled && ' (all points)'}`, `${(results.prefix_cache_hit_rate * 100).toFixed(1)}%`);
  line('prompt lengths', results.prompt_lengths);
  for (const [type, count] of Object.entries(results.errors.by_type)) {
    line(`failed: ${type}`, `${count} (${results.errors.examples[type]})`);
  }
}

async function writeReport(outDir: string, runs: readonly Results[], resultsToWrite: Results | null): Promise<void> {
  await mkdir(outDir, { recursive: true });
  if (resultsToWrite) await writeFile(path.join(outDir, 'results.json'), JSON.stringify(resultsToWrite, null, 1));
  await writeFile(path.join(outDir, 'report.html'), renderReport(runs));
  console.log(`wrote ${resultsToWrite ? 'results.json and ' : ''}report.html to ${outDir}`);
}

async function runCommand(values: Values): Promise<number> {
  const source = await workloadSource(values);
  const seed = Number(values.seed);
  if (values['write-workload']) {
    const entries = source.kind === 'entries' ? source.entries : generateWorkload(source.scenario, source.numRequests, createRng(seed));
    await writeWorkloadFile(values['write-workload'], entries);
    console.log(`wrote ${entries.length} requests to ${values['write-workload']}`);
    if (!values.url) return 0;
  }
  if (!values.url) throw new UsageError('--url is required');
  if (!values.model) throw new UsageError('--model is required');
  const endpoint = values.endpoint;
  if (endpoint !== 'chat' && endpoint !== 'completions') throw new UsageError(`expected chat or completions for --endpoint but received "${endpoint}"`);
  const results = await runLoadtest({
    url: values.url,
    model: values.model,
    endpoint,
    workload: source,
    load: loadSpec(values, source),
    goodput: values.goodput ? parseGoodput(values.goodput) : null,
    seed,
    timeoutMs: positiveInteger(values['timeout-s'], 'timeout-s') * 1000,
    label: values.label,
    progress: values.quiet ? null : new StderrProgress(),
    warmupSessions: nonNegativeNumber(values.warmup, 'warmup', 'integer'),
  });
  printSummary(results);
  if (values.out) await writeReport(values.out, [results], results);
  if (results.num_succeeded === 0) {
    const causes = Object.entries(results.errors.by_type).map(([type, count]) => `${count} × ${type}: ${results.errors.examples[type]}`);
    console.error(`conduit loadtest: every request to ${results.url} failed (${causes.join('; ')})`);
    return 1;
  }
  return 0;
}

async function readResults(filePath: string): Promise<Results> {
  let parsed: unknown;
  try {
    parsed = JSON.parse(await readFile(filePath, 'utf8'));
  } catch (err) {
    throw new UsageError(`cannot read results file ${filePath}: ${(err as Error).message}`);
  }
  if (!isResults(parsed)) throw new UsageError(`${filePath} is not a conduit loadtest results.json`);
  return parsed;
}

async function compareCommand(files: string[], values: Values): Promise<number> {
  if (files.length < 2) throw new UsageError('compare takes two or more results.json files');
  const runs = await Promise.all(files.map(readResults));
  // Two runs of the same server keep apart in the legend by their files' folders.
  if (new Set(runs.map((run) => run.label)).size < runs.length) {
    runs.forEach((run, i) => (run.label = `${run.label} (${path.basename(path.dirname(path.resolve(files[i])))})`));
  }
  for (const run of runs) printSummary(run);
  await writeReport(values.out ?? 'loadtest-compare', runs, null);
  return 0;
}

export async function main(argv: string[]): Promise<number> {
  // Ordinary models over KServe v2 take their own flags.
  if (argv[0] === 'kserve') return await (await import('./kserve.ts')).kserveMain(argv.slice(1));
  try {
    const { values, positionals } = parseArgs({ args: argv, options: OPTIONS, allowPositionals: true, strict: true });
    if (values.help) {
      console.log(USAGE);
      return 0;
    }
    if (positionals[0] === 'compare') return await compareCommand(positionals.slice(1), values);
    if (positionals.length > 0) throw new UsageError(`unexpected argument "${positionals[0]}"`);
    return await runCommand(values);
  } catch (err) {
    if (err instanceof UsageError || err instanceof WorkloadError || (err as NodeJS.ErrnoException).code?.startsWith('ERR_PARSE_ARGS')) {
      console.error(`conduit loadtest: ${(err as Error).message}\n\n${USAGE}`);
      return 2;
    }
    throw err;
  }
}
