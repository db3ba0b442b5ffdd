// Logits of the newer families against the fp64 reference written from transformers' modeling
// files (test/reference/decoder-reference.ts), on random checkpoints drawn fresh each run, every
// kernel path × fp32/bf16/fp16, with numerics.test.ts's tolerances (helpers.ts's logitTolerance):
// max|logit − ref| / max|ref| ≤ 1e-5 (fp32), 2e-2 (bf16, fp16; 5e-2 for bf16 on avx512 and amx,
// whose activations are bf16 too). A prefill chunk, then decode steps.
//
// MoE routing is a discontinuous choice: where the reference's k-th and (k+1)-th router logits
// of some token lie closer than the runtime's own rounding reaches (bf16 weights and activations
// move a router logit by ~1e-3 of the logits' RMS), the runtime may rightly pick the other
// expert, and the logits of that token and of every later one are no longer comparable. So a MoE
// case draws its prompt afresh (the checkpoint stays) until no token of it comes within
// ROUTER_MARGIN of a tie, and then compares every position: a random prompt conditioned on
// routing the reference decides unambiguously.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { decoderReferenceForward, loadDecoderReference, type ReferenceOptions } from '../../test/reference/decoder-reference.ts';
import { relativeError } from '../../test/reference/llama-reference.ts';
import type { LoadOptions, NativeModel, WeightDtype } from '../api.ts';
import { SEQ_RETURN_LOGITS } from '../api.ts';
import {
  KERNELS,
  buildBatch,
  freshSeed,
  groupConsecutiveBlocks,
  kernelSkip,
  loadOptions,
  logitTolerance,
  makeTempDir,
  randomTokens,
  withModel,
  writeCheckpoint,
  type ShapeOptions,
} from './helpers.ts';

/**
 * Router margins (over the logits' RMS) below which the runtime's rounding may flip a choice. At
 * 1e-2, a bf16 avx512 run (seed 1249028193, 40 tokens, top 3 of 6) went 2.5e-2 off at one
 * position through a token routed at a 1.2e-2 margin. At 2e-2 a 40-token prompt of that case
 * clears every tie in 4 to 12% of draws (~30 ms each), so 400 draws fail with odds below 1e-7.
 */
const ROUTER_MARGIN: Readonly<Record<WeightDtype, number>> = { fp32: 1e-4, bf16: 2e-2, fp16: 2e-2 };
const MAX_PROMPT_DRAWS = 400;

export interface FamilyCase extends ShapeOptions {
  promptTokens: number;
  firstChunkTokens: number;
  load?: Partial<LoadOptions>;
  reference?: ReferenceOptions;
}

export const FAMILY_CASES: Readonly<Record<string, FamilyCase>> = {
  'qwen3, q/k norms, tied embeddings, head_dim 16': {
    arch: 'qwen3', hiddenSize: 64, numLayers: 2, numHeads: 4, numKvHeads: 2, headDim: 16, intermediateSize: 88, vocabSize: 96,
    tieWordEmbeddings: true, ropeTheta: 1e6, promptTokens: 13, firstChunkTokens: 7,
  },
  'qwen3, attention bias, a sliding window on the upper layer, YaRN': {
    arch: 'qwen3', hiddenSize: 48, numLayers: 2, numHeads: 6, numKvHeads: 2, headDim: 8, intermediateSize: 72, vocabSize: 80,
    attentionBias: true, slidingWindow: 5, maxWindowLayers: 1, yarn: { factor: 4, originalMaxPositionEmbeddings: 512 },
    promptTokens: 13, firstChunkTokens: 7,
  },
  'qwen3-moe, 8 experts top 2, norm_topk_prob off, a dense layer (mlp_only_layers)': {
    arch: 'qwen3_moe', hiddenSize: 64, numLayers: 2, numHeads: 4, numKvHeads: 2, headDim: 16, intermediateSize: 88, vocabSize: 96,
    numExperts: 8, numExpertsPerToken: 2, moeIntermediateSize: 40, normTopkProb: false, mlpOnlyLayers: [0],
    promptTokens: 13, firstChunkTokens: 7,
  },
  'qwen3-moe, renormalized top 3 of 6 on every layer, 40-token prompt over three cache blocks': {
    arch: 'qwen3_moe', hiddenSize: 48, numLayers: 2, numHeads: 4, numKvHeads: 1, headDim: 12, intermediateSize: 64, vocabSize: 80,
    numExperts: 6, numExpertsPerToken: 3, moeIntermediateSize: 36, normTopkProb: true,
    promptTokens: 40, firstChunkTokens: 23,
  },
  'mixtral, 4 experts top 2, sliding window': {
    arch: 'mixtral', hiddenSize: 48, numLayers: 2, numHeads: 4, numKvHeads: 2, intermediateSize: 72, vocabSize: 90,
    numExperts: 4, numExpertsPerToken: 2, slidingWindow: 6, ropeTheta: 1e6,
    promptTokens: 13, firstChunkTokens: 7,
  },
  'gemma3, 2 local : 1 global layers, windows across cache blocks, linear-scaled global rope, query_pre_attn_scalar': {
    arch: 'gemma3', hiddenSize: 64, numLayers: 3, numHeads: 4, numKvHeads: 2, headDim: 16, intermediateSize: 88, vocabSize: 96,
    tieWordEmbeddings: true, slidingWindow: 7, slidingWindowPattern: 3, queryPreAttnScalar: 24, ropeTheta: 1e6, ropeScalingLinear: 8,
    promptTokens: 40, firstChunkTokens: 23,
  },
  'phi3, fused qkv and gate_up, LongRoPE short factors (served length within the original 16), sliding window': {
    arch: 'phi3', hiddenSize: 64, numLayers: 2, numHeads: 4, numKvHeads: 2, intermediateSize: 88, vocabSize: 96,
    slidingWindow: 9, longRope: { originalMaxPositionEmbeddings: 16 }, maxPositionEmbeddings: 64,
    load: { maxModelLen: 16 }, reference: { maxModelLen: 16 }, promptTokens: 13, firstChunkTokens: 7,
  },
  'phi4-mini, partial rotary 0.75, tied, LongRoPE long factors over a 40-token prompt': {
    arch: 'phi3', hiddenSize: 64, numLayers: 2, numHeads: 4, numKvHeads: 1, intermediateSize: 72, vocabSize: 96, tieWordEmbeddings: true,
    partialRotaryFactor: 0.75, longRope: { originalMaxPositionEmbeddings: 16 }, maxPositionEmbeddings: 64,
    promptTokens: 40, firstChunkTokens: 23,
  },
  'gpt-oss, MXFP4 experts (int8 at load), sinks, alternating windows, YaRN, clamped SwiGLU, 4 experts top 2': {
    arch: 'gpt_oss', hiddenSize: 64, numLayers: 2, numHeads: 4, numKvHeads: 2, headDim: 16, intermediateSize: 64, vocabSize: 96,
    numExperts: 4, numExpertsPerToken: 2, slidingWindow: 5, yarn: { factor: 8, originalMaxPositionEmbeddings: 16 }, maxPositionEmbeddings: 128,
    swigluLimit: 1.5, promptTokens: 13, firstChunkTokens: 7,
  },
  'gpt-oss, dequantized bf16 experts in transformers\' [in, out] layout, 40-token prompt': {
    arch: 'gpt_oss', hiddenSize: 48, numLayers: 2, numHeads: 4, numKvHeads: 1, headDim: 12, intermediateSize: 40, vocabSize: 80,
    numExperts: 6, numExpertsPerToken: 3, expertFormat: 'bf16', slidingWindow: 9, promptTokens: 40, firstChunkTokens: 23,
  },
  'gemma3, soft-capped attention scores and final logits': {
    arch: 'gemma3', hiddenSize: 48, numLayers: 2, numHeads: 4, numKvHeads: 1, headDim: 12, intermediateSize: 64, vocabSize: 80,
    tieWordEmbeddings: true, slidingWindow: 5, slidingWindowPattern: 2, attnLogitSoftcapping: 2, finalLogitSoftcapping: 3,
    promptTokens: 13, firstChunkTokens: 7,
  },
};

