// runLoadtest: prepare the workload's prompts, drive each load point, and turn the records
// into results. The entry point for the CLI and for tests that drive a real server.

import { performance } from 'node:perf_hooks';
import { type LoadShape, type PreparedSession, drive } from './driver.ts';
import { type GoodputTargets, type LoadPointMetrics, type OfferedLoad, computeMetrics } from './metrics.ts';
import { type OpenAiEndpoint, OpenAiSseTransport } from './openai-sse-transport.ts';
import type { ProgressReporter } from './progress.ts';
import { type PromptBuilder, TokenizedPromptBuilder, WordPromptBuilder } from './prompt-builder.ts';
import { createRng } from './random.ts';
import type { RequestRecord } from './request-record.ts';
import { type Results, requestSummaries } from './results.ts';
import { type ScenarioSpec, generateWorkload } from './scenarios.ts';
import { ServerTokenizer } from './server-tokenizer.ts';
import { type WorkloadEntry, groupSessions } from './workload.ts';

export type WorkloadSource =
  | { kind: 'scenario'; scenario: ScenarioSpec; numRequests: number }
  /** Entries read from a workload file; every load point replays all of them. */
  | { kind: 'entries'; name: string; entries: WorkloadEntry[] };

export type LoadSpec =
  | { kind: 'rate'; ratesPerS: number[] }
  | { kind: 'concurrency'; numClientsList: number[] }
  | { kind: 'trace' };

export interface LoadtestOptions {
  /** Server base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted). */
  url: string;
  model: string;
  endpoint: OpenAiEndpoint;
  workload: WorkloadSource;
  load: LoadSpec;
  goodput?: GoodputTargets | null;
  seed?: number;
  timeoutMs?: number;
  label?: string;
  progress?: ProgressReporter | null;
  /**
   * The workload's first N sessions are sent one at a time before each load point and not
   * counted, so the measurement sees warm caches, as a deployment's steady state does.
   */
  warmupSessions?: number;
  /** Server-specific fields added to every request's body (e.g. llama-server's `chat_parser`). */
  requestFields?: Readonly<Record<string, unknown>>;
}

const DEFAULT_TIMEOUT_MS = 600_000;
const PREPARE_PARALLELISM = 16;

export async function runLoadtest(options: LoadtestOptions): Promise<Results> {
  const baseUrl = options.url.replace(/\/+$/, '').replace(/\/v1$/, '');
  const seed = options.seed ?? 0;
  const startedAt = new Date().toISOString();
  const tokenizer = await ServerTokenizer.probe(baseUrl, options.model);
  const builder: PromptBuilder =
    tokenizer instanceof ServerTokenizer
      ? await TokenizedPromptBuilder.create(tokenizer, createRng(seed))
      : new WordPromptBuilder();
  const loadPoints = loadShapes(options.load, seed);
  // All prompts are built before the first request, so preparation never overlaps the measurement.
  const sessionsByPoint: PreparedSession[][] = [];
  for (let i = 0; i < loadPoints.length; i++) {
    sessionsByPoint.push(await prepareSessions(workloadEntries(options.workload, seed + i), builder, seed + i, options.load.kind === 'trace'));
  }
  const transport = new OpenAiSseTransport({
    baseUrl,
    model: options.model,
    endpoint: options.endpoint,
    maxSockets: options.load.kind === 'concurrency' ? Math.max(...options.load.numClientsList) : Infinity,
    requestFields: options.requestFields,
  });
  const timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  const originMs = performance.now();
  const recordsByPoint: RequestRecord[][] = [];
  try {
    for (let i = 0; i < loadPoints.length; i++) {
      const warmupSessions = sessionsByPoint[i].slice(0, options.warmupSessions ?? 0);
      const sessions = sessionsByPoint[i].slice(warmupSessions.length);
      if (warmupSessions.length > 0) {
        await drive({
          transport, sessions: warmupSessions, load: { kind: 'concurrency', numClients: 1 }, timeoutMs, originMs, onRequestDone: () => {},
        });
      }
      const numRequests = sessions.reduce((total, session) => total + session.turns.length, 0);
      options.progress?.start(describeLoad(loadPoints[i].offered), numRequests);
      const records = await drive({
        transport,
        sessions,
        load: loadPoints[i].shape,
        timeoutMs,
        originMs,
        onRequestDone: (record) => options.progress?.requestDone(record.errorType !== null),
      });
      options.progress?.finish();
      recordsByPoint.push(records);
    }
  } finally {
    transport.close();
  }
  const allRecords = recordsByPoint.flat();
  await resolveOutputTokens(allRecords, tokenizer instanceof ServerTokenizer ? tokenizer : null);
  const goodput = options.goodput ?? null;
  const pointMetrics: LoadPointMetrics[] = recordsByPoint.map((records, i) => computeMetrics(records, loadPoints[i].offered, goodput));
  const pooled =
    pointMetrics.length === 1 ? pointMetrics[0] : computeMetrics(allRecords, { kind: 'sweep', num_points: pointMetrics.length }, goodput);
  return {
    schema: 'conduit-loadtest/1',
    label: options.label ?? `${options.model} @ ${baseUrl}`,
    url: baseUrl,
    model: options.model,
    endpoint: options.endpoint,
    transport: transport.name,
    workload: options.workload.kind === 'scenario' ? options.workload.scenario.name : options.workload.name,
    seed,
    started_at: startedAt,
    prompt_lengths:
      tokenizer instanceof ServerTokenizer
        ? 'exact: built with the server /tokenize'
        : `estimated: one word per token (${tokenizer.unavailable})`,
    ...pooled,
    load_points: pointMetrics,
    requests: requestSummaries(recordsByPoint),
  };
}

