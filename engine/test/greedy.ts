// Greedy decoding two ways, for engine tests on a real checkpoint: step by step with hand-built
// batches (the reference: each prompt alone, every KV group its own blocks for every position,
// nothing freed, no cache), and through an engine.
import type { ForwardBatch, NativeModel } from '../../native/api.ts';
import { SEQ_SAMPLE, neutralSamplingExtensions } from '../../native/api.ts';
import type { Engine } from '../engine.ts';
import type { RequestOutput, SamplingParams } from '../types.ts';

/** The whole prompt in one call, then one token per call, numOutputTokens sampled greedily. */
export async function referenceDecode(
  model: NativeModel,
  prompt: readonly number[],
  numOutputTokens: number,
  blockSizeTokens: number,
): Promise<number[]> {
  const numGroups = model.info.kvCacheGroups.length;
  const maxBlocksPerSeq = Math.ceil((prompt.length + numOutputTokens) / blockSizeTokens);
  const tokens = prompt.slice();
  const outputs: number[] = [];
  for (let start = 0; outputs.length < numOutputTokens; start = tokens.length - 1) {
    const numTokens = tokens.length - start;
    const batch: ForwardBatch = {
      numSeqs: 1,
      numTokens,
      tokenIds: Int32Array.from(tokens.slice(start)),
      positions: Int32Array.from({ length: numTokens }, (_, i) => start + i),
      queryStarts: Int32Array.of(0, numTokens),
      maxBlocksPerSeq,
      blockTables: Int32Array.from({ length: numGroups * maxBlocksPerSeq }, (_, i) => i),
      seqFlags: Uint8Array.of(SEQ_SAMPLE),
      temperatures: Float32Array.of(0),
      topPs: Float32Array.of(1),
      topKs: Int32Array.of(0),
      seeds: BigUint64Array.of(0n),
      outputIndices: Int32Array.of(outputs.length),
      ...neutralSamplingExtensions(1),
    };
    const tokenId = (await model.forward(batch)).sampledTokenIds[0];
    outputs.push(tokenId);
    tokens.push(tokenId);
  }
  return outputs;
}

/** One request through the engine, ignoring EOS until maxTokens: its last output and every token. */
export function generate(
  engine: Engine,
  requestId: string,
  prompt: number[],
  maxTokens: number,
  sampling: SamplingParams = { temperature: 0 },
): Promise<RequestOutput & { tokens: number[] }> {
  return new Promise((resolve, reject) => {
    const tokens: number[] = [];
    engine.generate({ requestId, promptTokenIds: prompt, sampling: { ...sampling, maxTokens, ignoreEos: true } }, (output) => {
      tokens.push(...output.newTokenIds);
      if (output.finishReason === 'length') resolve({ ...output, tokens });
      else if (output.finishReason !== null) reject(new Error(`${requestId}: ${output.finishReason} ${output.error?.message}`));
    });
  });
}
