// The engine's real Scheduler on a clock of its own: each step takes what its executor says,
// clients send their next request as soon as their last one ends (a closed loop), and nothing
// else runs. Simulated, a step takes what a cost model says (a fixed part, the weights' pass, plus
// a part per token) and samples a dummy token; replayed (tools/scheduler-replay.ts), the real
// forward pass runs it and it takes the pass's CPU time. What it shows is the scheduling policy
// alone, without the gateway, the wire or a machine shared with other work: bench:latency prints
// it beside the served figures.
import { Scheduler, type PrefillLimits } from '../engine/scheduler.ts';
import { TOP_LOGPROBS_STRIDE, type RunnerResult, type SchedulerOutput } from '../engine/scheduler-output.ts';

/** A step's duration: fixedMs + msPerToken × its tokens. */
export interface StepCostModel {
  fixedMs: number;
  msPerToken: number;
}

export interface ClosedLoopWorkload {
  numClients: number;
  numRequests: number;
  /**
   * From a request's end to its client's next request reaching the worker (the stream's last
   * event, a new HTTP request, the gateway, the gRPC hop): the step that starts meanwhile runs
   * without it.
   */
  roundTripMs: number;
  /** Each request's prompt: its own tokens after a prefix shared by every request (0: none). */
  sharedPrefixTokens: number;
  ownPromptTokens: number;
  outputTokens: number;
}

/** One step on the loop's clock: what it computed and when it ended. */
export interface StepRecord {
  ms: number;
  endMs: number;
  /** Tokens of prompts (and of their cached-prefix-less chunks) computed. */
  numPromptTokens: number;
  /** Sequences that decoded one token. */
  numDecodeRows: number;
}

export interface SimulatedFigures {
  outputTokensPerS: number;
  /** In the order sent: the first numClients are the opening burst. */
  ttftsMs: number[];
  /** Gaps between a request's consecutive tokens, every request's. */
  itlsMs: number[];
  steps: StepRecord[];
}

/** Runs a step: its result and how long it took on the loop's clock. */
export type StepExecutor = (output: SchedulerOutput) => Promise<{ result: RunnerResult; ms: number }>;

/** Loop sizes: the engine's defaults, and KV blocks for the replay's model. */
export interface LoopLimits {
  maxNumBatchedTokens: number;
  maxNumSeqs: number;
  numKvBlocks: number;
}

const DEFAULT_LIMITS: LoopLimits = { maxNumBatchedTokens: 512, maxNumSeqs: 64, numKvBlocks: 4096 };

const VOCAB_SIZE = 32000;
const BLOCK_SIZE_TOKENS = 16;

function resultFor(output: SchedulerOutput): RunnerResult {
  const numSeqs = output.scheduled.length;
  return {
    // Any token will do: every request ignores EOS and runs to its length.
    sampledTokenIds: new Int32Array(numSeqs).fill(7),
    sampledLogprobs: new Float32Array(numSeqs),
    topTokenIds: new Int32Array(numSeqs * TOP_LOGPROBS_STRIDE),
    topLogprobs: new Float32Array(numSeqs * TOP_LOGPROBS_STRIDE),
    promptLogprobs: new Float32Array(0),
    promptRanks: new Int32Array(0),
    promptTopTokenIds: new Int32Array(0),
    promptTopLogprobs: new Float32Array(0),
  };
}

/** Runs numRequests through numClients closed-loop clients, each step as cost says; the first numClients arrive together. */
export function simulateClosedLoop(limits: PrefillLimits, cost: StepCostModel, workload: ClosedLoopWorkload, loopLimits: Partial<LoopLimits> = {}): Promise<SimulatedFigures> {
  const execute: StepExecutor = async (output) => ({ result: resultFor(output), ms: cost.fixedMs + cost.msPerToken * output.numScheduledTokens });
  return runClosedLoop(limits, execute, workload, loopLimits);
}

