// A tiny random checkpoint on the native runtime, for engine tests that run a real model.
import path from 'node:path';
import type { NativeModel } from '../../native/api.ts';
import { loadModel } from '../../native/index.ts';
import { DEFAULT_OPTIONS, writeRandomCheckpoint } from '../../tools/make-checkpoint.ts';
import type { StepBitmasks } from '../grammar/service.ts';
import type { ModelRunner } from '../runner.ts';
import type { SchedulerOutput } from '../scheduler-output.ts';

export const blockSizeTokens = 4;
export const TINY_VOCAB_SIZE = 256;
export const TINY_EOS = 2;

export function tinyCheckpoint(dir: string): string {
  const outDir = path.join(dir, 'tiny');
  writeRandomCheckpoint({
    ...DEFAULT_OPTIONS,
    outDir,
    hiddenSize: 64,
    numLayers: 2,
    numHeads: 4,
    numKvHeads: 2,
    intermediateSize: 128,
    vocabSize: TINY_VOCAB_SIZE,
    dtype: 'fp32',
    maxPositionEmbeddings: 128,
    seed: 7,
  });
  return outDir;
}

export function load(modelDir: string, numKvBlocks: number): Promise<NativeModel> {
  return loadModel({ modelDir, dtype: 'auto', kvCacheDtype: 'auto', numKvBlocks, blockSizeTokens, numThreads: 2, kernel: 'auto' });
}

/** Records every SchedulerOutput the engine runs, to show what the scheduler did. */
export class RecordingRunner implements ModelRunner {
  readonly steps: SchedulerOutput[] = [];
  /** The compute threads' count as each step began (activeThreadsCell), where there is one. */
  readonly activeThreadsAtStep: number[] = [];
  constructor(private readonly inner: ModelRunner) {}
  get info() {
    return this.inner.info;
  }
  get activeThreadsCell() {
    return this.inner.activeThreadsCell;
  }
  execute(output: SchedulerOutput, bitmasks?: StepBitmasks | null) {
    if (this.inner.activeThreadsCell !== undefined) this.activeThreadsAtStep.push(Atomics.load(this.inner.activeThreadsCell, 0));
    // The grammar gates are live objects of the engine: recorded as whether each was ready.
    this.steps.push(structuredClone({ ...output, scheduled: output.scheduled.map((entry) => ({ ...entry, grammar: entry.grammar === null ? null : { isReady: entry.grammar.isReady, stopTokenIds: [...entry.grammar.stopTokenIds], maySampleCompiling: entry.grammar.maySampleCompiling } })) }));
    return this.inner.execute(output, bitmasks);
  }
  close() {
    this.inner.close();
  }
}
