// The compute ceiling of a prompt's prefill, for the benchmarks that report against it: the CPU's
// peak for the instruction the prefill's matmuls run (the kernel path a model loads with), the
// flops one prompt token costs (from the model's shape), the rate a forward pass achieves, and
// what that peak bounds: how soon the last prompts of a burst can have their first token.
//
// Both rates are on CPU time (each probe thread's own; the forward's process CPU time over its
// threads), so a neighbour's load on a shared machine lowers neither. A forward's pool threads
// poll while they wait for each other, so a thread preempted mid-pass shows as CPU time its
// partner spent polling: the achieved rate is the lower of the two, never flattered.
import type { KernelPath } from '../native/api.ts';
import { SEQ_SAMPLE } from '../native/api.ts';
import { loadModel, probes } from '../native/index.ts';
import { buildBatch } from '../native/test/helpers.ts';
import { percentileOfSorted } from '../loadtest/stats.ts';
import type { CheckpointOptions } from './make-checkpoint.ts';

/** What the flop count needs of a Llama-shaped model. */
export type ModelShape = Pick<CheckpointOptions, 'hiddenSize' | 'numLayers' | 'numHeads' | 'numKvHeads' | 'intermediateSize' | 'vocabSize'>;

/**
 * Flops per token of one numPromptTokens-token prompt computed whole: the layers' matmuls (q, k,
 * v, o, gate, up, down), causal attention (scores and value sums, 4 flops per head dim per
 * visible key, (n + 1) / 2 keys on average) and the LM head once, for the last token only.
 */
export function prefillFlopsPerToken(shape: ModelShape, numPromptTokens: number): number {
  const { hiddenSize: h, numLayers, numHeads, numKvHeads, intermediateSize: f, vocabSize } = shape;
  const kv = (numKvHeads * h) / numHeads;
  const layerWeights = numLayers * (2 * h * h + 2 * h * kv + 3 * h * f);
  const attention = numLayers * 4 * h * ((numPromptTokens + 1) / 2);
  return 2 * layerWeights + attention + (2 * vocabSize * h) / numPromptTokens;
}

const INSTRUCTIONS: Readonly<Record<Exclude<KernelPath, 'auto'>, string>> = {
  amx: 'AMX TDPBF16PS',
  avx512: 'AVX512_BF16 vdpbf16ps',
  avx2: 'AVX2 fp32 FMA',
  scalar: 'scalar',
};

export interface PrefillCeiling {
  /** The kernel path the model loaded with ('auto'), whose instruction the peak measures. */
  kernel: Exclude<KernelPath, 'auto'>;
  instruction: string;
  numThreads: number;
  /** Register-only loop of that instruction on every thread; NaN where no probe exists (scalar). */
  peakFlopsPerSecond: number;
  promptTokens: number;
  numPrompts: number;
  flopsPerToken: number;
  /** numPrompts prompts in one forward pass, best of the repeats, on CPU time / numThreads. */
  achievedTokensPerSecond: number;
  /** The same on the wall clock (what a quiet machine gives; the neighbours' load counts). */
  achievedWallTokensPerSecond: number;
}

/**
 * The peak of the instruction the model's prefill runs and the prefill rate it achieves:
 * numPrompts promptTokens-token prompts in one forward pass (a step of a burst), the best of
 * numRepeats after a warm-up. Blocks the event loop while the peak probe runs.
 */