/** Logits at positions firstChunkTokens - 1 .. the last: one prefill chunk, then decode steps. */
async function runtimeLogits(model: NativeModel, tokenIds: readonly number[], firstChunkTokens: number): Promise<Float32Array[]> {
  const numGroups = model.info.kvCacheGroups.length;
  const groupBlockIds = groupConsecutiveBlocks(numGroups, 3, tokenIds.length, model.info.blockSizeTokens);
  const rows: Float32Array[] = [];
  let position = 0;
  while (position < tokenIds.length) {
    const numTokens = position === 0 ? firstChunkTokens : 1;
    const batch = buildBatch([
      { tokenIds: tokenIds.slice(position, position + numTokens), startPosition: position, blockIds: groupBlockIds[0], groupBlockIds, flags: SEQ_RETURN_LOGITS },
    ], { numKvGroups: numGroups });
    // The model writes its next pass into the same arrays.
    rows.push((await model.forward(batch)).logits.slice());
    position += numTokens;
  }
  return rows;
}

export function familyNumericsTests(cases: Readonly<Record<string, FamilyCase>>): void {
  for (const [caseName, { promptTokens, firstChunkTokens, load, reference, ...shape }] of Object.entries(cases)) {
    test(`logits match the fp64 reference: ${caseName}`, async (t) => {
      using temp = makeTempDir('family');
      for (const dtype of ['fp32', 'bf16', 'fp16'] as const) {
        const seed = freshSeed(t);
        const modelDir = writeCheckpoint(temp.dir, dtype, { ...shape, dtype, seed });
        const referenceModel = loadDecoderReference(modelDir, reference);
        let tokenIds: number[] = [];
        let expected: ReturnType<typeof decoderReferenceForward> | null = null;
        let draws = 0;
        while (draws < MAX_PROMPT_DRAWS && expected === null) {
          tokenIds = randomTokens(promptTokens, shape.vocabSize, seed + draws++);
          const output = decoderReferenceForward(referenceModel, tokenIds);
          if (output.routerMargins.at(-1)! >= ROUTER_MARGIN[dtype]) expected = output;
        }
        if (draws > 1) t.diagnostic(`${dtype}: prompt drawn ${draws} times for routing clear of ties`);
        assert.ok(expected !== null, `seed ${seed}: no prompt in ${MAX_PROMPT_DRAWS} draws routed clear of ties by ${ROUTER_MARGIN[dtype]}`);
        for (const kernel of KERNELS) {
          await t.test(`${dtype} weights, ${kernel}`, { skip: kernelSkip(kernel) }, async () => {
            await withModel(loadOptions(modelDir, { kernel, ...load }), async (model) => {
              const rows = await runtimeLogits(model, tokenIds, firstChunkTokens);
              rows.forEach((row, i) => {
                const position = firstChunkTokens - 1 + i;
                const error = relativeError(row, expected.logits[position]);
                const tolerance = logitTolerance(dtype, kernel);
                assert.ok(error <= tolerance, `seed ${seed}, ${kernel}, ${dtype}: position ${position} error ${error.toExponential(3)} > ${tolerance}`);
              });
            });
          });
        }
      }
    });
  }
}

familyNumericsTests(FAMILY_CASES);
