// What the benchmarks share: the 125 M-parameter benchmark checkpoint (Llama: hidden 768, 12
// layers, 12 heads, 4 KV heads, FFN 2048, vocab 32000, untied, bf16), written under .bench/ on
// first use, and the CPU's description that every figure is reported with.
import { copyFileSync, existsSync, mkdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { packageRoot } from '../package-root.ts';
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

/**
 * The benchmark checkpoint as a model to serve, in dir/name: its files linked, with
 * conduit-tiny's tokenizer extended to the checkpoint's vocabulary. conduit-tiny's 4,096 tokens
 * alone leave ids 4,096-31,999 without text, and the random model samples them about 7 times in
 * 8: a client, which sees text, takes the first token with text (about the 8th) for the first
 * token, and its time to first token counts several decode steps. The added tokens (" <4096>",
 * ...) are vocabulary entries no merge makes, so prompts tokenize as before.
 */
export function writeServableBenchModel(dir: string, name: string): string {
  const checkpoint = ensureBenchCheckpoint();
  const modelDir = path.join(dir, name);
  mkdirSync(modelDir);
  for (const file of ['config.json', 'generation_config.json', 'model.safetensors']) symlinkSync(path.join(checkpoint, file), path.join(modelDir, file));
  const tiny = path.join(packageRoot, 'models', 'conduit-tiny');
  copyFileSync(path.join(tiny, 'tokenizer_config.json'), path.join(modelDir, 'tokenizer_config.json'));
  const tokenizer = JSON.parse(readFileSync(path.join(tiny, 'tokenizer.json'), 'utf8'));
  const vocab: Record<string, number> = tokenizer.model.vocab;
  const taken = new Set<number>([...Object.values(vocab), ...tokenizer.added_tokens.map((token: { id: number }) => token.id)]);
  for (let id = 0; id < BENCH_SHAPE.vocabSize; id++) {
    if (taken.has(id)) continue;
    // 'Ġ' is the byte-level alphabet's space.
    const token = `\u0120<${id}>`;
    if (token in vocab) throw new Error(`conduit-tiny's vocabulary already has ${token}`);
    vocab[token] = id;
  }
  writeFileSync(path.join(modelDir, 'tokenizer.json'), JSON.stringify(tokenizer));
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
    ['AMX-TILE+BF16', has(['amx_tile', 'amx_bf16'])],
  ] as const;
  return `${model}, ${os.availableParallelism()} CPUs; ${sets.map(([name, present]) => `${name} ${present ? 'yes' : 'no'}`).join(', ')}`;
}
