// Logits against the fp64 reference (test/reference/llama-reference.ts) on random tiny models
// drawn fresh each run, for every kernel path and weight dtype, and int8 quantization of fp32 and
// bf16 checkpoints. Error per position is max|logit − ref| / max|ref|: at most 1e-5 for fp32
// weights, 2e-2 for bf16 and fp16 (5e-2 for bf16 on avx512 and amx, whose activations are bf16
// too: helpers.ts's logitTolerance), 3e-2 for int8.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { loadReferenceModel, referenceLogits, relativeError } from '../../test/reference/llama-reference.ts';
import type { DtypeSetting, NativeModel, Quantization } from '../api.ts';
import { SEQ_RETURN_LOGITS } from '../api.ts';
import {
  KERNELS,
  kernelSkip,
  buildBatch,
  consecutiveBlocks,
  freshSeed,
  loadOptions,
  logitTolerance,
  makeTempDir,
  randomTokens,
  withModel,
  writeCheckpoint,
  type ShapeOptions,
} from './helpers.ts';

/** int8 weights (per-32 block scales) and int8 activations in the matmuls. */
const INT8_TOLERANCE = 3e-2;
const PROMPT_TOKENS = 13;
/** The first chunk is prefilled at once; the rest is decoded token by token. */
const FIRST_CHUNK_TOKENS = 7;

// Feature widths are chosen so that K is not a multiple of 16 somewhere, exercising the tails.
// Head dims that are multiples of 16 put a bf16 cache in the paired layout (KvLayout::kBf16Pairs);
// the long prompts there cross cache blocks, and the odd window starts and ends its visible keys
// at both parities of a slot pair. Those models are 128 wide: at 64, avx512's bf16 activations
// put 1 draw in ~100 past the 2e-2 bound over 18 positions (in ~1,000 draws: 0 at 128 wide).
interface Case extends ShapeOptions {
  promptTokens?: number;
  firstChunkTokens?: number;
}

const SHAPES: Readonly<Record<string, Case>> = {
  'llama, grouped-query attention': {
    arch: 'llama', hiddenSize: 64, numLayers: 2, numHeads: 4, numKvHeads: 2, intermediateSize: 88, vocabSize: 96,
  },
  'llama, tied embeddings, 5 heads, explicit head_dim, llama3 rope scaling': {
    arch: 'llama', hiddenSize: 40, numLayers: 2, numHeads: 5, numKvHeads: 1, headDim: 12, intermediateSize: 72,
    vocabSize: 80, tieWordEmbeddings: true, ropeTheta: 500000, ropeScalingLlama3: true,
  },
  'qwen2, q/k/v bias': {
    arch: 'qwen2', hiddenSize: 48, numLayers: 2, numHeads: 6, numKvHeads: 2, intermediateSize: 100, vocabSize: 90,
  },
  'mistral, sliding window shorter than the prompt': {
    arch: 'mistral', hiddenSize: 32, numLayers: 2, numHeads: 4, numKvHeads: 4, intermediateSize: 64, vocabSize: 70,
    slidingWindow: 5,
  },
  'llama, head_dim 32, 40-token prompt over three cache blocks': {
    arch: 'llama', hiddenSize: 128, numLayers: 2, numHeads: 4, numKvHeads: 1, intermediateSize: 168, vocabSize: 96,
    promptTokens: 40, firstChunkTokens: 23,
  },
  'mistral, head_dim 16, window of 21 over a 40-token prompt': {
    arch: 'mistral', hiddenSize: 128, numLayers: 2, numHeads: 8, numKvHeads: 2, intermediateSize: 128, vocabSize: 70,
    slidingWindow: 21, promptTokens: 40, firstChunkTokens: 30,
  },
};

/** Logits at positions firstChunkTokens - 1 .. the last: one prefill chunk, then decode steps. */
async function runtimeLogits(model: NativeModel, tokenIds: readonly number[], firstChunkTokens: number): Promise<Float32Array[]> {
  const blockIds = consecutiveBlocks(3, tokenIds.length, model.info.blockSizeTokens);
  const rows: Float32Array[] = [];
  let position = 0;
  while (position < tokenIds.length) {
    const numTokens = position === 0 ? firstChunkTokens : 1;
    const batch = buildBatch([
      { tokenIds: tokenIds.slice(position, position + numTokens), startPosition: position, blockIds, flags: SEQ_RETURN_LOGITS },
    ]);
    // The model writes its next pass into the same arrays.
    rows.push((await model.forward(batch)).logits.slice());
    position += numTokens;
  }
  return rows;
}

async function checkAgainstReference(
  modelDir: string,
  expected: Float64Array[],
  tokenIds: readonly number[],
  settings: {
    kernel: (typeof KERNELS)[number];
    dtype: DtypeSetting;
    kvCacheDtype: DtypeSetting;
    quantization?: Quantization;
    tolerance: number;
    seed: number;
    firstChunkTokens?: number;
  },
): Promise<void> {
  const firstChunkTokens = settings.firstChunkTokens ?? FIRST_CHUNK_TOKENS;
  const options = loadOptions(modelDir, {
    kernel: settings.kernel, dtype: settings.dtype, kvCacheDtype: settings.kvCacheDtype, quantization: settings.quantization,
  });
  await withModel(options, async (model) => {
    const rows = await runtimeLogits(model, tokenIds, firstChunkTokens);
    rows.forEach((row, i) => {
      const position = firstChunkTokens - 1 + i;
      const error = relativeError(row, expected[position]);
      assert.ok(
        error <= settings.tolerance,
        `seed ${settings.seed}, ${settings.kernel}, weights ${model.info.dtype} ${model.info.quantization}, kv ${model.info.kvCacheDtype}: ` +
          `position ${position} error ${error.toExponential(3)} > ${settings.tolerance}`,
      );
    });
  });
}

