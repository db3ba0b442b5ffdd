// Decode throughput of one checkpoint straight on the native runtime (no server): tokens/s
// at batch 1 and batch 16 after a short prompt, greedy.
//   npm run bench:decode -- [--model DIR] [--threads N] [--steps N] [--dtype auto|fp32|bf16|fp16]
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';
import { loadModel } from '../native/index.ts';
import { SEQ_SAMPLE, type ForwardBatch, type NativeModel, type DtypeSetting } from '../native/api.ts';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const { values } = parseArgs({
  options: {
    model: { type: 'string', default: path.join(repoRoot, 'models', 'conduit-tiny') },
    threads: { type: 'string', default: String(os.availableParallelism()) },
    steps: { type: 'string', default: '64' },
    dtype: { type: 'string', default: 'auto' },
  },
});
const numPromptTokens = 16;
const numDecodeSteps = Number(values.steps);
const blockSizeTokens = 16;
const batchSizes = [1, 16];
const maxBlocksPerSeq = Math.ceil((numPromptTokens + numDecodeSteps + 1) / blockSizeTokens);

function makeBatch(numSeqs: number, numTokensPerSeq: number): ForwardBatch {
  const numTokens = numSeqs * numTokensPerSeq;
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
  };
}

async function decodeTokensPerSecond(model: NativeModel, numSeqs: number): Promise<number> {
  const prefill = makeBatch(numSeqs, numPromptTokens);
  for (let i = 0; i < prefill.numTokens; i++) {
    prefill.tokenIds[i] = (i * 7919) % model.info.vocabSize;
    prefill.positions[i] = i % numPromptTokens;
  }
  let result = await model.forward(prefill);
  const decode = makeBatch(numSeqs, 1);
  const startNs = process.hrtime.bigint();
  for (let step = 0; step < numDecodeSteps; step++) {
    decode.tokenIds.set(result.sampledTokenIds);
    decode.positions.fill(numPromptTokens + step);
    decode.outputIndices.fill(step + 1);
    result = await model.forward(decode);
  }
  const seconds = Number(process.hrtime.bigint() - startNs) / 1e9;
  return (numSeqs * numDecodeSteps) / seconds;
}

const model = await loadModel({
  modelDir: values.model!,
  dtype: values.dtype as DtypeSetting,
  kvCacheDtype: 'auto',
  numKvBlocks: Math.max(...batchSizes) * maxBlocksPerSeq,
  blockSizeTokens,
  numThreads: Number(values.threads),
  kernel: 'auto',
});
const { info } = model;
console.log(`${path.basename(values.model!)}: ${info.architecture}, ${info.numLayers} layers, hidden ${info.hiddenSize}, ` +
  `vocab ${info.vocabSize}, ${info.dtype} weights, ${info.kernel} kernels, ${info.numThreads} threads`);
for (const numSeqs of batchSizes) {
  const tokensPerSecond = await decodeTokensPerSecond(model, numSeqs);
  console.log(`decode batch ${String(numSeqs).padStart(2)}: ${tokensPerSecond.toFixed(1)} tok/s`);
}
model.close();
