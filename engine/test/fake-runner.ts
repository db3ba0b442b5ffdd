// A model runner for engine tests: scripted tokens instead of a model, and a simulated paged
// KV cache that proves the block tables right. Each step writes every computed token id into
// its slot; a sampled sequence must read its whole history back through its block table, so a
// block shared by two live sequences, or a position never recomputed after preemption, fails.
import type { ModelRunner, RunnerInfo } from '../runner.ts';
import type { RunnerResult, ScheduledSequence, SchedulerOutput } from '../scheduler-output.ts';

/** The token a sequence samples next; the default counts 100, 101, ... per request. */
export type TokenScript = (entry: ScheduledSequence) => number;

export class FakeRunner implements ModelRunner {
  readonly info: RunnerInfo;
  readonly steps: SchedulerOutput[] = [];
  /** Makes the next execute() reject with this message. */
  failNextWith: string | null = null;
  /** Awaited at the start of every step, so a test can hold the engine between steps. */
  beforeStep: (() => Promise<void>) | null = null;
  closed = false;
  private readonly slots: Int32Array;
  private readonly script: TokenScript;

  constructor(info: RunnerInfo, script: TokenScript = (entry) => 100 + entry.numOutputTokens) {
    this.info = info;
    this.script = script;
    this.slots = new Int32Array(info.numKvBlocks * info.blockSizeTokens).fill(-1);
  }

  async execute(output: SchedulerOutput): Promise<RunnerResult> {
    await this.beforeStep?.();
    // Snapshot what the runner saw: the entries borrow the scheduler's arrays.
    this.steps.push(structuredClone(output));
    if (this.failNextWith !== null) {
      const message = this.failNextWith;
      this.failNextWith = null;
      throw new Error(message);
    }
    const numSeqs = output.scheduled.length;
    const result = { sampledTokenIds: new Int32Array(numSeqs).fill(-1), sampledLogprobs: new Float32Array(numSeqs) };
    for (const [index, entry] of output.scheduled.entries()) {
      const end = entry.startPosition + entry.numScheduledTokens;
      for (let position = entry.startPosition; position < end; position++) {
        this.slots[this.slotOf(entry, position)] = entry.tokenIds[position];
      }
      if (!entry.sample) continue;
      for (let position = 0; position < end; position++) {
        const cached = this.slots[this.slotOf(entry, position)];
        if (cached !== entry.tokenIds[position]) {
          throw new Error(`${entry.requestId}: KV slot of position ${position} holds ${cached}, not ${entry.tokenIds[position]}`);
        }
      }
      result.sampledTokenIds[index] = this.script(entry);
      result.sampledLogprobs[index] = -0.5;
    }
    return result;
  }

  close(): void {
    this.closed = true;
  }

  private slotOf(entry: ScheduledSequence, position: number): number {
    const { blockSizeTokens } = this.info;
    const blockId = entry.blockIds[Math.floor(position / blockSizeTokens)];
    if (blockId === undefined) throw new Error(`${entry.requestId}: no block for position ${position}`);
    return blockId * blockSizeTokens + (position % blockSizeTokens);
  }
}
