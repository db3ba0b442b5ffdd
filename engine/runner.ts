// What the engine loop needs from a model: one batched forward pass with sampling per step.
import type { StepBitmasks } from './grammar/service.ts';
import type { KvGroup } from './kv/kv-cache-manager.ts';
import type { RunnerResult, SchedulerOutput } from './scheduler-output.ts';

export interface RunnerInfo {
  numKvBlocks: number;
  blockSizeTokens: number;
  /** The model's KV-cache groups, each with its own block table; one full-attention group when absent. */
  kvCacheGroups?: readonly KvGroup[];
  vocabSize: number;
  /** Longest prompt + output, in tokens. */
  maxModelLen: number;
  /** The CPU threads that compute a step, which execute() may lower; absent where a step has none to lower. */
  numComputeThreads?: number;
}

export interface ModelRunner {
  readonly info: RunnerInfo;
  /**
   * One call at a time; rejects when the step failed (the engine fails that step's requests).
   * bitmasks restrict the samples of structured outputs (rows perhaps still being written).
   */
  execute(output: SchedulerOutput, bitmasks?: StepBitmasks | null): Promise<RunnerResult>;
  /**
   * The cell (over a SharedArrayBuffer) holding how many compute threads run steps
   * (1 .. info.numComputeThreads; anything else all), which any thread may store to, also while a
   * step runs, whose next op follows it (NativeModel.activeThreadsCell). The results are the same
   * whatever it is. Absent: the runner keeps its threads.
   */
  readonly activeThreadsCell?: Int32Array;
  close(): void;
}
