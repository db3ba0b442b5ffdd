// The model runner over the native runtime: lays a SchedulerOutput out as a ForwardBatch.
// The batch's typed arrays are sized once for the largest step the scheduler can produce
// (maxNumSeqs sequences, maxNumBatchedTokens tokens) and refilled in place every step.
import type { ForwardBatch, NativeModel } from '../native/api.ts';
import { SEQ_SAMPLE, neutralSamplingExtensions } from '../native/api.ts';
import type { ModelRunner, RunnerInfo } from './runner.ts';
import type { RunnerResult, SchedulerOutput } from './scheduler-output.ts';

export interface NativeRunnerLimits {
  maxModelLen: number;
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
}

export class NativeRunner implements ModelRunner {
  readonly info: RunnerInfo;
  private readonly model: NativeModel;
  private readonly batch: ForwardBatch;

  constructor(model: NativeModel, limits: NativeRunnerLimits) {
    const { numKvBlocks, blockSizeTokens, vocabSize } = model.info;
    const { maxModelLen, maxNumSeqs, maxNumBatchedTokens } = limits;
    this.model = model;
    this.info = { numKvBlocks, blockSizeTokens, vocabSize, maxModelLen };
    const maxBlocksPerSeq = Math.ceil(maxModelLen / blockSizeTokens);
    this.batch = {
      numSeqs: 0,
      numTokens: 0,
      tokenIds: new Int32Array(maxNumBatchedTokens),
      positions: new Int32Array(maxNumBatchedTokens),
      queryStarts: new Int32Array(maxNumSeqs + 1),
      maxBlocksPerSeq: 0,
      blockTables: new Int32Array(maxNumSeqs * maxBlocksPerSeq),
      seqFlags: new Uint8Array(maxNumSeqs),
      temperatures: new Float32Array(maxNumSeqs),
      topPs: new Float32Array(maxNumSeqs),
      topKs: new Int32Array(maxNumSeqs),
      seeds: new BigUint64Array(maxNumSeqs),
      outputIndices: new Int32Array(maxNumSeqs),
      // Until the engine sends min-p, penalties, bias or logprobs: set once, never refilled.
      ...neutralSamplingExtensions(maxNumSeqs),
    };
  }

  execute(output: SchedulerOutput): Promise<RunnerResult> {
    this.fill(output);
    return this.model.forward(this.batch);
  }

  close(): void {
    this.model.close();
  }

  private fill(output: SchedulerOutput): void {
    const { batch } = this;
    const { scheduled } = output;
    // Rows as wide as this step's longest block table, not maxModelLen's: less to fill and read.
    let maxBlocksPerSeq = 0;
    for (const entry of scheduled) maxBlocksPerSeq = Math.max(maxBlocksPerSeq, entry.blockIds.length);
    batch.numSeqs = scheduled.length;
    batch.numTokens = output.numScheduledTokens;
    batch.maxBlocksPerSeq = maxBlocksPerSeq;
    batch.blockTables.fill(-1, 0, scheduled.length * maxBlocksPerSeq);

    let tokenIndex = 0;
    for (let seq = 0; seq < scheduled.length; seq++) {
      const entry = scheduled[seq];
      batch.queryStarts[seq] = tokenIndex;
      const end = entry.startPosition + entry.numScheduledTokens;
      for (let position = entry.startPosition; position < end; position++, tokenIndex++) {
        batch.tokenIds[tokenIndex] = entry.tokenIds[position];
        batch.positions[tokenIndex] = position;
      }
      const row = seq * maxBlocksPerSeq;
      for (let block = 0; block < entry.blockIds.length; block++) batch.blockTables[row + block] = entry.blockIds[block];
      const { sampling } = entry;
      batch.seqFlags[seq] = entry.sample ? SEQ_SAMPLE : 0;
      batch.temperatures[seq] = sampling.temperature;
      batch.topPs[seq] = sampling.topP;
      batch.topKs[seq] = sampling.topK;
      batch.seeds[seq] = sampling.seed;
      batch.outputIndices[seq] = entry.numOutputTokens;
    }
    batch.queryStarts[scheduled.length] = tokenIndex;
  }
}
