// Mixture-of-experts decode on the native runtime, against what the machine allows and against a
// dense model doing the same work per token:
//   - a random Qwen3-MoE checkpoint shaped like Qwen3-30B-A3B scaled to ~1.0 B parameters with
//     ~0.15 B active per token (hidden 1024, 12 layers, 16 heads of 64 with 4 KV heads, 64
//     experts of width 384, 8 per token, vocab 32000), and a dense Qwen3 of the same active size
//     (the same attention, FFN 8 × 384 = 3072), both written under .bench/ on first use;
//   - batch-1 decode tok/s against the streaming-read bound of the bytes one token reads: the
//     attention matrices, the router (fp32), the 8 chosen experts and the LM head (target ≥ 0.7),
//     with the read bandwidth probed just before and just after each round's leg, the larger (it
//     drifts within a run on a VM);
//   - batch-32 decode tok/s against the dense model's at batch 32 (target ≥ 0.6×); at batch 32
//     the step's 256 routed rows touch nearly every expert, so the MoE step reads nearly all its
//     weights where the dense one reads a sixth as much;
//   - bf16 weights and int8 experts (quantization int8), each model loaded once per mode, the two
//     models taking turns round after round; medians;
//   - with --llama-cpp DIR (a llama.cpp build: DIR/build/bin/llama-bench, llama-batched-bench,
//     llama-quantize and DIR/gguf-py), the same two checkpoints converted to GGUF
//     (tools/bench-moe-gguf.py; bf16, and Q8_0 for int8) and measured by llama-bench (batch-1
//     decode) and llama-batched-bench (32 sequences decoding together) on the same threads.
//
//   - with --tiles, first one core's expert matmul at 1-32 rows against its read rate and peak.
//
//   npm run bench:moe [-- --threads 2 --steps 32 --rounds 3 --modes bf16,int8 --llama-cpp DIR --tiles]
//
// Memory: one mode's two models at a time (bf16: ~2.4 GiB packed), plus the 1 GiB buffer the
// bandwidth probe reads before they load.
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import type { NativeModel, Quantization } from '../native/api.ts';
import { kernelSupported, loadModel, probes } from '../native/index.ts';
import { describeCpu } from './bench-model.ts';
import { decodeKvBlocks, decodeTokensPerSecond } from './decode-loop.ts';
import { DEFAULT_OPTIONS, writeRandomCheckpoint, type CheckpointOptions } from './make-checkpoint.ts';
import { median } from '../loadtest/stats.ts';

const ATTENTION = { hiddenSize: 1024, numLayers: 12, numHeads: 16, numKvHeads: 4, headDim: 64, vocabSize: 32000 };
const EXPERTS = { numExperts: 64, numExpertsPerToken: 8, moeIntermediateSize: 384 };
const DENSE_FFN = EXPERTS.numExpertsPerToken * EXPERTS.moeIntermediateSize;
const MOE_OPTIONS: Omit<CheckpointOptions, 'outDir'> = {
  ...DEFAULT_OPTIONS, ...ATTENTION, ...EXPERTS, arch: 'qwen3_moe', intermediateSize: DENSE_FFN, normTopkProb: true, dtype: 'bf16',
};
const DENSE_OPTIONS: Omit<CheckpointOptions, 'outDir'> = { ...DEFAULT_OPTIONS, ...ATTENTION, arch: 'qwen3', intermediateSize: DENSE_FFN, dtype: 'bf16' };
const BLOCK_SIZE_TOKENS = 16;
const PROMPT_TOKENS = 16;
const BATCH_SIZES = [1, 32] as const;
const STREAM_BUFFER_BYTES = 1 << 30;
const B1_TARGET_OF_BOUND = 0.7;
const B32_TARGET_OF_DENSE = 0.6;

