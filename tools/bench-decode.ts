// Decode throughput of one checkpoint straight on the native runtime (no server): tokens/s
// at batch 1 and batch 16 after a short prompt, greedy.
//   npm run bench:decode -- [--model DIR] [--threads N] [--steps N] [--dtype auto|fp32|bf16|fp16]
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';
import { loadModel } from '../native/index.ts';
import type { DtypeSetting } from '../native/api.ts';
import { decodeKvBlocks, decodeTokensPerSecond } from './decode-loop.ts';

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
const numSteps = Number(values.steps);
const blockSizeTokens = 16;
const batchSizes = [1, 16];

const model = await loadModel({
  modelDir: values.model!,
  dtype: values.dtype as DtypeSetting,
  kvCacheDtype: 'auto',
  numKvBlocks: decodeKvBlocks({ numSeqs: Math.max(...batchSizes), numPromptTokens, numSteps }, blockSizeTokens),
  blockSizeTokens,
  numThreads: Number(values.threads),
  kernel: 'auto',
});
const { info } = model;
console.log(`${path.basename(values.model!)}: ${info.architecture}, ${info.numLayers} layers, hidden ${info.hiddenSize}, ` +
  `vocab ${info.vocabSize}, ${info.dtype} weights, ${info.kernel} kernels, ${info.numThreads} threads`);
for (const numSeqs of batchSizes) {
  const tokensPerSecond = await decodeTokensPerSecond(model, { numSeqs, numPromptTokens, numSteps });
  console.log(`decode batch ${String(numSeqs).padStart(2)}: ${tokensPerSecond.toFixed(1)} tok/s`);
}
model.close();
