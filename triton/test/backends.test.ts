// The ONNX Runtime and script backends and ensembles, on the models that ship in models/.
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { heldOutDigits, makeFraud, NUM_CLASSES } from '../../tools/make-classic-models.ts';
import { writeModel } from '../../tools/onnx/writer.ts';
import { within } from '../../test/wait.ts';
import { ClassicError } from '../errors.ts';
import { ModelRepository } from '../repository.ts';
import type { Tensor } from '../tensor.ts';

const MODELS_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../models');

/** The longest one request may take: a batcher holding one (its queue delay ignored) fails the test that sent it, by name. */
const INFER_BOUND_MS = 20_000;

function infer(repo: ModelRepository, model: string, inputs: Record<string, Tensor>, requestedOutputs: string[] | null = null) {
  return within(repo.infer(model, null, { inputs, requestedOutputs, priority: 0, timeoutUs: 0 }), `a request to '${model}' was not answered`, INFER_BOUND_MS);
}

function argmaxRows(probs: Float32Array, numClasses: number): number[] {
  const out: number[] = [];
  for (let row = 0; row * numClasses < probs.length; row++) {
    const slice = probs.subarray(row * numClasses, (row + 1) * numClasses);
    out.push(slice.indexOf(Math.max(...slice)));
  }
  return out;
}

describe('the models in models/', () => {
  let repo: ModelRepository;
  before(async () => {
    repo = new ModelRepository({ repoDir: MODELS_DIR, mode: 'none', pollIntervalMs: 1000, startupModels: [] });
    await within(repo.start(), 'the repository did not load');
  });
  after(() => within(repo.close(), 'the repository did not close'));

  test('every model loads; the LLM checkpoint beside them is not a repository model', () => {
    assert.deepEqual(repo.index(false).map((e) => `${e.name}:${e.version}:${e.state}`),
      ['accumulator:1:READY', 'digits:1:READY', 'digits_pipeline:1:READY', 'digits_postprocess:1:READY', 'digits_preprocess:1:READY', 'fraud:1:READY']);
  });

  test('digits classifies held-out handwritten digits (ONNX Runtime), softmax rows sum to 1', async () => {
    const { images, labels } = heldOutDigits(100, 4242);
    const pixels = new Float32Array(100 * 64);
    images.forEach((image, i) => image.forEach((value, j) => { pixels[i * 64 + j] = value / 255; }));
    const { probabilities } = await infer(repo, 'digits', { pixels: { datatype: 'FP32', shape: [100, 64], data: pixels } });
    assert.deepEqual(probabilities.shape, [100, NUM_CLASSES]);
    const probs = probabilities.data as Float32Array;
    for (let row = 0; row < 100; row++) {
      const sum = probs.subarray(row * 10, row * 10 + 10).reduce((a, b) => a + b, 0);
      assert.ok(Math.abs(sum - 1) < 1e-5);
    }
    const correct = argmaxRows(probs, NUM_CLASSES).filter((label, i) => label === labels[i]).length;
    // 97.8 % held-out accuracy: 11 or more errors in 100 has odds of about 1e-5.
    assert.ok(correct >= 90, `${correct}/100 correct`);
  });

  test("the ensemble's label equals the classifier's argmax", async () => {
    const { images } = heldOutDigits(64, 77);
    const raw = new Uint8Array(64 * 64);
    images.forEach((image, i) => raw.set(image, i * 64));
    const pipeline = await infer(repo, 'digits_pipeline', { RAW_PIXELS: { datatype: 'UINT8', shape: [64, 64], data: raw } });
    const direct = await infer(repo, 'digits', { pixels: { datatype: 'FP32', shape: [64, 64], data: Float32Array.from(raw, (v) => v / 255) } });
    const labels = (pipeline.LABEL.data as Uint8Array[]).map((bytes) => Number(new TextDecoder().decode(bytes)));
    assert.deepEqual(pipeline.LABEL.shape, [64, 1]);
    assert.deepEqual(labels, argmaxRows(direct.probabilities.data as Float32Array, NUM_CLASSES));
    assert.deepEqual(pipeline.PROBABILITIES.data, direct.probabilities.data);
  });

  test('fraud scores are probabilities, higher for the riskier transaction', async () => {
    const { features } = makeFraud(32, 5);
    const data = new Float32Array(32 * 8);
    features.forEach((row, i) => data.set(row, i * 8));
    const risky = Float32Array.of(900, 3, 400, 0.95, 9, 1, 0, 5);
    const safe = Float32Array.of(12, 14, 1, 0.05, 1, 0, 1, 3000);
    data.set(risky, 0);
    data.set(safe, 8);
    const { fraud_probability: scores } = await infer(repo, 'fraud', { features: { datatype: 'FP32', shape: [32, 8], data } });
    assert.deepEqual(scores.shape, [32, 1]);
    const values = scores.data as Float32Array;
    assert.ok(values.every((p) => p >= 0 && p <= 1));
    assert.ok(values[0] > 0.5 && values[1] < 0.05, `risky ${values[0]}, safe ${values[1]}`);
  });

  test('requests that do not fit the config are refused with Triton\'s messages', async () => {
    const invalid = (pattern: RegExp) => (err: unknown) => err instanceof ClassicError && err.status === 'INVALID_ARG' && pattern.test(err.message);
    await assert.rejects(infer(repo, 'digits', { pixels: { datatype: 'FP32', shape: [64], data: new Float32Array(64) } }),
      invalid(/^unexpected shape for input 'pixels' for model 'digits'\. Expected \[-1,64\], got \[64\]\. NOTE: Setting a non-zero max_batch_size/));
    await assert.rejects(infer(repo, 'digits', { pixels: { datatype: 'FP64', shape: [1, 64], data: new Float64Array(64) } }),
      invalid(/^inference input 'pixels' data-type is 'FP64', but model 'digits' expects 'FP32'$/));
    await assert.rejects(infer(repo, 'digits', { pixels: { datatype: 'FP32', shape: [129, 64], data: new Float32Array(129 * 64) } }),
      invalid(/^inference request batch-size must be <= 128 for 'digits'$/));
    await assert.rejects(infer(repo, 'digits', {}), invalid(/missing required input\(s\) \['pixels'\]/));
    await assert.rejects(infer(repo, 'digits', { pixels: { datatype: 'FP32', shape: [1, 64], data: new Float32Array(64) } }, ['nope']),
      invalid(/^unexpected inference output 'nope' for model 'digits'$/));
    await assert.rejects(infer(repo, 'nope', {}), (err: unknown) => err instanceof ClassicError && err.status === 'NOT_FOUND');
  });
});