interface Mode {
  label: 'bf16' | 'int8';
  quantization: Quantization;
  /** Bytes per weight of the matrices (int8: 32 values and an fp16 scale per block). */
  bytesPerWeight: number;
}
const MODES: readonly Mode[] = [
  { label: 'bf16', quantization: 'none', bytesPerWeight: 2 },
  { label: 'int8', quantization: 'int8', bytesPerWeight: 34 / 32 },
];

const { hiddenSize: H, numLayers: L, numHeads, numKvHeads, headDim, vocabSize } = ATTENTION;
const ATTENTION_WEIGHTS = 2 * H * numHeads * headDim + 2 * H * numKvHeads * headDim;
const EXPERT_WEIGHTS = 3 * H * EXPERTS.moeIntermediateSize;
const LM_HEAD_WEIGHTS = vocabSize * H;
const ROUTER_BYTES = EXPERTS.numExperts * H * 4;

/** Parameters of each checkpoint (embedding and LM head included). */
const MOE_PARAMS = L * (ATTENTION_WEIGHTS + EXPERTS.numExperts * EXPERT_WEIGHTS + EXPERTS.numExperts * H) + 2 * vocabSize * H;
const ACTIVE_PARAMS = L * (ATTENTION_WEIGHTS + EXPERTS.numExpertsPerToken * EXPERT_WEIGHTS);

/** Bytes one decoded token reads at batch 1: the layers' matrices it multiplies, the router, the LM head. */
function moeBytesPerToken(mode: Mode): number {
  return L * ((ATTENTION_WEIGHTS + EXPERTS.numExpertsPerToken * EXPERT_WEIGHTS) * mode.bytesPerWeight + ROUTER_BYTES) + LM_HEAD_WEIGHTS * mode.bytesPerWeight;
}
function denseBytesPerToken(mode: Mode): number {
  return (L * (ATTENTION_WEIGHTS + 3 * H * DENSE_FFN) + LM_HEAD_WEIGHTS) * mode.bytesPerWeight;
}
/** Bytes a step of n tokens reads: every expert some token chose (uniform routing's expectation), once. */
function moeBytesPerStep(mode: Mode, numTokens: number): number {
  const experts = expectedExpertsTouched(numTokens);
  return L * ((ATTENTION_WEIGHTS + experts * EXPERT_WEIGHTS) * mode.bytesPerWeight + ROUTER_BYTES) + LM_HEAD_WEIGHTS * mode.bytesPerWeight;
}
/** Experts a step of n tokens touches per layer, on average, under uniform routing. */
function expectedExpertsTouched(numTokens: number): number {
  const { numExperts: E, numExpertsPerToken: k } = EXPERTS;
  return E * (1 - (1 - k / E) ** numTokens);
}

function ensureCheckpoint(name: string, options: Omit<CheckpointOptions, 'outDir'>): string {
  const modelDir = path.resolve('.bench', name);
  if (!existsSync(path.join(modelDir, 'model.safetensors'))) {
    console.log(`writing ${modelDir} ...`);
    writeRandomCheckpoint({ ...options, outDir: modelDir });
  }
  return modelDir;
}


const fmt = (value: number, digits = 1): string => value.toFixed(digits);
const rssGiB = (): string => `${fmt(process.memoryUsage().rss / 2 ** 30, 2)} GiB`;

interface LlamaCppFigures {
  b1: number;
  b32: number;
}

