// What the engine loop needs from a model: one batched forward pass with sampling per step.
import type { RunnerResult, SchedulerOutput } from './scheduler-output.ts';

export interface RunnerInfo {
  numKvBlocks: number;
  blockSizeTokens: number;
  vocabSize: number;
  /** Longest prompt + output, in tokens. */
  maxModelLen: number;
}

export interface ModelRunner {
  readonly info: RunnerInfo;
  /** One call at a time; rejects when the step failed (the engine fails that step's requests). */
  execute(output: SchedulerOutput): Promise<RunnerResult>;
  close(): void;
}
