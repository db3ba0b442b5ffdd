// For a given kernel path and weight mode (fp32, bf16, fp16, int8), a sequence's logits are
// bitwise identical whether it runs alone, in a batch with 15 unrelated sequences (prompt chunks
// and decode tokens mixed), or with its prompt fed in chunks of 1, 7 or 64 tokens, on any number
// of threads, and its seeded samples are the same. So are its top logprobs and prompt logprobs
// when it uses min-p, penalties, logit bias and logprobs, or a structured output's token bitmask,
// among companions that use other settings (some of them constrained by bitmasks of their own).
import assert from 'node:assert/strict';
import { closeSync, openSync, writeSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { roundF32BitsToBf16Bits, roundF32BitsToF16Bits } from '../../tools/safetensors-writer.ts';
import { bf16BitsToNumber, f16BitsToNumber, readSafetensorsHeader, readTensorBytes, type SafetensorsDtype } from '../safetensors.ts';
import { KERNELS, kernelSkip, freshSeed, loadOptions, makeTempDir, randomTokens, withModel, writeCheckpoint } from './helpers.ts';
import {
  BLOCK_SIZE_TOKENS,
  FIRST_BLOCK_AFTER_COMPANIONS,
  MAX_BLOCKS_PER_SEQ,
  NUM_COMPANIONS,
  OTHER_THREAD_COUNTS,
  TARGET_PROMPT_TOKENS,
  assertBitwiseEqual,
  assertReported,
  makeCompanions,
  makeSequence,
  runTarget,
  targetSettings,
} from './invariance-harness.ts';

const MODES = [
  { dtype: 'fp32', quantization: 'none' },
  { dtype: 'bf16', quantization: 'none' },
  { dtype: 'fp16', quantization: 'none' },
  { dtype: 'bf16', quantization: 'int8' },
] as const;

test('logits, samples and logprobs are bitwise identical alone, in a batch of 16 mixing constrained and free sequences, with chunked prompts and on 1 to 8 threads', async (t) => {
  using temp = makeTempDir('invariance');
  const seed = freshSeed(t);
  for (const { dtype, quantization } of MODES) {
    const modelDir = writeCheckpoint(temp.dir, `${dtype}-${quantization}`, {
      // head_dim 16: whole vectors for avx512's grouped key scores, and a bf16 cache there takes
      // the paired layout (KvLayout::kBf16Pairs). Matmuls of several 64-column panels, so that
      // different thread counts split them differently.
      arch: 'qwen2', hiddenSize: 48, numLayers: 2, numHeads: 3, numKvHeads: 1, intermediateSize: 200, vocabSize: 300, dtype, seed,
    });
    const vocabSize = 300;
    const prompt = randomTokens(TARGET_PROMPT_TOKENS, vocabSize, seed);
    const companionsFor = (firstBlock: number) =>
      makeCompanions(seed, vocabSize, 1, firstBlock);
    for (const kernel of KERNELS) {
      await t.test(`${dtype} weights, ${quantization === 'int8' ? 'int8, ' : ''}${kernel}`, { skip: kernelSkip(kernel) }, async () => {
        const options = loadOptions(modelDir, { kernel, quantization, numKvBlocks: (NUM_COMPANIONS + 2) * MAX_BLOCKS_PER_SEQ, blockSizeTokens: BLOCK_SIZE_TOKENS });
        // Elsewhere in the cache, surrounded by unrelated prefill chunks and decode tokens.
        for (const [settingsName, targetSampling] of Object.entries(targetSettings(seed, prompt))) {
          const label = (scenario: string) => `seed ${seed}, ${dtype}, ${quantization}, ${kernel}, ${settingsName}, ${scenario}`;
          const alone = await withModel(options, async (model) => {
            const reference = await runTarget(model, makeSequence(prompt, TARGET_PROMPT_TOKENS, 0, targetSampling), [], 0);
            assertReported(reference, targetSampling, vocabSize, label('alone'));
            for (const chunkTokens of [1, 7, 64]) {
              const chunked = await runTarget(model, makeSequence(prompt, chunkTokens, 0, targetSampling), [], 0);
              assertBitwiseEqual(chunked, reference, label(`chunks of ${chunkTokens}`));
            }
            const batched = await runTarget(model, makeSequence(prompt, TARGET_PROMPT_TOKENS, FIRST_BLOCK_AFTER_COMPANIONS, targetSampling), companionsFor(0), 7);
            assertBitwiseEqual(batched, reference, label(`in a batch with ${NUM_COMPANIONS} others`));
            const batchedChunked = await runTarget(model, makeSequence(prompt, 7, FIRST_BLOCK_AFTER_COMPANIONS, targetSampling), companionsFor(0), 15);
            assertBitwiseEqual(batchedChunked, reference, label(`in chunks of 7 in a batch with ${NUM_COMPANIONS} others`));
            return reference;
          });
          for (const numThreads of OTHER_THREAD_COUNTS) {
            await withModel({ ...options, numThreads }, async (model) => {
              const threadsAlone = await runTarget(model, makeSequence(prompt, TARGET_PROMPT_TOKENS, 0, targetSampling), [], 0);
              assertBitwiseEqual(threadsAlone, alone, label(`alone on ${numThreads} threads`));
              const threadsBatched = await runTarget(model, makeSequence(prompt, 7, FIRST_BLOCK_AFTER_COMPANIONS, targetSampling), companionsFor(0), 3);
              assertBitwiseEqual(threadsBatched, alone, label(`in chunks of 7 in a batch on ${numThreads} threads`));
              if (numThreads === 1) return;
              // The engine lowers a pass's active threads while grammars compile: pass by pass,
              // anything from 1 thread to all of them.
              const activeThreadsOf = (step: number) => [1, numThreads - 1, 0, 2, numThreads][step % 5];
              const varying = await runTarget(model, makeSequence(prompt, 7, FIRST_BLOCK_AFTER_COMPANIONS, targetSampling), companionsFor(0), 3, activeThreadsOf);
              assertBitwiseEqual(varying, alone, label(`in chunks of 7 in a batch on 1 to ${numThreads} of ${numThreads} threads, changing pass by pass`));
              // ... and within a pass, from this thread while the pass runs on the pool's: the
              // engine raises it the moment a compile ends.
              let numChanges = 0;
              const midPass = await runTarget(model, makeSequence(prompt, 7, FIRST_BLOCK_AFTER_COMPANIONS, targetSampling), companionsFor(0), 3, undefined,
                () => 1 + (numChanges++ % numThreads));
              assert.ok(numChanges > 0, 'the count changed during passes');
              assertBitwiseEqual(midPass, alone, label(`in chunks of 7 in a batch on 1 to ${numThreads} of ${numThreads} threads, changing within passes`));
            });
          }
        }
      });
    }
  }
});

// Row-parallel matmuls (o_proj, down_proj) sum their eight segments' partials in one fixed tree:
// per tile for a prompt of more than one 48-row block, after the whole matmul for fewer rows (a
// chunk, a decode token). With random weights, two partials summed in another order move an
// output by about an ulp, and where activations are rounded to bf16 before the next matmul
// (avx512's bf16 kernels) that is almost always rounded away: a swapped pair passed the test above.
// Here each down_proj's segment 7 cancels its segment 0, scaled by 2^16 (gate and up rows copied,
// down columns negated): the tree's own order leaves a residue of those large sums' rounding, and
// any other order one about 2^-7 of the MLP's output, which no rounding hides. (bf16 on avx2 and
// scalar widens its panels in scratch from 36 and 6 rows on, and such kernels never take the
// per-tile path: there both row counts run the same code.)
const CANCEL_SCALE = 2 ** 16;
const REDUCTION_SEGMENTS = 8;

function segmentBegin(k: number, segment: number): number {
  return Math.floor((k * segment) / REDUCTION_SEGMENTS);
}

interface ElementCodec {
  read(view: DataView, index: number): number;
  /** Throws unless the value is exact in the stored dtype. */
  write(view: DataView, index: number, value: number): void;
}

function elementCodec(dtype: SafetensorsDtype): ElementCodec {
  if (dtype === 'F32') {
    return {
      read: (view, index) => view.getFloat32(4 * index, true),
      write: (view, index, value) => {
        assert.equal(Math.fround(value), value, `${value} is not exact in F32`);
        view.setFloat32(4 * index, value, true);
      },
    };
  }
  const [round, widen] = dtype === 'BF16' ? [roundF32BitsToBf16Bits, bf16BitsToNumber] : dtype === 'F16' ? [roundF32BitsToF16Bits, f16BitsToNumber] : [];
  if (round === undefined || widen === undefined) throw new Error(`no codec for ${dtype}`);
  const f32 = new DataView(new ArrayBuffer(4));
  return {
    read: (view, index) => widen(view.getUint16(2 * index, true)),
    write: (view, index, value) => {
      f32.setFloat32(0, value);
      const bits = round(f32.getUint32(0));
      assert.equal(widen(bits), value, `${value} is not exact in ${dtype}`);
      view.setUint16(2 * index, bits, true);
    },
  };
}

/**
 * In every layer of a one-file checkpoint: gate and up rows of down_proj's segment 7 become those
 * of its segment 0 (the same SwiGLU outputs, bit for bit), segment 0's down columns are scaled by
 * CANCEL_SCALE and segment 7's are their negation, so the two partials are exact opposites.
 */
function cancelFirstSegmentWithLast(modelDir: string, numLayers: number, intermediateSize: number): void {
  const file = path.join(modelDir, 'model.safetensors');
  const header = readSafetensorsHeader(file);
  const firstEnd = segmentBegin(intermediateSize, 1);
  const lastBegin = segmentBegin(intermediateSize, REDUCTION_SEGMENTS - 1);
  assert.equal(intermediateSize - lastBegin, firstEnd, 'segments 0 and 7 are as wide');
  const fd = openSync(file, 'r+');
  try {
    const rewrite = (name: string, edit: (view: DataView, rows: number, columns: number) => void) => {
      const info = header.tensors.get(name)!;
      const bytes = readTensorBytes(file, info);
      edit(new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength), info.shape[0], info.shape[1]);
      writeSync(fd, bytes, 0, bytes.byteLength, info.dataBegin);
    };
    for (let layer = 0; layer < numLayers; layer++) {
      for (const projection of ['gate_proj', 'up_proj']) {
        rewrite(`model.layers.${layer}.mlp.${projection}.weight`, (view, rows) => {
          const rowBytes = view.byteLength / rows;
          const bytes = new Uint8Array(view.buffer, view.byteOffset, view.byteLength);
          bytes.copyWithin(lastBegin * rowBytes, 0, firstEnd * rowBytes);
        });
      }
      const { dtype } = header.tensors.get(`model.layers.${layer}.mlp.down_proj.weight`)!;
      const codec = elementCodec(dtype);
      rewrite(`model.layers.${layer}.mlp.down_proj.weight`, (view, rows, columns) => {
        for (let row = 0; row < rows; row++) {
          for (let j = 0; j < firstEnd; j++) {
            const scaled = codec.read(view, row * columns + j) * CANCEL_SCALE;
            codec.write(view, row * columns + j, scaled);
            codec.write(view, row * columns + lastBegin + j, -scaled);
          }
        }
      });
    }
  } finally {
    closeSync(fd);
  }
}

