// bench:tp: tensor parallelism's cost and gain on the 125 M benchmark model (bf16): decode tok/s
// at batch 1 and 32 (a shared 128-token prompt, then 32 new tokens per sequence) at TP = 1 on
// 2 threads against TP = 2 on 1 thread per rank (two models joined by the shared-memory
// communicator in this process, as `conduit rank` processes are), and the time rank 0 spends in
// collectives per step (the all-gathers of o_proj's and down_proj's segment partials and of the
// LM head's vocabulary slices, the batch's broadcast, waiting for the other rank included).
// Rounds alternate the two; the table shows medians and the ratio's median of per-round ratios.
// On one NUMA node TP cannot be faster (the same cores and memory); the ratio is the overhead.
// Where the machine has several nodes each rank is pinned to its own, and the ratio is the gain.
//
//   npm run bench:tp [-- --rounds 3 --new-tokens 32]
import { parseArgs } from 'node:util';
import type { NativeModel } from '../native/api.ts';
import { SEQ_SAMPLE } from '../native/api.ts';
import { loadModel, type LoadedModel } from '../native/index.ts';
import { buildBatch } from '../native/test/helpers.ts';
import { startGroup } from '../native/test/tp-group.ts';
import { BENCH_SHAPE, describeCpu, ensureBenchCheckpoint } from './bench-model.ts';
import { median } from '../loadtest/stats.ts';

const PROMPT_TOKENS = 128;
const BLOCK_SIZE_TOKENS = 16;
const BATCH_SIZES = [1, 32];


/** Decode tok/s of numSeqs sequences sharing a prompt's blocks, and seconds in collectives per step. */
async function decode(model: NativeModel, collectiveSeconds: () => number, numSeqs: number, newTokens: number): Promise<{ tokensPerSecond: number; collectiveMsPerStep: number }> {
  const promptBlocks = PROMPT_TOKENS / BLOCK_SIZE_TOKENS;
  const ownBlocks = Math.ceil(newTokens / BLOCK_SIZE_TOKENS);
  const shared = Array.from({ length: promptBlocks }, (_, i) => i);
  const tables = Array.from({ length: numSeqs }, (_, seq) => [...shared, ...Array.from({ length: ownBlocks }, (_, i) => promptBlocks + seq * ownBlocks + i)]);
  const prompt = Array.from({ length: PROMPT_TOKENS - 1 }, (_, i) => (7919 + i * 104729) % BENCH_SHAPE.vocabSize);
  await model.forward(buildBatch([{ tokenIds: prompt, startPosition: 0, blockIds: tables[0], flags: SEQ_SAMPLE }]));
  let lastTokens = Array.from({ length: numSeqs }, (_, seq) => (seq * 31 + 5) % BENCH_SHAPE.vocabSize);
  const collectiveStart = collectiveSeconds();
  const start = performance.now();
  for (let step = 0; step < newTokens; step++) {
    const steps = lastTokens.map((tokenId, seq) => ({ tokenIds: [tokenId], startPosition: PROMPT_TOKENS - 1 + step, blockIds: tables[seq], flags: SEQ_SAMPLE }));
    lastTokens = Array.from((await model.forward(buildBatch(steps))).sampledTokenIds);
  }
  const seconds = (performance.now() - start) / 1000;
  return { tokensPerSecond: (numSeqs * newTokens) / seconds, collectiveMsPerStep: ((collectiveSeconds() - collectiveStart) * 1000) / newTokens };
}

async function main(): Promise<void> {
  const { values } = parseArgs({ options: { rounds: { type: 'string', default: '3' }, 'new-tokens': { type: 'string', default: '32' } } });
  const rounds = Number(values.rounds);
  const newTokens = Number(values['new-tokens']);
  const modelDir = ensureBenchCheckpoint();
  const numKvBlocks = PROMPT_TOKENS / BLOCK_SIZE_TOKENS + Math.max(...BATCH_SIZES) * Math.ceil(newTokens / BLOCK_SIZE_TOKENS);
  const options = { modelDir, dtype: 'bf16', kvCacheDtype: 'bf16', numKvBlocks, blockSizeTokens: BLOCK_SIZE_TOKENS, kernel: 'auto' } as const;
  console.log(`CPU: ${describeCpu()}`);
  console.log(`125 M model (bf16), ${PROMPT_TOKENS}-token shared prompt + ${newTokens} new tokens per sequence, ${rounds} alternating rounds`);
  const single: LoadedModel = await loadModel({ ...options, numThreads: 2 });
  const group = await startGroup({ ...options, numThreads: 1 }, 2);
  const node = group.model.numaNode;
  console.log(node === null ? 'one NUMA node: ranks not pinned (TP = 2 shares the cores and memory of TP = 1)' : `ranks pinned to NUMA nodes ${[group.model, ...group.ranks].map((m) => m.numaNode).join(', ')}`);
  const rows: string[] = [];
  try {
    for (const numSeqs of BATCH_SIZES) {
      const tp1: number[] = [];
      const tp2: number[] = [];
      const ratios: number[] = [];
      const collectiveMs: number[] = [];
      for (let round = 0; round < rounds; round++) {
        const a = await decode(single, () => 0, numSeqs, newTokens);
        const b = await decode(group.model, () => group.model.collectiveSeconds(), numSeqs, newTokens);
        tp1.push(a.tokensPerSecond);
        tp2.push(b.tokensPerSecond);
        ratios.push(b.tokensPerSecond / a.tokensPerSecond);
        collectiveMs.push(b.collectiveMsPerStep);
      }
      const stepMs = 1000 / (median(tp2) / numSeqs);
      rows.push(
        `| ${numSeqs} | ${median(tp1).toFixed(1)} | ${median(tp2).toFixed(1)} | ${median(ratios).toFixed(2)} | ${median(collectiveMs).toFixed(2)} ms (${((median(collectiveMs) / stepMs) * 100).toFixed(0)}% of a step) |`,
      );
    }
  } finally {
    single.close();
    await group.close();
  }
  console.log('| batch | TP 1, 2 threads (tok/s) | TP 2, 1 thread per rank (tok/s) | TP 2 / TP 1 | rank 0 in collectives per step |');
  console.log('| --- | --- | --- | --- | --- |');
  for (const row of rows) console.log(row);
  console.log('target on one NUMA node: TP 2 / TP 1 >= 0.85');
}

await main();