describe('ONNX Runtime off the event loop', () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-heavy-'));
  let repo: ModelRepository;
  before(async () => {
    // 64 chained 384x384 MatMuls (about 7 GFLOP at batch 1024): long enough that a session run on the loop would stall it visibly.
    const width = 384;
    const numLayers = 64;
    const weights = new Float32Array(width * width).map((_, i) => ((i * 7919) % 13 - 6) / (13 * width));
    mkdirSync(path.join(dir, 'heavy', '1'), { recursive: true });
    writeModel(path.join(dir, 'heavy', '1', 'model.onnx'), {
      name: 'heavy', docString: 'test',
      nodes: Array.from({ length: numLayers }, (_, i) => ({ opType: 'MatMul', inputs: [i === 0 ? 'x' : `h${i}`, 'w'], outputs: [i === numLayers - 1 ? 'y' : `h${i + 1}`] })),
      initializers: [{ name: 'w', dims: [width, width], data: weights }],
      inputs: [{ name: 'x', elemType: 1, dims: ['batch', width] }],
      outputs: [{ name: 'y', elemType: 1, dims: ['batch', width] }],
    });
    writeFileSync(path.join(dir, 'heavy', 'config.pbtxt'), `platform: "onnxruntime_onnx"\nmax_batch_size: 1024
input [ { name: "x" data_type: TYPE_FP32 dims: [ ${width} ] } ]\noutput [ { name: "y" data_type: TYPE_FP32 dims: [ ${width} ] } ]`);
    repo = new ModelRepository({ repoDir: dir, mode: 'none', pollIntervalMs: 1000, startupModels: [] });
    await within(repo.start(), 'the repository did not load');
  });
  after(async () => {
    await within(repo.close(), 'the repository did not close');
    rmSync(dir, { recursive: true, force: true });
  });

  test('timers keep firing while a session runs', async () => {
    const rows = 1024;
    let maxGapMs = 0;
    let lastMs = performance.now();
    const ticker = setInterval(() => {
      const nowMs = performance.now();
      maxGapMs = Math.max(maxGapMs, nowMs - lastMs);
      lastMs = nowMs;
    }, 2);
    const startMs = performance.now();
    await infer(repo, 'heavy', { x: { datatype: 'FP32', shape: [rows, 384], data: new Float32Array(rows * 384).fill(0.5) } });
    const runMs = performance.now() - startMs;
    clearInterval(ticker);
    const { compute_infer: computeInfer } = repo.get('heavy', null).stats.stats.inference_stats;
    assert.ok(computeInfer.ns / 1e6 > 4 * maxGapMs, `the run took ${runMs.toFixed(0)} ms; the loop's longest gap was ${maxGapMs.toFixed(1)} ms`);
  });
});

describe('a script model in plain JavaScript', () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-script-js-'));
  let repo: ModelRepository;
  before(async () => {
    mkdirSync(path.join(dir, 'double', '1'), { recursive: true });
    writeFileSync(path.join(dir, 'double', '1', 'model.js'), `export function execute({ X }) {
  return { Y: { datatype: 'FP32', shape: X.shape, data: X.data.map((value) => 2 * value) } };
}\n`);
    writeFileSync(path.join(dir, 'double', 'config.pbtxt'), `backend: "script"\nmax_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]\noutput [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]`);
    repo = new ModelRepository({ repoDir: dir, mode: 'none', pollIntervalMs: 1000, startupModels: [] });
    await within(repo.start(), 'the repository did not load');
  });
  after(async () => {
    await within(repo.close(), 'the repository did not close');
    rmSync(dir, { recursive: true, force: true });
  });

  test('model.js serves where there is no model.ts', async () => {
    const { Y } = await infer(repo, 'double', { X: { datatype: 'FP32', shape: [1, 2], data: new Float32Array([1.5, -2]) } });
    assert.deepEqual(Array.from(Y.data as Float32Array), [3, -4]);
  });
});