for (const [shapeName, { promptTokens = PROMPT_TOKENS, firstChunkTokens, ...shape }] of Object.entries(SHAPES)) {
  test(`logits match the fp64 reference: ${shapeName}`, async (t) => {
    using temp = makeTempDir('numerics');
    for (const dtype of ['fp32', 'bf16', 'fp16'] as const) {
      const seed = freshSeed(t);
      const modelDir = writeCheckpoint(temp.dir, dtype, { ...shape, dtype, seed });
      const tokenIds = randomTokens(promptTokens, shape.vocabSize, seed);
      const expected = referenceLogits(loadReferenceModel(modelDir), tokenIds);
      for (const kernel of KERNELS) {
        await t.test(`${dtype} weights, ${kernel}`, { skip: kernelSkip(kernel) }, () =>
          checkAgainstReference(modelDir, expected, tokenIds, {
            kernel, dtype: 'auto', kvCacheDtype: 'auto', tolerance: logitTolerance(dtype, kernel), seed, firstChunkTokens,
          }),
        );
      }
    }
  });
}

// Q8_0 rounding costs ~4x bf16's error: on random models 1.2e-2 to 2.8e-2 of the logits from
// draw to draw (the 125 M benchmark model: 2.9e-2 against fp32). Fresh draws would make the
// 3e-2 bound a lottery, so this test pins its draws (error 2.3e-2) and stays a regression check:
// a broken scale, block layout or padding costs far more than the margin.
const INT8_SHAPE: ShapeOptions = {
  arch: 'qwen2', hiddenSize: 256, numLayers: 2, numHeads: 4, numKvHeads: 2, intermediateSize: 344, vocabSize: 200,
};
const INT8_SEEDS = { fp32: 7, bf16: 11 } as const;

test('int8 quantization stays within 3e-2 of the fp64 reference', async (t) => {
  using temp = makeTempDir('int8');
  for (const dtype of ['fp32', 'bf16'] as const) {
    const seed = INT8_SEEDS[dtype];
    const modelDir = writeCheckpoint(temp.dir, dtype, { ...INT8_SHAPE, dtype, seed });
    const tokenIds = randomTokens(PROMPT_TOKENS, INT8_SHAPE.vocabSize, seed);
    const expected = referenceLogits(loadReferenceModel(modelDir), tokenIds);
    for (const kernel of KERNELS) {
      await t.test(`${dtype} weights quantized to int8, ${kernel}`, { skip: kernelSkip(kernel) }, () =>
        checkAgainstReference(modelDir, expected, tokenIds, {
          kernel, dtype: 'auto', kvCacheDtype: 'auto', quantization: 'int8', tolerance: INT8_TOLERANCE, seed,
        }),
      );
    }
  }
});

test('dtype overrides convert at load: widening is exact, narrowing rounds as the checkpoint writer does', async (t) => {
  using temp = makeTempDir('overrides');
  const shape = SHAPES['llama, grouped-query attention'];
  const seed = freshSeed(t);
  const tokenIds = randomTokens(PROMPT_TOKENS, shape.vocabSize, seed);
  // The same seed draws the same fp32 values; the writer rounds them to nearest even, as load-time conversion does.
  const stored = {
    fp32: writeCheckpoint(temp.dir, 'fp32', { ...shape, dtype: 'fp32', seed }),
    bf16: writeCheckpoint(temp.dir, 'bf16', { ...shape, dtype: 'bf16', seed }),
    fp16: writeCheckpoint(temp.dir, 'fp16', { ...shape, dtype: 'fp16', seed }),
  };
  const bf16Expected = referenceLogits(loadReferenceModel(stored.bf16), tokenIds);
  for (const kernel of KERNELS) {
    await t.test(`bf16 checkpoint as fp32 with an fp32 cache, ${kernel}`, { skip: kernelSkip(kernel) }, () =>
      checkAgainstReference(stored.bf16, bf16Expected, tokenIds, { kernel, dtype: 'fp32', kvCacheDtype: 'fp32', tolerance: 1e-5, seed }),
    );
    for (const dtype of ['bf16', 'fp16'] as const) {
      await t.test(`fp32 checkpoint as ${dtype} computes what a ${dtype} checkpoint does, ${kernel}`, { skip: kernelSkip(kernel) }, async () => {
        const converted = await withModel(loadOptions(stored.fp32, { kernel, dtype }), (model) => runtimeLogits(model, tokenIds, FIRST_CHUNK_TOKENS));
        const native = await withModel(loadOptions(stored[dtype], { kernel }), (model) => runtimeLogits(model, tokenIds, FIRST_CHUNK_TOKENS));
        assert.deepEqual(converted, native, `seed ${seed}`);
      });
    }
  }
});