test('a prompt\'s row-parallel partials summed per tile match them summed after the matmul, where two segments cancel and any other order rounds differently', async (t) => {
  using temp = makeTempDir('invariance-cancel');
  const seed = freshSeed(t);
  const numLayers = 2;
  const intermediateSize = 200;
  const vocabSize = 300;
  const prompt = randomTokens(TARGET_PROMPT_TOKENS, vocabSize, seed);
  const sampling = targetSettings(seed, prompt)['plain sampling'];
  for (const { dtype, quantization } of MODES) {
    const modelDir = writeCheckpoint(temp.dir, `${dtype}-${quantization}`, {
      arch: 'qwen2', hiddenSize: 48, numLayers, numHeads: 3, numKvHeads: 1, intermediateSize, vocabSize, dtype, seed,
    });
    cancelFirstSegmentWithLast(modelDir, numLayers, intermediateSize);
    for (const kernel of KERNELS) {
      await t.test(`${dtype} weights, ${quantization === 'int8' ? 'int8, ' : ''}${kernel}`, { skip: kernelSkip(kernel) }, async () => {
        const options = loadOptions(modelDir, { kernel, quantization, numKvBlocks: (NUM_COMPANIONS + 2) * MAX_BLOCKS_PER_SEQ, blockSizeTokens: BLOCK_SIZE_TOKENS });
        const label = (scenario: string) => `seed ${seed}, ${dtype}, ${quantization}, ${kernel}, cancelling segments, ${scenario}`;
        await withModel(options, async (model) => {
          // The whole prompt in one pass: more than one 48-row block.
          const reference = await runTarget(model, makeSequence(prompt, TARGET_PROMPT_TOKENS, 0, sampling), [], 0);
          for (const row of reference.logits) assert.ok(row.every(Number.isFinite), label('finite logits'));
          for (const chunkTokens of [1, 7]) {
            const chunked = await runTarget(model, makeSequence(prompt, chunkTokens, 0, sampling), [], 0);
            assertBitwiseEqual(chunked, reference, label(`chunks of ${chunkTokens}`));
          }
        });
      });
    }
  }
});
