// The native runtime's CPU benchmark, on any x86-64 CPU with AVX2. It names the CPU, then
// measures the machine: streaming-read bandwidth, each kernel path's multiply-add ceiling (the
// AMX TDPBF16PS peak for amx, the AVX512_BF16 dot-product peak for avx512, the AVX2 fp32 FMA peak for avx2) and the thread
// pool's hand-off (the wake-up latency it measures at start, one call between polling threads).
// A thread-scaling row follows: batch-1 decode on 1 thread against all threads, for conduit-tiny
// and the 125 M model. Then for bf16, fp32 and int8 weights (and with --modes, int4, and the
// model as Q8_0 and Q4_K GGUF files with llama.cpp's llama-bench on the same files) on each
// kernel path the CPU has:
// matmul GFLOP/s at decode and prefill shapes, decode tok/s at batch 1, 8 and 32 (128-token
// prompts + 128 new tokens each) and 512-token prefill tok/s, each as a fraction of its path's
// ceiling measured in the same run. Absolute speeds on shared machines drift from run to run;
// the fractions are what compare.
//
//   npm run bench:native [-- --threads 2 --new-tokens 128 --kernels amx,avx512,avx2 --modes bf16,fp32,int8,int4,Q8_0,Q4_K --rounds 3
//                          --llama-bench PATH]
//
// amx differs from avx512 in its bf16 and int8 matmuls alone, so it runs those modes, and a line
// per mode compares it with avx512 from the same run (prefill, batch-32 and batch-1 decode). On a
// CPU without AMX it says so.
//
// Decode and prefill run in rounds, the modes taking turns; the table shows medians.
//
// The 125 M-parameter checkpoint (tools/bench-model.ts) is written under .bench/ on first use.
import { existsSync, mkdtempSync, readFileSync, renameSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import type { KernelPath, NativeModel, Quantization, WeightDtype } from '../native/api.ts';
import { SEQ_RETURN_LOGITS, SEQ_SAMPLE } from '../native/api.ts';
import { kernelSupported, loadModel, probes } from '../native/index.ts';
import { buildBatch } from '../native/test/helpers.ts';
import { relativeError } from '../test/reference/llama-reference.ts';
import { decodeKvBlocks, decodeTokensPerSecond } from './decode-loop.ts';
import { BENCH_SHAPE, describeCpu, ensureBenchCheckpoint, writeServableBenchModel } from './bench-model.ts';
import { median } from '../loadtest/stats.ts';
import { pairedRatios, runLlamaBench, type LlamaBenchFigures } from './llama-bench.ts';
import { writeLlamaGguf } from './llama-gguf.ts';
import { prefillFlopsPerToken as flopsPerPromptToken } from './prefill-ceiling.ts';

const HEAD_DIM = BENCH_SHAPE.hiddenSize / BENCH_SHAPE.numHeads;
const BLOCK_SIZE_TOKENS = 16;
const PROMPT_TOKENS = 128;
const PREFILL_TOKENS = 512;
const BATCH_SIZES = [1, 8, 32] as const;
const STREAM_BUFFER_BYTES = 1 << 30;
/** llama-bench's tg128: tokens decoded at batch 1 from an empty context. */
const LLAMA_TG_TOKENS = 128;

interface Mode {
  label: string;
  dtype: WeightDtype;
  quantization: Quantization;
  /** Bytes a matmul reads per weight, in the runtime's layout. */
  bytesPerWeight: number;
  /** The matmul probe's format for this mode. */
  probeQuantization: Quantization;
  /** A GGUF of the 125 M model with its matrices of this type (tools/llama-gguf.ts), and that type's bytes per weight. */
  gguf?: { type: 'Q8_0' | 'Q4_K'; fileBytesPerWeight: number };
}

const MODES: readonly Mode[] = [
  { label: 'bf16', dtype: 'bf16', quantization: 'none', bytesPerWeight: 2, probeQuantization: 'none' },
  { label: 'fp32', dtype: 'fp32', quantization: 'none', bytesPerWeight: 4, probeQuantization: 'none' },
  // 32 int8 values and one fp16 scale per block.
  { label: 'int8', dtype: 'bf16', quantization: 'int8', bytesPerWeight: 34 / 32, probeQuantization: 'int8' },
  // 32 4-bit codes, an fp32 scale and an fp32 min per block.
  { label: 'int4', dtype: 'bf16', quantization: 'int4', bytesPerWeight: 24 / 32, probeQuantization: 'int4' },
  // Q8_0 blocks load as int8 panels, Q4_K blocks as Q4_K (native/README.md); Q4_K-int4 is the same
  // file as 4-bit panels of fp32 scale and min (the layout Q4_K had before), the A/B of the two.
  // The matmul probe has no Q4_K format: its gemv/gemm columns are kQ4Panels'.
  { label: 'Q8_0', dtype: 'bf16', quantization: 'none', bytesPerWeight: 34 / 32, probeQuantization: 'int8', gguf: { type: 'Q8_0', fileBytesPerWeight: 34 / 32 } },
  { label: 'Q4_K', dtype: 'bf16', quantization: 'none', bytesPerWeight: 144 / 256, probeQuantization: 'int4', gguf: { type: 'Q4_K', fileBytesPerWeight: 144 / 256 } },
  { label: 'Q4_K-int4', dtype: 'bf16', quantization: 'int4', bytesPerWeight: 24 / 32, probeQuantization: 'int4', gguf: { type: 'Q4_K', fileBytesPerWeight: 144 / 256 } },
];

/** The 125 M model as a GGUF of type under .bench/ (with conduit-tiny's tokenizer, for llama.cpp), written on first use. */
function ensureBenchGguf(type: 'Q8_0' | 'Q4_K'): string {
  const file = path.resolve('.bench', `llama-125m-${type}.gguf`);
  if (existsSync(file)) return file;
  const scratch = mkdtempSync(path.join(os.tmpdir(), 'conduit-bench-gguf-'));
  try {
    writeLlamaGguf(writeServableBenchModel(scratch, 'llama-125m'), `${file}.partial`, { matrixType: type });
    renameSync(`${file}.partial`, file);
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
  return file;
}

/** Weights every decoded token multiplies: the layers' matrices and the LM head (not the embedding table). */
function matmulWeightsPerToken(): number {
  return layerWeightsPerToken() + BENCH_SHAPE.vocabSize * BENCH_SHAPE.hiddenSize;
}

function layerWeightsPerToken(): number {
  const { hiddenSize: h, numLayers, numKvHeads, intermediateSize: f } = BENCH_SHAPE;
  const kv = numKvHeads * HEAD_DIM;
  return numLayers * (2 * h * h + 2 * h * kv + 3 * h * f);
}

/** Flops per decoded token: the matmuls and attention over the average context of a decode of newTokens after the prompt. */
function decodeFlopsPerToken(newTokens: number): number {
  const averageContext = PROMPT_TOKENS + newTokens / 2;
  return 2 * matmulWeightsPerToken() + BENCH_SHAPE.numLayers * 4 * BENCH_SHAPE.hiddenSize * averageContext;
}

/** Flops per token of a PREFILL_TOKENS-token prefill (prefill-ceiling.ts counts them). */
function prefillFlopsPerToken(): number {
  return flopsPerPromptToken(BENCH_SHAPE, PREFILL_TOKENS);
}

function promptTokens(count: number, salt: number): number[] {
  return Array.from({ length: count }, (_, i) => (salt * 7919 + i * 104729) % BENCH_SHAPE.vocabSize);
}

/**
 * numSeqs sequences share one 128-token prompt (its blocks, as prefix caching shares them),
 * then each decodes newTokens greedily from its own first token. Returns decode tok/s.
 */
async function sharedPromptDecodeTokensPerSecond(model: NativeModel, numSeqs: number, newTokens: number): Promise<number> {
  const { vocabSize } = model.info;
  const promptBlocks = PROMPT_TOKENS / BLOCK_SIZE_TOKENS;
  const ownBlocks = Math.ceil(newTokens / BLOCK_SIZE_TOKENS);
  const shared = Array.from({ length: promptBlocks }, (_, i) => i);
  const blockTables = Array.from({ length: numSeqs }, (_, seq) => [
    ...shared,
    ...Array.from({ length: ownBlocks }, (_, i) => promptBlocks + seq * ownBlocks + i),
  ]);
  const prompt = promptTokens(PROMPT_TOKENS - 1, 1).map((tokenId) => tokenId % vocabSize);
  await model.forward(buildBatch([{ tokenIds: prompt, startPosition: 0, blockIds: blockTables[0], flags: SEQ_SAMPLE }]));
  let lastTokens = Array.from({ length: numSeqs }, (_, seq) => (seq * 31 + 5) % vocabSize);
  const start = performance.now();
  for (let step = 0; step < newTokens; step++) {
    const steps = lastTokens.map((tokenId, seq) => ({
      tokenIds: [tokenId],
      startPosition: PROMPT_TOKENS - 1 + step,
      blockIds: blockTables[seq],
      flags: SEQ_SAMPLE,
    }));
    const result = await model.forward(buildBatch(steps));
    lastTokens = Array.from(result.sampledTokenIds);
  }
  return (numSeqs * newTokens) / ((performance.now() - start) / 1000);
}

async function prefillTokensPerSecond(model: NativeModel, numRepeats: number): Promise<number> {
  const blockIds = Array.from({ length: PREFILL_TOKENS / BLOCK_SIZE_TOKENS }, (_, i) => i);
  const batch = buildBatch([{ tokenIds: promptTokens(PREFILL_TOKENS, 2), startPosition: 0, blockIds, flags: SEQ_SAMPLE }]);
  await model.forward(batch);
  let best = Infinity;
  for (let i = 0; i < numRepeats; i++) {
    const start = performance.now();
    await model.forward(batch);
    best = Math.min(best, performance.now() - start);
  }
  return PREFILL_TOKENS / (best / 1000);
}

/** Last-position logits of a 64-token prompt: the foundation's error metric compares these. */
async function promptLogits(modelDir: string, kernel: KernelPath, mode: Mode, numThreads: number): Promise<Float32Array> {
  const model = await loadModel({
    modelDir, dtype: mode.dtype, quantization: mode.quantization, kvCacheDtype: 'fp32',
    numKvBlocks: 4, blockSizeTokens: BLOCK_SIZE_TOKENS, numThreads, kernel,
  });
  try {
    const batch = buildBatch([{ tokenIds: promptTokens(64, 3), startPosition: 0, blockIds: [0, 1, 2, 3], flags: SEQ_RETURN_LOGITS }]);
    return (await model.forward(batch)).logits;
  } finally {
    model.close();
  }
}

/**
 * Batch-1 decode of a checkpoint on 1 thread and on numThreads, one model loaded for each, in
 * alternating rounds: the medians and the median of the rounds' ratios.
 */
async function threadScaling(modelDir: string, numSteps: number, kernel: KernelPath, numThreads: number, numRounds: number) {
  const shape = { numSeqs: 1, numPromptTokens: 16, numSteps };
  const load = (threads: number) => loadModel({
    modelDir, dtype: 'bf16', kvCacheDtype: 'bf16', numKvBlocks: decodeKvBlocks(shape, BLOCK_SIZE_TOKENS),
    blockSizeTokens: BLOCK_SIZE_TOKENS, numThreads: threads, kernel,
  });
  const [one, all] = [await load(1), await load(numThreads)];
  try {
    const [oneRates, allRates]: number[][] = [[], []];
    for (let round = 0; round < numRounds; round++) {
      oneRates.push(await decodeTokensPerSecond(one, shape));
      allRates.push(await decodeTokensPerSecond(all, shape));
    }
    return { one: median(oneRates), all: median(allRates), ratio: median(allRates.map((rate, round) => rate / oneRates[round])) };
  } finally {
    one.close();
    all.close();
  }
}

/** Whether the amx path runs here, and if not why, as far as the CPU's flags tell. */
function amxStatus(): string {
  if (kernelSupported('amx')) return 'AMX tiles granted by the OS; bf16 matmuls of 2+ rows run on TDPBF16PS';
  let flags = '';
  try {
    flags = readFileSync('/proc/cpuinfo', 'utf8');
  } catch {
    return 'not available (no /proc/cpuinfo)';
  }
  if (!/^flags\s*:.*\bamx_tile\b/m.test(flags)) return 'CPU has no AMX (no amx_tile flag): the amx rows and the amx / avx512 ratios need an AMX machine';
  return 'the CPU has AMX but the runtime cannot use it (the OS refused the tile state, or no AVX512_BF16; the runtime logs why)';
}

interface BenchRow {
  kernel: KernelPath;
  mode: Mode;
  decode: number[];
  prefill: number;
}

/** The issue's figures: amx against avx512 in one weight mode, both from this run. */
function amxAgainstAvx512(results: readonly BenchRow[], label: string, amxPeak: number, bandwidth: number, weightsPerToken: number): string {
  const find = (kernel: KernelPath) => results.find((r) => r.kernel === kernel && r.mode.label === label);
  const [amx, avx512] = [find('amx'), find('avx512')];
  if (amx === undefined || avx512 === undefined) {
    return `amx vs avx512 (${label}): ${amx === undefined ? 'no AMX on this CPU' : 'avx512 not measured'}; nothing to compare`;
  }
  const b32Bound = (32 * bandwidth) / (weightsPerToken * amx.mode.bytesPerWeight);
  return `amx vs avx512 (${label}, same run): ${PREFILL_TOKENS}-token prefill ${fmt(amx.prefill)} vs ${fmt(avx512.prefill)} tok/s = ${fmt(amx.prefill / avx512.prefill, 2)}x ` +
    `(${pct((amx.prefill * prefillFlopsPerToken()) / amxPeak)} of the AMX ceiling); ` +
    `batch-32 decode ${fmt(amx.decode[2])} vs ${fmt(avx512.decode[2])} tok/s = ${fmt(amx.decode[2] / avx512.decode[2], 2)}x ` +
    `(${pct(amx.decode[2] / b32Bound)} of the read-bandwidth bound for 32 rows, ${fmt(b32Bound)} tok/s); ` +
    `batch-1 decode ${fmt(amx.decode[0])} vs ${fmt(avx512.decode[0])} tok/s = ${fmt(amx.decode[0] / avx512.decode[0], 2)}x`;
}

const matmulFlops = (numRows: number): number => 2 * numRows * BENCH_SHAPE.hiddenSize * BENCH_SHAPE.intermediateSize;

const fmt = (value: number, digits = 1): string => value.toFixed(digits);
const pct = (fraction: number): string => `${(fraction * 100).toFixed(0)}%`;

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      threads: { type: 'string', default: '2' },
      'new-tokens': { type: 'string', default: '128' },
      kernels: { type: 'string', default: 'amx,avx512,avx2' },
      modes: { type: 'string', default: MODES.map((mode) => mode.label).join(',') },
      rounds: { type: 'string', default: '3' },
      'llama-bench': { type: 'string', default: '/tmp/llamacpp-36/build/bin/llama-bench' },
    },
  });
  const kernelNames = values.kernels.split(',');
  const modeLabels = values.modes.split(',');
  const numThreads = Number(values.threads);
  const newTokens = Number(values['new-tokens']);
  const numRounds = Number(values.rounds);
  const kernels = (['amx', 'avx512', 'avx2'] as const).filter((kernel) => kernelNames.includes(kernel) && kernelSupported(kernel));
  console.log(`CPU: ${describeCpu()}`);
  if (!kernelSupported('avx2')) throw new Error('bench:native measures x86-64 CPUs with AVX2, FMA and F16C; this CPU lacks them');
  const unavailable = kernelNames.filter((kernel) => !kernels.includes(kernel as (typeof kernels)[number]));
  console.log(`kernel paths: ${kernels.join(', ')}${unavailable.length > 0 ? ` (not on this CPU: ${unavailable.join(', ')})` : ''}`);
  if (kernelNames.includes('amx')) console.log(`amx: ${amxStatus()}`);
  const modelDir = ensureBenchCheckpoint();
  const started = performance.now();

  const bandwidth = probes.streamReadBytesPerSecond(STREAM_BUFFER_BYTES, numThreads, 5);
  const peaks = new Map(kernels.map((kernel) => [kernel, probes.peakFlopsPerSecond(kernel, numThreads)]));
  const handoff = probes.threadHandoff(numThreads, 20000);
  const weightsPerToken = matmulWeightsPerToken();
  const flopsPerToken = 2 * weightsPerToken;
  const ceilingName = (kernel: KernelPath) =>
    kernel === 'amx' ? 'AMX TDPBF16PS peak' : kernel === 'avx512' ? 'AVX512_BF16 dot peak' : 'AVX2 fp32 FMA peak';
  console.log(`threads ${numThreads}; streaming read ${fmt(bandwidth / 1e9)} GB/s; ` +
    kernels.map((kernel) => `${kernel} ceiling (${ceilingName(kernel)}) ${fmt(peaks.get(kernel)! / 1e9)} GFLOP/s`).join('; '));
  console.log(`thread hand-off: wake-up ${fmt(handoff.wakeLatencyNs / 1e3)} us (measured as the pool starts), ` +
    `a call between polling threads ${fmt(handoff.callNs / 1e3, 2)} us`);
  console.log(`model: ${fmt(weightsPerToken / 1e6)} M matmul weights per decoded token (${fmt(flopsPerToken / 1e6)} MFLOP); ` +
    `a ${PREFILL_TOKENS}-token prefill ${fmt(prefillFlopsPerToken() / 1e6)} MFLOP per token\n`);

  // Thread scaling: batch-1 decode after a 16-token prompt, as bench:decode runs it.
  const tinyDir = path.resolve('models', 'conduit-tiny');
  for (const kernel of kernels.filter((path) => path !== 'amx')) {
    // A step of conduit-tiny takes a fraction of a millisecond and the machine's speed drifts
    // within seconds: many short rounds, taking turns.
    for (const [name, dir, numSteps] of [['conduit-tiny', tinyDir, 512], ['125M', modelDir, 64]] as const) {
      const { one, all, ratio } = await threadScaling(dir, numSteps, kernel, numThreads, 2 * numRounds + 1);
      console.log(`thread scaling, ${kernel}, ${name} bf16 batch-1 decode: 1 thread ${fmt(one)} tok/s, ` +
        `${numThreads} threads ${fmt(all)} tok/s, ${fmt(ratio, 2)}x (median of the rounds' ratios)`);
    }
  }
  console.log('');

  interface ModeResult {
    kernel: (typeof kernels)[number];
    mode: Mode;
    gemvSeconds: number;
    gemmSeconds: number;
    decode: number[];  // tok/s at BATCH_SIZES
    prefill: number;
    /** tok/s of llama-bench's tg128 work (GGUF modes): 128 tokens decoded from an empty context. */
    tg128: number | null;
    /** Each round's batch-1 decode, prefill and tg128-work tok/s, in round order (for the side-by-side's pairs). */
    rounds: { b1: number[]; prefill: number[]; tg128: number[] };
  }
  const results: ModeResult[] = [];
  const int8OverBf16: Partial<Record<KernelPath, number>> = {};
  const allModes = MODES.filter((m) => modeLabels.includes(m.label));
  // llama.cpp on the very GGUF files (its own build: --llama-bench PATH), one repetition of pp512
  // and tg128 per file after each of our rounds: the host's bandwidth moves by tens of percent
  // within minutes, so only figures of the same minutes make a ratio. Keyed `${kernel} ${type}`.
  const llamaBin = values['llama-bench'];
  const ggufTypes = [...new Set(allModes.flatMap((mode) => (mode.gguf ? [mode.gguf.type] : [])))];
  const runLlama = ggufTypes.length > 0 && existsSync(llamaBin);
  const llamaRounds = new Map<string, LlamaBenchFigures[]>();
  for (const kernel of kernels) {
    const modes = kernel === 'amx' ? allModes.filter((mode) => mode.label !== 'fp32') : allModes;
    // The matmul probes first, on a quiet process: measured after the decode rounds, with the
    // models resident, they read about half as fast.
    const matmulProbes = new Map(modes.map((mode) => {
      const seconds = (numRows: number) =>
        probes.matmulSeconds({ kernel, dtype: mode.dtype, quantization: mode.probeQuantization, numRows, k: BENCH_SHAPE.hiddenSize, n: BENCH_SHAPE.intermediateSize, numThreads, numRepeats: 5 });
      return [mode, { gemvSeconds: seconds(1), gemmSeconds: seconds(PREFILL_TOKENS) }];
    }));
    const models = new Map<Mode, NativeModel>();
    try {
      for (const mode of modes) {
        models.set(mode, await loadModel({
          modelDir: mode.gguf ? ensureBenchGguf(mode.gguf.type) : modelDir, dtype: mode.dtype, quantization: mode.quantization, kvCacheDtype: 'bf16',
          numKvBlocks: PROMPT_TOKENS / BLOCK_SIZE_TOKENS + 32 * Math.ceil(newTokens / BLOCK_SIZE_TOKENS) + PREFILL_TOKENS / BLOCK_SIZE_TOKENS,
          blockSizeTokens: BLOCK_SIZE_TOKENS, numThreads, kernel,
        }));
      }
      // The modes take turns, round after round, and report medians: the machine's speed drifts
      // within a run, and a ratio between modes (taken per round) should not measure the drift.
      const decodeRounds = new Map(modes.map((mode) => [mode, BATCH_SIZES.map((): number[] => [])]));
      const prefillRounds = new Map(modes.map((mode): [Mode, number[]] => [mode, []]));
      // llama-bench's tg128 decodes 128 tokens from an empty context; the GGUF modes also run that
      // very work, for the side-by-side (the b1 column decodes after a 128-token prompt).
      const tg128Rounds = new Map(modes.map((mode): [Mode, number[]] => [mode, []]));
      // Innermost the modes, so that a round's measurements of one batch size sit seconds apart.
      for (let round = 0; round < numRounds; round++) {
        for (const [i, numSeqs] of BATCH_SIZES.entries()) {
          for (const mode of modes) decodeRounds.get(mode)![i].push(await sharedPromptDecodeTokensPerSecond(models.get(mode)!, numSeqs, newTokens));
        }
        for (const mode of modes) prefillRounds.get(mode)!.push(await prefillTokensPerSecond(models.get(mode)!, 1));
        for (const mode of modes.filter((m) => m.gguf !== undefined)) {
          tg128Rounds.get(mode)!.push(await decodeTokensPerSecond(models.get(mode)!, { numSeqs: 1, numPromptTokens: 1, numSteps: LLAMA_TG_TOKENS }));
        }
        if (!runLlama) continue;
        for (const type of ggufTypes) {
          const key = `${kernel} ${type}`;
          llamaRounds.set(key, [...(llamaRounds.get(key) ?? []),
            runLlamaBench(llamaBin, ensureBenchGguf(type), { promptTokens: PREFILL_TOKENS, genTokens: LLAMA_TG_TOKENS, numThreads })]);
        }
      }
      const int8Mode = modes.find((mode) => mode.label === 'int8');
      const bf16Mode = modes.find((mode) => mode.label === 'bf16');
      if (int8Mode && bf16Mode) {
        const [int8B1, bf16B1] = [decodeRounds.get(int8Mode)![0], decodeRounds.get(bf16Mode)![0]];
        int8OverBf16[kernel] = median(int8B1.map((rate, round) => rate / bf16B1[round]));
      }
      for (const mode of modes) {
        const tg128 = tg128Rounds.get(mode)!;
        const result = {
          kernel, mode, ...matmulProbes.get(mode)!, decode: decodeRounds.get(mode)!.map(median), prefill: median(prefillRounds.get(mode)!), tg128: tg128.length > 0 ? median(tg128) : null,
          rounds: { b1: decodeRounds.get(mode)![0], prefill: prefillRounds.get(mode)!, tg128 },
        };
        results.push(result);
        console.log(`${kernel} ${mode.label}: decode ${result.decode.map((rate, i) => `b${BATCH_SIZES[i]} ${fmt(rate)}`).join(', ')} tok/s; prefill ${fmt(result.prefill)} tok/s`);
      }
    } finally {
      for (const model of models.values()) model.close();
    }
  }
  for (const kernel of kernels.filter((path) => path !== 'amx')) {
    const ratio = int8OverBf16[kernel];
    if (ratio !== undefined) console.log(`${kernel}: int8 / bf16 decode at batch 1 = ${fmt(ratio, 2)} (median of the rounds' ratios)`);
    if (modeLabels.includes('int8')) {
      const modeOf = (label: string) => MODES.find((mode) => mode.label === label)!;
      const error = relativeError(
        await promptLogits(modelDir, kernel, modeOf('int8'), numThreads),
        await promptLogits(modelDir, kernel, modeOf('fp32'), numThreads),
      );
      console.log(`${kernel}: int8 logits vs fp32, max|diff| / max|fp32| = ${error.toExponential(2)}`);
    }
  }

  // Host scheduling moves (the two vCPUs are sometimes one core's SMT siblings, or share it with a
  // neighbour): the ceilings are measured again, and the fractions use the higher of the two, so
  // a slow start never inflates them.
  const bandwidthAfter = probes.streamReadBytesPerSecond(STREAM_BUFFER_BYTES, numThreads, 5);
  const peaksAfter = new Map(kernels.map((kernel) => [kernel, probes.peakFlopsPerSecond(kernel, numThreads)]));
  console.log(`\nceilings again at the end: streaming read ${fmt(bandwidthAfter / 1e9)} GB/s; ` +
    kernels.map((kernel) => `${kernel} ${fmt(peaksAfter.get(kernel)! / 1e9)} GFLOP/s`).join('; '));
  const moved = (before: number, after: number) => Math.abs(after - before) / Math.max(before, after) > 0.15;
  if (moved(bandwidth, bandwidthAfter) || kernels.some((kernel) => moved(peaks.get(kernel)!, peaksAfter.get(kernel)!))) {
    console.log('WARNING: a ceiling moved by more than 15% during the run; its measurements straddle two machine states');
  }
  const bestBandwidth = Math.max(bandwidth, bandwidthAfter);

  // llama.cpp's figures, each of our rounds' against llama-bench's run right after it.
  if (runLlama) {
    console.log(`\nllama.cpp: ${llamaBin}, ${numThreads} threads, the same GGUF files, one pp${PREFILL_TOKENS} + tg${LLAMA_TG_TOKENS} run after each of our rounds; ` +
      'each ratio is the median of the rounds\' ratios (ours / llama.cpp\'s run of the same round)');
    const list = (rates: readonly number[], digits: number) => rates.map((rate) => fmt(rate, digits)).join(', ');
    for (const type of ggufTypes) {
      const fileModes = allModes.filter((mode) => mode.gguf?.type === type);
      const fileBytesPerWeight = fileModes[0].gguf!.fileBytesPerWeight;
      const fileBound = bestBandwidth / (weightsPerToken * fileBytesPerWeight);
      for (const kernel of kernels) {
        const llama = llamaRounds.get(`${kernel} ${type}`);
        if (llama === undefined) continue;
        const [llamaPp, llamaTg] = [llama.map((run) => run.pp), llama.map((run) => run.tg)];
        console.log(`llama.cpp ${type} (beside ${kernel}'s rounds): pp${PREFILL_TOKENS} ${fmt(median(llamaPp))} tok/s (rounds: ${list(llamaPp, 1)}), ` +
          `tg${LLAMA_TG_TOKENS} ${fmt(median(llamaTg))} tok/s (rounds: ${list(llamaTg, 1)}; ${pct(median(llamaTg) / fileBound)} of the bound of the file's ${fmt(fileBytesPerWeight * 8, 2)} bits per weight)`);
        for (const result of results.filter((r) => r.kernel === kernel && fileModes.includes(r.mode))) {
          const mode = result.mode;
          const b1 = result.decode[0];
          const [tg128Ratio, b1Ratio, prefillRatio] = [
            pairedRatios(result.rounds.tg128, llamaTg), pairedRatios(result.rounds.b1, llamaTg), pairedRatios(result.rounds.prefill, llamaPp),
          ];
          console.log(`  conduit ${result.kernel} ${mode.label}: tg128's work (${LLAMA_TG_TOKENS} tokens from an empty context) ${fmt(result.tg128!)} tok/s = ` +
            `${fmt(tg128Ratio.median, 2)}x llama.cpp tg${LLAMA_TG_TOKENS} (rounds: ${list(tg128Ratio.perRound, 2)}); ` +
            `b1 decode (after a ${PROMPT_TOKENS}-token prompt) ${fmt(b1)} tok/s = ${fmt(b1Ratio.median, 2)}x, ` +
            `${pct(b1 / fileBound)} of the file's bound (${pct(b1 / (bestBandwidth / (weightsPerToken * mode.bytesPerWeight)))} of the bound of the ${fmt(mode.bytesPerWeight * 8, 2)} bits read); ` +
            `prefill ${fmt(result.prefill)} tok/s = ${fmt(prefillRatio.median, 2)}x llama.cpp pp${PREFILL_TOKENS} (rounds: ${list(prefillRatio.perRound, 2)})`);
        }
      }
    }
  } else if (ggufTypes.length > 0) {
    console.log(`\nllama.cpp: not run (no llama-bench at ${llamaBin}; build llama.cpp in a scratch folder and pass --llama-bench PATH)`);
  }

  const header = ['path', 'mode', 'gemv GF/s', '(GB/s, of BW)', 'gemm GF/s', '(of peak)', 'b1 tok/s', '(of bound)', 'b8 tok/s', 'b32 tok/s', '(of peak)', 'b32/b1', 'prefill tok/s', '(of peak)'];
  const rows = results.map(({ kernel, mode, gemvSeconds, gemmSeconds, decode: [b1, b8, b32], prefill }) => {
    const peak = Math.max(peaks.get(kernel)!, peaksAfter.get(kernel)!);
    const gemvBytesPerSecond = (BENCH_SHAPE.hiddenSize * BENCH_SHAPE.intermediateSize * mode.bytesPerWeight) / gemvSeconds;
    const boundTokensPerSecond = bestBandwidth / (weightsPerToken * mode.bytesPerWeight);
    return [
      kernel, mode.label,
      fmt(matmulFlops(1) / gemvSeconds / 1e9), `${fmt(gemvBytesPerSecond / 1e9)}, ${pct(gemvBytesPerSecond / bestBandwidth)}`,
      fmt(matmulFlops(PREFILL_TOKENS) / gemmSeconds / 1e9), pct(matmulFlops(PREFILL_TOKENS) / gemmSeconds / peak),
      fmt(b1), pct(b1 / boundTokensPerSecond),
      fmt(b8), fmt(b32), pct((b32 * decodeFlopsPerToken(newTokens)) / peak), fmt(b32 / b1, 2),
      fmt(prefill), pct((prefill * prefillFlopsPerToken()) / peak),
    ];
  });
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
  const line = (cells: string[]) => cells.map((c, i) => c.padStart(widths[i])).join(' | ');
  console.log(`\n${line(header)}\n${widths.map((w) => '-'.repeat(w)).join('-|-')}`);
  for (const row of rows) console.log(line(row));
  for (const label of ['bf16', 'int8']) {
    if (modeLabels.includes(label)) console.log(amxAgainstAvx512(results, label, Math.max(peaks.get('amx') ?? 0, peaksAfter.get('amx') ?? 0), bestBandwidth, weightsPerToken));
  }
  console.log(
    '\ngemv: 1 x 768 -> 2048 (weights fit the last-level cache); gemm: 512 x 768 -> 2048; decode after a shared 128-token prompt;' +
      `\nbound = streaming-read bandwidth / matmul weight bytes per token; peak = the path's ceiling (${kernels.map((kernel) => `${kernel}: ${ceilingName(kernel)}`).join(', ')}). ` +
      `${fmt((performance.now() - started) / 1000)} s`,
  );
}

await main();
