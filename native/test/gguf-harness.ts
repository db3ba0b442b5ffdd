// What the GGUF tests share: one target's trace, alone, and the float files' test (an F32 or BF16
// GGUF computes bitwise the logits of the safetensors it was written from) over a set of shapes.
import { test } from 'node:test';
import path from 'node:path';
import { writeLlamaGguf } from '../../tools/llama-gguf.ts';
import type { LoadOptions, WeightDtype } from '../api.ts';
import { KERNELS, freshSeed, kernelSkip, loadOptions, makeTempDir, randomTokens, withModel, writeCheckpoint, type ShapeOptions } from './helpers.ts';
import { assertBitwiseEqual, makeSequence, runTarget, targetSettings, type Trace } from './invariance-harness.ts';

/** A prompt's plain-sampling trace, alone, in chunks of 16. */
export async function trace(options: LoadOptions, prompt: number[], seed: number): Promise<Trace> {
  const sampling = targetSettings(seed, prompt)['plain sampling'];
  return withModel(options, (model) => runTarget(model, makeSequence(prompt, 16, 0, sampling), [], 0));
}

/** One test per shape and float dtype: the GGUF our writer makes of a fresh checkpoint, bitwise against it on every kernel path. */
export function testFloatGgufs(shapes: Readonly<Record<string, ShapeOptions>>, vocabSize: number, promptTokens: number): void {
  for (const [family, shape] of Object.entries(shapes)) {
    for (const dtype of ['fp32', 'bf16'] as const satisfies readonly WeightDtype[]) {
      test(`${family}: a ${dtype} GGUF computes bitwise the logits of the safetensors it was written from`, async (t) => {
        using temp = makeTempDir('gguf-float');
        const seed = freshSeed(t);
        const dir = writeCheckpoint(temp.dir, family, { ...shape, dtype, seed });
        const file = path.join(temp.dir, 'model.gguf');
        writeLlamaGguf(dir, file);
        const prompt = randomTokens(promptTokens, vocabSize, seed);
        for (const kernel of KERNELS) {
          await t.test(kernel, { skip: kernelSkip(kernel) }, async () => {
            const expected = await trace(loadOptions(dir, { kernel }), prompt, seed);
            const actual = await trace(loadOptions(file, { kernel }), prompt, seed);
            assertBitwiseEqual(actual, expected, `seed ${seed}, ${family}, ${dtype}, ${kernel}`);
          });
        }
      });
    }
  }
}
