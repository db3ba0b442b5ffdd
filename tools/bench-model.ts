// What the benchmarks share: the 125 M-parameter benchmark checkpoint (Llama: hidden 768, 12
// layers, 12 heads, 4 KV heads, FFN 2048, vocab 32000, untied, bf16), written under .bench/ on
// first use, and the CPU's description that every figure is reported with.
import { existsSync, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { DEFAULT_OPTIONS, writeRandomCheckpoint } from './make-checkpoint.ts';

export const BENCH_SHAPE = { hiddenSize: 768, numLayers: 12, numHeads: 12, numKvHeads: 4, intermediateSize: 2048, vocabSize: 32000 };

export function ensureBenchCheckpoint(): string {
  const modelDir = path.resolve('.bench', 'llama-125m-bf16');
  if (!existsSync(path.join(modelDir, 'model.safetensors'))) {
    console.log(`writing the benchmark checkpoint to ${modelDir} ...`);
    writeRandomCheckpoint({ ...DEFAULT_OPTIONS, ...BENCH_SHAPE, outDir: modelDir, dtype: 'bf16', tieWordEmbeddings: false });
  }
  return modelDir;
}

/** The CPU's model name and the instruction sets the kernel paths need, as the OS reports them. */
export function describeCpu(): string {
  const model = os.cpus()[0]?.model.trim() ?? 'unknown CPU';
  let flags = new Set<string>();
  try {
    const cpuinfo = readFileSync('/proc/cpuinfo', 'utf8');
    flags = new Set(/^flags\s*:\s*(.*)$/m.exec(cpuinfo)?.[1].split(/\s+/) ?? []);
  } catch {
    return `${model} (${os.arch()})`;
  }
  const has = (names: string[]) => names.every((name) => flags.has(name));
  const sets = [
    ['AVX2+FMA+F16C', has(['avx2', 'fma', 'f16c'])],
    ['AVX-512 F/BW/VL', has(['avx512f', 'avx512bw', 'avx512vl'])],
    ['AVX512_VNNI', has(['avx512_vnni'])],
    ['AVX512_BF16', has(['avx512_bf16'])],
  ] as const;
  return `${model}, ${os.availableParallelism()} CPUs; ${sets.map(([name, present]) => `${name} ${present ? 'yes' : 'no'}`).join(', ')}`;
}