/** llama-bench's tg (batch-1 decode) and llama-batched-bench's S_TG with 32 sequences, tok/s. */
function llamaCppDecode(llamaDir: string, gguf: string, numThreads: number, numSteps: number, numRounds: number): LlamaCppFigures {
  const bin = (name: string) => path.join(llamaDir, 'build', 'bin', name);
  const bench = execFileSync(bin('llama-bench'), ['-m', gguf, '-p', '0', '-n', String(numSteps), '-t', String(numThreads), '-r', String(numRounds), '-o', 'json'], {
    encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'], maxBuffer: 1 << 26,
  });
  const b1 = (JSON.parse(bench) as Array<{ avg_ts: number }>)[0].avg_ts;
  const rates: number[] = [];
  for (let round = 0; round < numRounds; round++) {
    const batched = execFileSync(bin('llama-batched-bench'), [
      '-m', gguf, '-c', String(32 * (PROMPT_TOKENS + numSteps + 1)), '-b', '512', '-ub', '512', '-npp', String(PROMPT_TOKENS),
      '-ntg', String(numSteps), '-npl', '32', '-t', String(numThreads), '--output-format', 'jsonl',
    ], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'], maxBuffer: 1 << 26 });
    const line = batched.split('\n').find((entry) => entry.startsWith('{') && entry.includes('speed_tg'));
    if (line === undefined) throw new Error(`llama-batched-bench printed no jsonl row:\n${batched}`);
    rates.push((JSON.parse(line) as { speed_tg: number }).speed_tg);
  }
  return { b1, b32: median(rates) };
}

/** The first part of a llama.cpp build this bench needs that DIR lacks, or null. */
function missingLlamaCppParts(llamaDir: string): string | null {
  const parts = ['llama-bench', 'llama-batched-bench', 'llama-quantize'].map((name) => path.join('build', 'bin', name)).concat('gguf-py');
  return parts.find((part) => !existsSync(path.join(llamaDir, part))) ?? null;
}

function verdict(what: string, ratio: number, target: number): string {
  return `${what}: ${fmt(ratio, 2)} (target >= ${target}: ${ratio >= target ? 'met' : 'missed'})`;
}

function ggufOf(llamaDir: string, modelDir: string, mode: Mode): string {
  const bf16 = `${modelDir}.bf16.gguf`;
  if (!existsSync(bf16)) {
    console.log(`converting ${modelDir} to ${bf16} ...`);
    execFileSync('python3', [path.resolve('tools', 'bench-moe-gguf.py'), modelDir, bf16], {
      stdio: 'inherit', env: { ...process.env, GGUF_PY: path.join(llamaDir, 'gguf-py') },
    });
  }
  if (mode.label === 'bf16') return bf16;
  const q8 = `${modelDir}.q8_0.gguf`;
  if (!existsSync(q8)) execFileSync(path.join(llamaDir, 'build', 'bin', 'llama-quantize'), [bf16, q8, 'Q8_0'], { stdio: 'ignore' });
  return q8;
}

// Rows per expert in a batch-32 step run from 1 to ~10 (256 routed rows over 64 experts), and a
// step streams every expert once. This measures the expert matmul (k = hidden) at such row counts
// on a matrix far beyond the caches, as the step streams it, against the streaming read of as
// many threads and the path's multiply-add peak, on one thread and on the run's threads: where the
// experts run read-bound at the read rate, only the machine's bandwidth moves the batch-32 figure;
// where they fall below both, the kernel does; where one thread keeps up and two do not, the
// threads' sharing of memory does.
const TILE_ROWS = [1, 2, 4, 8, 16, 32];
const TILE_COLUMNS = 131072;

function printTileProfile(modes: readonly Mode[], numThreads: number): void {
  const kernel = kernelSupported('avx512') ? 'avx512' : 'avx2';
  for (const threads of [...new Set([1, numThreads])]) {
    const read = probes.streamReadBytesPerSecond(STREAM_BUFFER_BYTES, threads, 5);
    const peakOfThreads = probes.peakFlopsPerSecond(kernel, threads);
    console.log(`expert matmul on ${threads} thread${threads > 1 ? 's' : ''} (${kernel}; streaming read ${fmt(read / 1e9)} GB/s on as many, ` +
      `bf16 multiply-add peak ${fmt(peakOfThreads / 1e9)} GFLOP/s):`);
    for (const mode of modes) {
      const bytes = H * TILE_COLUMNS * mode.bytesPerWeight;
      const cells = TILE_ROWS.map((numRows) => {
        const seconds = probes.matmulSeconds({
          kernel, dtype: 'bf16', quantization: mode.quantization, numRows, k: H, n: TILE_COLUMNS, numThreads: threads, numRepeats: 3,
        });
        const flops = 2 * numRows * H * TILE_COLUMNS;
        // The peak is bf16's (vdpbf16ps) or fp32's (FMA); int8 runs other instructions.
        const ofPeak = mode.quantization === 'none' ? `, ${fmt((flops / seconds / peakOfThreads) * 100, 0)}% of peak` : '';
        return `${numRows} rows ${fmt(bytes / seconds / read, 2)} of read${ofPeak}`;
      });
      console.log(`  ${mode.label} (${fmt(bytes / 2 ** 20, 0)} MiB): ${cells.join('; ')}`);
    }
  }
  console.log('');
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      threads: { type: 'string', default: String(os.availableParallelism()) },
      steps: { type: 'string', default: '32' },
      rounds: { type: 'string', default: '3' },
      modes: { type: 'string', default: 'bf16,int8' },
      'llama-cpp': { type: 'string' },
      tiles: { type: 'boolean', default: false },
    },
  });
  const numThreads = Number(values.threads);
  const numSteps = Number(values.steps);
  const numRounds = Number(values.rounds);
  const modes = MODES.filter((mode) => values.modes.split(',').includes(mode.label));
  const llamaDir = values['llama-cpp'];
  const llamaCppMissing = llamaDir === undefined ? null : missingLlamaCppParts(llamaDir);
  console.log(`CPU: ${describeCpu()}; ${fmt(os.totalmem() / 2 ** 30)} GiB memory; load average ${os.loadavg().map((v) => fmt(v, 2)).join(' ')}`);
  const moeDir = ensureCheckpoint('qwen3-moe-a0.15b-1b-bf16', MOE_OPTIONS);
  const denseDir = ensureCheckpoint('qwen3-dense-0.15b-bf16', DENSE_OPTIONS);
  console.log(`Qwen3-MoE: ${fmt(MOE_PARAMS / 1e9, 3)} B parameters, ${fmt(ACTIVE_PARAMS / 1e9, 3)} B active per token in the layers ` +
    `(+${fmt(LM_HEAD_WEIGHTS / 1e6)} M LM head); dense Qwen3 of the same active size: FFN ${DENSE_FFN}`);
  const started = performance.now();
  const bandwidth = probes.streamReadBytesPerSecond(STREAM_BUFFER_BYTES, numThreads, 5);
  console.log(`threads ${numThreads}; streaming read ${fmt(bandwidth / 1e9)} GB/s\n`);

  if (values.tiles) printTileProfile(modes, numThreads);

  const shapeOf = (numSeqs: number) => ({ numSeqs, numPromptTokens: PROMPT_TOKENS, numSteps });
  const numKvBlocks = decodeKvBlocks(shapeOf(Math.max(...BATCH_SIZES)), BLOCK_SIZE_TOKENS);
  const rows: string[][] = [];
  const verdicts: string[] = [];
  let peakRss = 0;
  // CPU time the process got over threads × wall time while decoding: well under 1 on a machine
  // shared with other work, whose figures then measure the sharing too.
  const cpuShares: number[] = [];
  for (const mode of modes) {
    const load = (modelDir: string) => loadModel({
      modelDir, dtype: 'bf16', quantization: mode.quantization, kvCacheDtype: 'bf16', numKvBlocks,
      blockSizeTokens: BLOCK_SIZE_TOKENS, numThreads, kernel: 'auto',
    });
    const models: Record<'moe' | 'dense', NativeModel> = { moe: await load(moeDir), dense: await load(denseDir) };
    peakRss = Math.max(peakRss, process.memoryUsage().rss);
    const rates = { moe: BATCH_SIZES.map((): number[] => []), dense: BATCH_SIZES.map((): number[] => []) };
    // The VM's read bandwidth drifts within a run (49 -> 28 GB/s in one quiet run), and the modes
    // run minutes apart, so each round's batch-1 MoE figure is set against probes read just before
    // and just after it, the larger of the two: one probe alone can catch a dip the leg does not
    // (a ratio above 1 was seen), and a bound must not be beaten. Probe time is left out of the
    // CPU share.
    const roundBandwidths: number[] = [];
    let cpuBusy = 0;
    let wallBusy = 0;
    const timed = async (leg: () => Promise<void>) => {
      const cpuBefore = process.cpuUsage();
      const wallBefore = performance.now();
      await leg();
      const cpu = process.cpuUsage(cpuBefore);
      cpuBusy += (cpu.user + cpu.system) / 1000;
      wallBusy += performance.now() - wallBefore;
    };
    const probeRead = () => probes.streamReadBytesPerSecond(STREAM_BUFFER_BYTES, numThreads, 5);
    try {
      for (let round = 0; round < numRounds; round++) {
        const before = probeRead();
        await timed(async () => {
          rates.moe[0].push(await decodeTokensPerSecond(models.moe, shapeOf(BATCH_SIZES[0])));
        });
        roundBandwidths.push(Math.max(before, probeRead()));
        await timed(async () => {
          for (const [i, numSeqs] of BATCH_SIZES.entries()) {
            for (const name of ['moe', 'dense'] as const) {
              if (name === 'moe' && i === 0) continue;
              rates[name][i].push(await decodeTokensPerSecond(models[name], shapeOf(numSeqs)));
            }
          }
        });
      }
      cpuShares.push(cpuBusy / (wallBusy * numThreads));
      peakRss = Math.max(peakRss, process.memoryUsage().rss);
    } finally {
      models.moe.close();
      models.dense.close();
    }
    const [moeB1, moeB32] = rates.moe.map(median);
    const [denseB1, denseB32] = rates.dense.map(median);
    const moeRatioB32 = median(rates.moe[1].map((rate, round) => rate / rates.dense[1][round]));
    const moeBound = bandwidth / moeBytesPerToken(mode);
    const moeOfRoundBound = median(rates.moe[0].map((rate, round) => (rate * moeBytesPerToken(mode)) / roundBandwidths[round]));
    const moeB32Bound = (32 * bandwidth) / moeBytesPerStep(mode, 32);
    const denseBound = bandwidth / denseBytesPerToken(mode);
    console.log(`${mode.label}: streaming read around each round's MoE b1 leg (the larger of before and after) ${roundBandwidths.map((b) => fmt(b / 1e9)).join(', ')} GB/s; ` +
      `MoE b1 ${fmt(moeB1)} tok/s (${fmt(moeOfRoundBound, 2)} of its round's bound; bound at the start of the run ${fmt(moeBound)}), b32 ${fmt(moeB32)} tok/s (bound ${fmt(moeB32Bound)}); ` +
      `dense b1 ${fmt(denseB1)} tok/s (bound ${fmt(denseBound)}), b32 ${fmt(denseB32)} tok/s; resident ${rssGiB()}`);
    verdicts.push(
      verdict(`${mode.label} batch-1 MoE decode, of the read bound`, moeOfRoundBound, B1_TARGET_OF_BOUND),
      verdict(`${mode.label} batch-32 MoE decode, of dense at batch 32`, moeRatioB32, B32_TARGET_OF_DENSE),
    );
    rows.push([
      'conduit', mode.label, fmt(moeB1), `${fmt(moeOfRoundBound * 100, 0)}%`, fmt(moeB32), `${fmt((moeB32 / moeB32Bound) * 100, 0)}%`,
      fmt(denseB1), fmt(denseB32), fmt(moeRatioB32, 2),
    ]);
    if (llamaDir !== undefined && llamaCppMissing === null) {
      const llamaBefore = probeRead();
      const moe = llamaCppDecode(llamaDir, ggufOf(llamaDir, moeDir, mode), numThreads, numSteps, numRounds);
      const llamaBound = Math.max(llamaBefore, probeRead()) / moeBytesPerToken(mode);
      const dense = llamaCppDecode(llamaDir, ggufOf(llamaDir, denseDir, mode), numThreads, numSteps, numRounds);
      const label = mode.label === 'int8' ? 'Q8_0' : 'bf16';
      console.log(`llama.cpp ${label}: MoE b1 ${fmt(moe.b1)}, b32 ${fmt(moe.b32)} tok/s; dense b1 ${fmt(dense.b1)}, b32 ${fmt(dense.b32)} tok/s`);
      rows.push([
        'llama.cpp', label, fmt(moe.b1), `${fmt((moe.b1 / llamaBound) * 100, 0)}%`, fmt(moe.b32), `${fmt((moe.b32 / moeB32Bound) * 100, 0)}%`,
        fmt(dense.b1), fmt(dense.b32), fmt(moe.b32 / dense.b32, 2),
      ]);
    }
  }
  const bandwidthAfter = probes.streamReadBytesPerSecond(STREAM_BUFFER_BYTES, numThreads, 5);
  console.log(`\nstreaming read again at the end: ${fmt(bandwidthAfter / 1e9)} GB/s` +
    (Math.abs(bandwidthAfter - bandwidth) / Math.max(bandwidth, bandwidthAfter) > 0.15 ? ' (WARNING: moved by more than 15% during the run)' : ''));

  const header = ['engine', 'weights', 'MoE b1 tok/s', '(of bound)', 'MoE b32 tok/s', '(of bound)', 'dense b1', 'dense b32', 'MoE/dense b32'];
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((row) => row[i].length)));
  const line = (cells: string[]) => cells.map((cell, i) => cell.padStart(widths[i])).join(' | ');
  console.log(`\n${line(header)}\n${widths.map((w) => '-'.repeat(w)).join('-|-')}`);
  for (const row of rows) console.log(line(row));
  console.log(
    `\nb1 bound = streaming read (the larger of probes just before and just after each round's batch-1 MoE leg; Conduit's "of bound" is the median of the rounds' ratios; ` +
      `llama.cpp's likewise around its MoE run) / bytes a batch-1 token reads: ${modes.map((mode) => `${mode.label} ${fmt(moeBytesPerToken(mode) / 2 ** 20)} MiB`).join(', ')} ` +
      `(attention, router in fp32, ${EXPERTS.numExpertsPerToken} experts, LM head); b32 bound = 32 × streaming read / bytes a 32-token step reads: ` +
      `${modes.map((mode) => `${mode.label} ${fmt(moeBytesPerStep(mode, 32) / 2 ** 20)} MiB`).join(', ')} (~${fmt(expectedExpertsTouched(32))} of ` +
      `${EXPERTS.numExperts} experts per layer under uniform routing). The process got ${cpuShares.map((share) => `${fmt(share * 100, 0)}%`).join(', ')} ` +
      `of ${numThreads} CPUs while decoding (per mode). Decode after a ${PROMPT_TOKENS}-token prompt, ${numSteps} steps, ` +
      `medians of ${numRounds} rounds; MoE/dense b32 is the median of the rounds' ratios. Peak resident ${fmt(peakRss / 2 ** 30, 2)} GiB. ` +
      `${fmt((performance.now() - started) / 1000)} s`,
  );
  console.log(`\ntargets (ratios measured in this run):\n${verdicts.map((line) => `  ${line}`).join('\n')}`);
  if (llamaDir === undefined) console.log('llama.cpp: not run (pass --llama-cpp DIR, a llama.cpp checkout built with llama-bench, llama-batched-bench and llama-quantize)');
  else if (llamaCppMissing !== null) console.log(`llama.cpp: skipped, ${llamaDir} lacks ${llamaCppMissing}`);
}

await main();
