// The model and batches the native sampling tests share: a random one-layer model, one prompt
// repeated over many sequences (each in its own cache block) that sample under their own
// settings, and the raw logits the reference chain starts from.
import type { NativeModel } from '../api.ts';
import { SEQ_RETURN_LOGITS, SEQ_SAMPLE } from '../api.ts';
import { buildBatch, loadOptions, makeTempDir, withModel, writeCheckpoint, type SeqChunk } from './helpers.ts';
import { NEUTRAL_SETTINGS, type SamplingSettings } from './sampling-reference.ts';

/** Sequences per forward pass; each has its own cache block. */
export const SEQS_PER_PASS = 256;

export async function withSamplingModel(vocabSize: number, seed: number, fn: (model: NativeModel) => Promise<void>): Promise<void> {
  using temp = makeTempDir('sampling');
  const modelDir = writeCheckpoint(temp.dir, 'model', {
    arch: 'llama', hiddenSize: 32, numLayers: 1, numHeads: 2, numKvHeads: 2, intermediateSize: 48, vocabSize, dtype: 'fp32', seed,
  });
  await withModel(loadOptions(modelDir, { numKvBlocks: SEQS_PER_PASS }), fn);
}

/** Sequence `seq` of a pass: the prompt in block `seq`, sampled under `settings`. */
export function chunkOf(prompt: readonly number[], settings: SamplingSettings, seq: number, extra: Partial<SeqChunk> = {}): SeqChunk {
  return { tokenIds: prompt, startPosition: 0, blockIds: [seq], flags: SEQ_SAMPLE, ...settings, ...extra };
}

/** The raw logits at the prompt's last token. */
export async function rawLogitsOf(model: NativeModel, prompt: readonly number[]): Promise<Float32Array> {
  return (await model.forward(buildBatch([chunkOf(prompt, NEUTRAL_SETTINGS, 0, { flags: SEQ_RETURN_LOGITS })]))).logits;
}

/** Tokens of one sequence drawn at output indices 0 .. numDraws - 1 under one seed, counted per token. */
export async function drawCounts(
  model: NativeModel,
  vocabSize: number,
  prompt: readonly number[],
  settings: SamplingSettings,
  seed: bigint,
  numDraws: number,
): Promise<Float64Array> {
  const counts = new Float64Array(vocabSize);
  for (let first = 0; first < numDraws; first += SEQS_PER_PASS) {
    const chunks = Array.from({ length: SEQS_PER_PASS }, (_, i) => chunkOf(prompt, settings, i, { seed, outputIndex: first + i }));
    for (const tokenId of (await model.forward(buildBatch(chunks, { vocabSize }))).sampledTokenIds) counts[tokenId]++;
  }
  return counts;
}
