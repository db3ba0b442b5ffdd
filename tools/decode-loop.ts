// Greedy decode on the native runtime with one preallocated batch reused every step, so the
// JavaScript per step is no more than an engine's: shared by bench:decode and bench:native.
import { SEQ_SAMPLE, neutralSamplingExtensions, type ForwardBatch, type NativeModel } from '../native/api.ts';

export interface DecodeShape {
  numSeqs: number;
  numPromptTokens: number;
  numSteps: number;
}

/** KV blocks a decode of this shape needs, each sequence in its own blocks. */
export function decodeKvBlocks(shape: DecodeShape, blockSizeTokens: number): number {
  return shape.numSeqs * Math.ceil((shape.numPromptTokens + shape.numSteps + 1) / blockSizeTokens);
}

function makeBatch(model: NativeModel, shape: DecodeShape, numTokensPerSeq: number): ForwardBatch {
  const { numSeqs } = shape;
  const numTokens = numSeqs * numTokensPerSeq;
  const maxBlocksPerSeq = decodeKvBlocks({ ...shape, numSeqs: 1 }, model.info.blockSizeTokens);
  return {
    numSeqs,
    numTokens,
    tokenIds: new Int32Array(numTokens),
    positions: new Int32Array(numTokens),
    queryStarts: Int32Array.from({ length: numSeqs + 1 }, (_, i) => i * numTokensPerSeq),
    maxBlocksPerSeq,
    blockTables: Int32Array.from({ length: numSeqs * maxBlocksPerSeq }, (_, i) => i),
    seqFlags: new Uint8Array(numSeqs).fill(SEQ_SAMPLE),
    temperatures: new Float32Array(numSeqs),
    topPs: new Float32Array(numSeqs).fill(1),
    topKs: new Int32Array(numSeqs),
    seeds: new BigUint64Array(numSeqs),
    outputIndices: new Int32Array(numSeqs),
    ...neutralSamplingExtensions(numSeqs),
  };
}

/** Prefills each sequence's prompt, then returns the tok/s of numSteps greedy decode steps. */
export async function decodeTokensPerSecond(model: NativeModel, shape: DecodeShape): Promise<number> {
  const prefill = makeBatch(model, shape, shape.numPromptTokens);
  for (let i = 0; i < prefill.numTokens; i++) {
    prefill.tokenIds[i] = (i * 7919) % model.info.vocabSize;
    prefill.positions[i] = i % shape.numPromptTokens;
  }
  let result = await model.forward(prefill);
  const decode = makeBatch(model, shape, 1);
  const startNs = process.hrtime.bigint();
  for (let step = 0; step < shape.numSteps; step++) {
    decode.tokenIds.set(result.sampledTokenIds);
    decode.positions.fill(shape.numPromptTokens + step);
    decode.outputIndices.fill(step + 1);
    result = await model.forward(decode);
  }
  const seconds = Number(process.hrtime.bigint() - startNs) / 1e9;
  return (shape.numSeqs * shape.numSteps) / seconds;
}