export async function measurePrefillCeiling(
  modelDir: string, numThreads: number, { promptTokens, numPrompts, numRepeats = 5, shape }: { promptTokens: number; numPrompts: number; numRepeats?: number; shape: ModelShape },
): Promise<PrefillCeiling> {
  const blockSizeTokens = 16;
  const blocksPerPrompt = Math.ceil(promptTokens / blockSizeTokens);
  const model = await loadModel({
    modelDir, dtype: 'auto', kvCacheDtype: 'auto', numKvBlocks: numPrompts * blocksPerPrompt, blockSizeTokens, numThreads, kernel: 'auto',
  });
  try {
    const kernel = model.info.kernel;
    const peakFlopsPerSecond = kernel === 'scalar' ? Number.NaN : probes.peakFlopsPerSecond(kernel, numThreads);
    const batch = buildBatch(Array.from({ length: numPrompts }, (_, prompt) => ({
      tokenIds: Array.from({ length: promptTokens }, (_, i) => (prompt * 7919 + i * 104729) % shape.vocabSize),
      startPosition: 0,
      blockIds: Array.from({ length: blocksPerPrompt }, (_, i) => prompt * blocksPerPrompt + i),
      flags: SEQ_SAMPLE,
    })));
    await model.forward(batch);
    let bestCpuMs = Infinity;
    let bestWallMs = Infinity;
    for (let i = 0; i < numRepeats; i++) {
      const cpuBefore = process.cpuUsage();
      const wallBefore = performance.now();
      await model.forward(batch);
      bestWallMs = Math.min(bestWallMs, performance.now() - wallBefore);
      const cpu = process.cpuUsage(cpuBefore);
      bestCpuMs = Math.min(bestCpuMs, (cpu.user + cpu.system) / 1000 / numThreads);
    }
    const numTokens = numPrompts * promptTokens;
    return {
      kernel, instruction: INSTRUCTIONS[kernel], numThreads, peakFlopsPerSecond, promptTokens, numPrompts,
      flopsPerToken: prefillFlopsPerToken(shape, promptTokens),
      achievedTokensPerSecond: numTokens / (bestCpuMs / 1000),
      achievedWallTokensPerSecond: numTokens / (bestWallMs / 1000),
    };
  } finally {
    model.close();
  }
}

/** Prompt tokens per second if every prefill flop ran at the peak. */
export function peakPrefillTokensPerSecond(ceiling: PrefillCeiling): number {
  return ceiling.peakFlopsPerSecond / ceiling.flopsPerToken;
}

/**
 * A lower bound on the TTFT quantile q (0-1, as loadtest/stats.ts interpolates it) of numRequests
 * closed-loop requests from numClients clients whose first requests arrive together, every
 * prompt promptTokens long and computed at tokensPerSecond at best: whatever the order, the k-th
 * of the burst to get its first token waits for k prompts' compute; every later request for its
 * own at least. Decodes, the step's fixed cost and serving come on top.
 */
export function burstTtftBoundMs(numClients: number, numRequests: number, promptTokens: number, tokensPerSecond: number, q: number): number {
  const promptMs = (1000 * promptTokens) / tokensPerSecond;
  const bounds = [
    ...Array.from({ length: numClients }, (_, k) => (k + 1) * promptMs),
    ...Array.from({ length: Math.max(0, numRequests - numClients) }, () => promptMs),
  ].sort((a, b) => a - b);
  return percentileOfSorted(bounds, 100 * q);
}

/** One line: the peak, the achieved prefill rate and their ratio. */
export function describePrefillCeiling(ceiling: PrefillCeiling): string {
  const { numThreads, promptTokens, numPrompts, flopsPerToken } = ceiling;
  const achievedFlops = ceiling.achievedTokensPerSecond * flopsPerToken;
  const peak = Number.isNaN(ceiling.peakFlopsPerSecond)
    ? 'no peak probe for this path'
    : `${(ceiling.peakFlopsPerSecond / 1e9).toFixed(0)} GFLOP/s (${numThreads} threads, each on its CPU time) = ${peakPrefillTokensPerSecond(ceiling).toFixed(0)} prompt tok/s`;
  const ofPeak = Number.isNaN(ceiling.peakFlopsPerSecond) ? '' : ` = ${(100 * achievedFlops / ceiling.peakFlopsPerSecond).toFixed(0)} % of the peak`;
  return `compute peak, ${ceiling.kernel} (${ceiling.instruction}): ${peak}\n` +
    `prefill, ${numPrompts} x ${promptTokens}-token prompts in one forward pass, ${(flopsPerToken / 1e6).toFixed(1)} MFLOP per token (matmuls, attention, LM head): ` +
    `${ceiling.achievedTokensPerSecond.toFixed(0)} tok/s on CPU time / ${numThreads} threads (${ceiling.achievedWallTokensPerSecond.toFixed(0)} on the wall clock) = ` +
    `${(achievedFlops / 1e9).toFixed(0)} GFLOP/s${ofPeak}`;
}