/** Runs numRequests through numClients closed-loop clients, each step by execute; the first numClients arrive together. */
export async function runClosedLoop(limits: PrefillLimits, execute: StepExecutor, workload: ClosedLoopWorkload, loopLimits: Partial<LoopLimits> = {}): Promise<SimulatedFigures> {
  const { maxNumBatchedTokens, maxNumSeqs, numKvBlocks } = { ...DEFAULT_LIMITS, ...loopLimits };
  let nowMs = 0;
  const scheduler = new Scheduler({
    numKvBlocks,
    blockSizeTokens: BLOCK_SIZE_TOKENS,
    maxModelLen: 4096,
    vocabSize: VOCAB_SIZE,
    maxNumSeqs,
    maxNumBatchedTokens,
    ...limits,
    generationDefaults: { eosTokenIds: [] },
    modelName: 'sim',
    enablePrefixCaching: true,
    policy: 'fcfs',
    now: () => nowMs,
  });
  const prefix = Array.from({ length: workload.sharedPrefixTokens }, (_, i) => 1000 + (i % 20000));
  const sentMs = new Map<string, number>();
  const lastTokenMs = new Map<string, number>();
  const ttftsMs: number[] = [];
  const itlsMs: number[] = [];
  const steps: StepRecord[] = [];
  let numSent = 0;
  let numDone = 0;
  let numOutputTokens = 0;
  /** When each client's next request reaches the worker, in order. */
  const arrivalsMs: number[] = [];
  /** arrivalMs: when it reached the worker, perhaps during a step that it then waits for. */
  const send = (arrivalMs: number) => {
    const requestId = `r${numSent}`;
    // Each request's own tokens differ from every other's from the first on.
    const own = Array.from({ length: workload.ownPromptTokens }, (_, i) => 21000 + ((numSent * 7919 + i * 104729) % 11000));
    const refusal = scheduler.add({ requestId, promptTokenIds: [...prefix, ...own], sampling: { maxTokens: workload.outputTokens, ignoreEos: true, temperature: 0 } });
    if (refusal !== null) throw new Error(`simulated request refused: ${refusal.message}`);
    sentMs.set(requestId, arrivalMs - workload.roundTripMs);
    numSent++;
  };
  for (let i = 0; i < Math.min(workload.numClients, workload.numRequests); i++) arrivalsMs.push(workload.roundTripMs);
  while (numDone < workload.numRequests) {
    // Requests that reached the worker join this step; an idle worker waits for the next one.
    if (!scheduler.hasUnfinished && arrivalsMs.length > 0) nowMs = Math.max(nowMs, arrivalsMs[0]);
    while (arrivalsMs.length > 0 && arrivalsMs[0] <= nowMs) {
      send(arrivalsMs.shift()!);
    }
    const output = scheduler.schedule();
    if (output.scheduled.length === 0) throw new Error('the simulated scheduler stalled');
    const { result, ms } = await execute(output);
    nowMs += ms;
    const numDecodeRows = output.scheduled.filter((seq) => seq.numOutputTokens > 0).length;
    steps.push({ ms, endMs: nowMs, numPromptTokens: output.numScheduledTokens - numDecodeRows, numDecodeRows });
    for (const news of scheduler.update(output, result)) {
      const { requestId } = news;
      if (news.numOutputTokens === 1) ttftsMs[Number(requestId.slice(1))] = nowMs - sentMs.get(requestId)!;
      else itlsMs.push(nowMs - lastTokenMs.get(requestId)!);
      lastTokenMs.set(requestId, nowMs);
      numOutputTokens += news.newTokenIds.length;
      if (news.finishReason === null) continue;
      numDone++;
      if (numSent + arrivalsMs.length < workload.numRequests) arrivalsMs.push(nowMs + workload.roundTripMs);
    }
  }
  return { outputTokensPerS: (1000 * numOutputTokens) / nowMs, ttftsMs, itlsMs, steps };
}
