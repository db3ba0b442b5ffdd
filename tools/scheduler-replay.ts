// The closed loop of tools/scheduler-sim.ts with the real forward pass: the engine's Scheduler
// and NativeRunner on a model loaded in this process, each step advancing the loop's clock by its
// forward's CPU time over the pool's threads. A neighbour's load on a shared machine then counts
// only where it makes a pool thread poll for a preempted partner (which never flatters), so the
// scheduling policy can be measured under load where a served run cannot (bench:latency --part
// replay). No gateway, no wire, no client: what the served figures add on top.
import { NativeRunner } from '../engine/native-runner.ts';
import type { PrefillLimits } from '../engine/scheduler.ts';
import { loadModel } from '../native/index.ts';
import type { NativeModel } from '../native/api.ts';
import { runClosedLoop, type ClosedLoopWorkload, type LoopLimits, type SimulatedFigures, type StepExecutor, type StepRecord } from './scheduler-sim.ts';

export interface Replayer {
  replay(limits: PrefillLimits, workload: ClosedLoopWorkload): Promise<SimulatedFigures>;
  close(): void;
}

/** The model at modelDir on numThreads threads, ready to replay closed loops within loopLimits. */
export async function openReplayer(modelDir: string, numThreads: number, loopLimits: LoopLimits): Promise<Replayer> {
  const model: NativeModel = await loadModel({
    modelDir, dtype: 'auto', kvCacheDtype: 'auto', numKvBlocks: loopLimits.numKvBlocks, blockSizeTokens: 16, numThreads, kernel: 'auto',
  });
  const runner = new NativeRunner(model, { maxModelLen: 4096, maxNumSeqs: loopLimits.maxNumSeqs, maxNumBatchedTokens: loopLimits.maxNumBatchedTokens });
  const execute: StepExecutor = async (output) => {
    const before = process.cpuUsage();
    const result = await runner.execute(output);
    const cpu = process.cpuUsage(before);
    return { result, ms: (cpu.user + cpu.system) / 1000 / numThreads };
  };
  return {
    replay: (limits, workload) => runClosedLoop(limits, execute, workload, loopLimits),
    close: () => model.close(),
  };
}

/** A step's cost as fixedMs + msPerPromptToken × prompt tokens + msPerDecodeRow × decode rows. */
export interface StepCostSplit {
  fixedMs: number;
  msPerPromptToken: number;
  msPerDecodeRow: number;
}

/** Least squares over the steps (a degenerate set, e.g. no decodes at all, gives null). */
export function fitStepCost(steps: readonly StepRecord[]): StepCostSplit | null {
  // Normal equations of ms ~ [1, prompt tokens, decode rows].
  const a = [[0, 0, 0], [0, 0, 0], [0, 0, 0]];
  const b = [0, 0, 0];
  for (const step of steps) {
    const row = [1, step.numPromptTokens, step.numDecodeRows];
    for (let i = 0; i < 3; i++) {
      b[i] += row[i] * step.ms;
      for (let j = 0; j < 3; j++) a[i][j] += row[i] * row[j];
    }
  }
  const det = (m: number[][]) =>
    m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0]) + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]);
  const d = det(a);
  if (Math.abs(d) < 1e-9 * Math.max(1, Math.abs(a[1][1] * a[2][2]))) return null;
  const solve = (column: number) => det(a.map((row, i) => row.map((value, j) => (j === column ? b[i] : value)))) / d;
  return { fixedMs: solve(0), msPerPromptToken: solve(1), msPerDecodeRow: solve(2) };
}

/** Where the loop's time went up to untilMs: steps, and the fitted parts of their cost. */
export function splitTime(steps: readonly StepRecord[], cost: StepCostSplit, untilMs: number): { numSteps: number; fixedMs: number; promptMs: number; decodeMs: number; numPromptTokens: number; numDecodeRows: number } {
  const before = steps.filter((step) => step.endMs <= untilMs);
  const numPromptTokens = before.reduce((sum, step) => sum + step.numPromptTokens, 0);
  const numDecodeRows = before.reduce((sum, step) => sum + step.numDecodeRows, 0);
  return {
    numSteps: before.length,
    fixedMs: before.length * cost.fixedMs,
    promptMs: numPromptTokens * cost.msPerPromptToken,
    decodeMs: numDecodeRows * cost.msPerDecodeRow,
    numPromptTokens,
    numDecodeRows,
  };
}
