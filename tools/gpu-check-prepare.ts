// Prepares what the GPU check program (native/test/gpu/gpu_check.cc) reads on a machine without
// Node: random checkpoints of each family (written fresh, a new seed each run) and, for each of
// them and for models/conduit-tiny, the model spec the project's checkpoint reader resolves,
// as a text file (native/test/gpu/spec_file.h reads it) with paths relative to it.
//   node --import tsx tools/gpu-check-prepare.ts [OUT_DIR]   (default .gpu-check)
import fs from 'node:fs';
import path from 'node:path';
import { readCheckpoint } from '../native/checkpoint.ts';
import { packageRoot } from '../package-root.ts';
import { DEFAULT_OPTIONS, writeRandomCheckpoint, type ArchName, type CheckpointOptions } from './make-checkpoint.ts';

const outDir = path.resolve(process.argv[2] ?? path.join(packageRoot, '.gpu-check'));

type Shape = Partial<CheckpointOptions> & { arch: ArchName };
// Head dims of 64 and 128 (the kernels' real cases), GQA, and each family's numerics.
const FAMILIES: Record<string, Shape> = {
  llama: { arch: 'llama', hiddenSize: 256, numLayers: 2, numHeads: 4, numKvHeads: 2, headDim: 64, intermediateSize: 512, vocabSize: 512 },
  mistral: { arch: 'mistral', hiddenSize: 256, numLayers: 2, numHeads: 4, numKvHeads: 1, headDim: 64, intermediateSize: 512, vocabSize: 512, slidingWindow: 24 },
  qwen2: { arch: 'qwen2', hiddenSize: 256, numLayers: 2, numHeads: 4, numKvHeads: 2, headDim: 64, intermediateSize: 512, vocabSize: 512 },
  qwen3: { arch: 'qwen3', hiddenSize: 256, numLayers: 2, numHeads: 2, numKvHeads: 1, headDim: 128, intermediateSize: 512, vocabSize: 512, tieWordEmbeddings: true },
  gemma3: { arch: 'gemma3', hiddenSize: 256, numLayers: 3, numHeads: 4, numKvHeads: 2, headDim: 64, intermediateSize: 512, vocabSize: 512, slidingWindowPattern: 3, slidingWindow: 20, attnLogitSoftcapping: 50, finalLogitSoftcapping: 30 },
  // Row-parallel inputs (384 q columns, 400 MLP columns) whose segments are not whole k steps (the
  // packed segment slots), and a vocabulary of 501 that ranks split unevenly.
  llama_uneven: { arch: 'llama', hiddenSize: 192, numLayers: 2, numHeads: 6, numKvHeads: 2, headDim: 64, intermediateSize: 400, vocabSize: 501 },
  phi3: { arch: 'phi3', hiddenSize: 256, numLayers: 2, numHeads: 4, numKvHeads: 4, headDim: 64, intermediateSize: 512, vocabSize: 512 },
  // MoE families: grouped expert matmuls, each routing rule, expert biases and clamped SwiGLU
  // (gpt-oss with its experts dequantized to bf16: MXFP4 is not read on the GPU).
  mixtral: { arch: 'mixtral', hiddenSize: 128, numLayers: 2, numHeads: 4, numKvHeads: 2, headDim: 32, intermediateSize: 128, vocabSize: 256, numExperts: 8, numExpertsPerToken: 2 },
  qwen3_moe: { arch: 'qwen3_moe', hiddenSize: 128, numLayers: 2, numHeads: 4, numKvHeads: 2, headDim: 64, intermediateSize: 256, moeIntermediateSize: 96, vocabSize: 256, numExperts: 16, numExpertsPerToken: 4 },
  gpt_oss: { arch: 'gpt_oss', hiddenSize: 128, numLayers: 2, numHeads: 4, numKvHeads: 2, headDim: 32, intermediateSize: 128, vocabSize: 256, numExperts: 8, numExpertsPerToken: 2, expertFormat: 'bf16' },
};

function refLine(scope: string, name: string, ref: Record<string, unknown> | undefined): string | null {
  if (ref === undefined || ref === null) return null;
  const n = (key: string) => String(ref[key] ?? 0);
  return ['tensor', scope, name, n('fileIndex'), n('offsetBytes'), n('sizeBytes'), String(ref.dtype), String(ref.encoding ?? 'plain'),
    n('rowStride'), n('colStride'), n('scalesFileIndex'), n('scalesOffsetBytes'), n('scalesSizeBytes')].join(' ');
}

function isRef(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && 'fileIndex' in value;
}

/** The spec as the binding would pass it to cd_model_load, one line per field. */
function specText(modelDir: string, specDir: string): string {
  const checkpoint = readCheckpoint(modelDir);
  const spec = checkpoint.spec as unknown as Record<string, unknown>;
  const lines: string[] = [`architecture ${checkpoint.architecture}`];
  for (const file of spec.filePaths as string[]) lines.push(`file ${path.relative(specDir, file)}`);
  for (const [key, value] of Object.entries(spec)) {
    if (typeof value === 'number') lines.push(`${key} ${value}`);
    else if (typeof value === 'boolean') lines.push(`${key} ${value ? 1 : 0}`);
    else if (typeof value === 'string' && (key === 'activation' || key === 'routing')) lines.push(`${key} ${value}`);
  }
  for (const rope of spec.ropes as { rotaryDim: number; attentionScaling: number; invFreq: Float64Array }[]) {
    lines.push(`rope ${rope.rotaryDim} ${rope.attentionScaling} ${rope.invFreq.length} ${Array.from(rope.invFreq).join(' ')}`);
  }
  for (const key of ['embedTokens', 'finalNorm', 'lmHead']) {
    const line = refLine('model', key, spec[key] as Record<string, unknown>);
    if (line !== null) lines.push(line);
  }
  (spec.layers as Record<string, unknown>[]).forEach((layer, i) => {
    const experts = (layer.experts as Record<string, unknown>[] | undefined) ?? [];
    lines.push(`layer ${i} ${layer.slidingWindowTokens} ${layer.ropeIndex} ${layer.kvGroup} ${layer.kvSlot} ${experts.length}`);
    for (const [key, value] of Object.entries(layer)) {
      if (isRef(value)) lines.push(refLine(String(i), key, value)!);
    }
    experts.forEach((expert, e) => {
      for (const [key, value] of Object.entries(expert)) {
        if (isRef(value)) lines.push(refLine(String(i), `expert.${e}.${key}`, value)!);
      }
    });
  });
  return `${lines.join('\n')}\n`;
}

fs.rmSync(outDir, { recursive: true, force: true });
fs.mkdirSync(outDir, { recursive: true });
const seed = Number(process.env.CONDUIT_TEST_SEED ?? Math.floor(Math.random() * 2 ** 31));
for (const [name, shape] of Object.entries(FAMILIES)) {
  const modelDir = path.join(outDir, name);
  writeRandomCheckpoint({ ...DEFAULT_OPTIONS, dtype: 'bf16', ...shape, outDir: modelDir, seed } as CheckpointOptions);
  fs.writeFileSync(path.join(outDir, `${name}.spec`), specText(modelDir, outDir));
}
fs.writeFileSync(path.join(outDir, 'conduit-tiny.spec'), specText(path.join(packageRoot, 'models', 'conduit-tiny'), outDir));
console.log(`wrote ${Object.keys(FAMILIES).length + 1} model specs to ${outDir} (checkpoint seed ${seed})`);