interface LoadPoint {
  shape: LoadShape;
  offered: OfferedLoad;
}

function loadShapes(load: LoadSpec, seed: number): LoadPoint[] {
  switch (load.kind) {
    case 'rate':
      return load.ratesPerS.map((ratePerS, i) => ({
        shape: { kind: 'rate', ratePerS, rng: createRng(seed + 1000 + i) },
        offered: { kind: 'rate', requests_per_s: ratePerS },
      }));
    case 'concurrency':
      return load.numClientsList.map((numClients) => ({
        shape: { kind: 'concurrency', numClients },
        offered: { kind: 'concurrency', clients: numClients },
      }));
    case 'trace':
      return [{ shape: { kind: 'trace' }, offered: { kind: 'trace' } }];
  }
}

function describeLoad(offered: OfferedLoad): string {
  switch (offered.kind) {
    case 'rate':
      return `rate ${offered.requests_per_s}/s`;
    case 'concurrency':
      return `concurrency ${offered.clients}`;
    case 'trace':
      return 'trace replay';
    case 'sweep':
      return 'sweep';
  }
}

/** A scenario draws a fresh workload per load point, so no point profits from an earlier point's cache. */
function workloadEntries(source: WorkloadSource, seed: number): WorkloadEntry[] {
  return source.kind === 'entries' ? source.entries : generateWorkload(source.scenario, source.numRequests, createRng(seed));
}

async function prepareSessions(
  entries: readonly WorkloadEntry[],
  builder: PromptBuilder,
  seed: number,
  sortByTimestamp: boolean,
): Promise<PreparedSession[]> {
  const rng = createRng(seed + 2000);
  const prefixTexts = new Map<string, Promise<string>>();
  const prefixText = (id: string, numTokens: number): Promise<string> => {
    let text = prefixTexts.get(id);
    if (!text) {
      text = builder.build(numTokens, rng);
      prefixTexts.set(id, text);
    }
    return text;
  };
  const sessions = groupSessions(entries);
  const prepared: PreparedSession[] = sessions.map((session) => ({ id: session.id, turns: [] }));
  const jobs = sessions.flatMap((session, sessionIndex) =>
    session.turns.map((entry, turnIndex) => async () => {
      prepared[sessionIndex].turns[turnIndex] = {
        prefixText: entry.prefix ? await prefixText(entry.prefix.id, entry.prefix.tokens) : null,
        userText: entry.text ?? (await builder.build(entry.input_tokens ?? 1, rng)),
        maxTokens: entry.output_tokens,
        timestampMs: entry.timestamp_ms ?? null,
        thinkTimeMs: entry.think_time_ms ?? 0,
      };
    }),
  );
  await runWithParallelism(jobs, PREPARE_PARALLELISM);
  if (sortByTimestamp) prepared.sort((a, b) => (a.turns[0].timestampMs ?? 0) - (b.turns[0].timestampMs ?? 0));
  return prepared;
}

async function runWithParallelism(jobs: (() => Promise<void>)[], parallelism: number): Promise<void> {
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < jobs.length) await jobs[next++]();
  };
  await Promise.all(Array.from({ length: Math.min(parallelism, jobs.length) }, worker));
}

/** Output tokens from the usage chunk; else the server's count of the text; else one per chunk. */
async function resolveOutputTokens(records: RequestRecord[], tokenizer: ServerTokenizer | null): Promise<void> {
  const unresolved: RequestRecord[] = [];
  for (const record of records) {
    if (record.errorType !== null) continue;
    if (record.usage?.completionTokens != null) {
      record.numOutputTokens = record.usage.completionTokens;
      record.outputTokensSource = 'usage';
    } else {
      unresolved.push(record);
    }
  }
  const jobs = unresolved.map((record) => async () => {
    if (tokenizer) {
      try {
        record.numOutputTokens = await tokenizer.countTokens(record.text);
        record.outputTokensSource = 'tokenize';
        return;
      } catch {
        // Fall through to the chunk count: the measurement itself succeeded.
      }
    }
    record.numOutputTokens = record.chunkTimesMs.length;
    record.outputTokensSource = 'chunks';
  });
  await runWithParallelism(jobs, PREPARE_PARALLELISM);
}
