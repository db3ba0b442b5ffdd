import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync, mkdirSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
  DEFAULT_OPTIONS,
  buildConfig,
  checkpointTensorSpecs,
  toPythonJson,
  writeRandomCheckpoint,
  type CheckpointOptions,
} from '../../tools/make-checkpoint.ts';
import { writeSafetensors } from '../../tools/safetensors-writer.ts';
import { readCheckpointTensors, readTensorF64 } from '../../native/safetensors.ts';
import {
  applyRope,
  loadReferenceModel,
  parseReferenceConfig,
  referenceLogits,
  relativeError,
  ropeInverseFrequencies,
  type ReferenceModel,
} from './llama-reference.ts';

function withTempDir(fn: (dir: string) => void): void {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'llama-reference-test-'));
  try {
    fn(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** hidden 2, one head of dim 2, ffn 1, vocab 3, one layer: small enough to check by hand. */
function handOptions(outDir: string, overrides: Partial<CheckpointOptions> = {}): CheckpointOptions {
  return {
    ...DEFAULT_OPTIONS,
    outDir,
    hiddenSize: 2,
    numLayers: 1,
    numHeads: 1,
    numKvHeads: 1,
    intermediateSize: 1,
    vocabSize: 3,
    dtype: 'fp32',
    ...overrides,
  };
}

/** Writes config.json and model.safetensors from hand-set values; every tensor must be given. */
function writeHandCheckpoint(options: CheckpointOptions, values: Record<string, number[]>): void {
  mkdirSync(options.outDir, { recursive: true });
  writeFileSync(path.join(options.outDir, 'config.json'), toPythonJson(buildConfig(options)));
  const specs = checkpointTensorSpecs(options);
  writeSafetensors(path.join(options.outDir, 'model.safetensors'), specs, (spec) => {
    const data = values[spec.name.replace(/^model\.layers\.0\./, '')] ?? values[spec.name];
    if (data === undefined) throw new Error(`test gives no values for ${spec.name}`);
    return new Float32Array(data);
  });
}

const EPS = DEFAULT_OPTIONS.rmsNormEps;
const rms = (x: number[], w: number[] = [1, 1]) => {
  const scale = 1 / Math.sqrt((x[0] ** 2 + x[1] ** 2) / 2 + EPS);
  return [x[0] * scale * w[0], x[1] * scale * w[1]];
};
const silu = (x: number) => x / (1 + Math.exp(-x));
const LM_HEAD = [1, 0, 0, 1, 1, 1]; // logits = [h0, h1, h0 + h1]
const headLogits = (h: number[]) => [h[0], h[1], h[0] + h[1]];

/** Zero q and k make every attention weight equal, so the attention output is the mean of the visible values. */
const uniformAttention = {
  'input_layernorm.weight': [1, 1],
  'self_attn.q_proj.weight': [0, 0, 0, 0],
  'self_attn.k_proj.weight': [0, 0, 0, 0],
  'post_attention_layernorm.weight': [1, 1],
  'model.embed_tokens.weight': [3, 4, 1, 0, 0, -2],
  'lm_head.weight': LM_HEAD,
};

/** No MLP contribution and a unit final norm: the residual stream goes straight to the head. */
const noMlp = {
  'mlp.gate_proj.weight': [0, 0],
  'mlp.up_proj.weight': [0, 0],
  'mlp.down_proj.weight': [0, 0],
  'model.norm.weight': [1, 1],
};

/** The embedding rows of tokens 0, 1 and 2. */
const EMBEDDINGS = [
  [3, 4],
  [1, 0],
  [0, -2],
];

function assertClose(actual: ArrayLike<number>, expected: ArrayLike<number>, message: string): void {
  assert.equal(actual.length, expected.length, message);
  for (let i = 0; i < expected.length; i++) {
    assert.ok(Math.abs(actual[i] - expected[i]) <= 1e-12 * Math.max(1, Math.abs(expected[i])), `${message}[${i}]: ${actual[i]} vs ${expected[i]}`);
  }
}

test('one hand-set llama layer: RMSNorm, uniform attention, SwiGLU MLP, final norm and lm_head', () => {
  withTempDir((dir) => {
    writeHandCheckpoint(handOptions(dir), {
      ...uniformAttention,
      'self_attn.v_proj.weight': [1, 0, 0, 1],
      'self_attn.o_proj.weight': [2, 0, 0, 1],
      'mlp.gate_proj.weight': [1, 0],
      'mlp.up_proj.weight': [0, 1],
      'mlp.down_proj.weight': [1, 0],
      'model.norm.weight': [1, 0.5],
    });
    const logits = referenceLogits(loadReferenceModel(dir), [0, 1]);

    const embeddings = [
      [3, 4],
      [1, 0],
    ];
    const normed = embeddings.map((e) => rms(e));
    const attended = [normed[0], [(normed[0][0] + normed[1][0]) / 2, (normed[0][1] + normed[1][1]) / 2]];
    embeddings.forEach((e, t) => {
      const afterAttention = [e[0] + 2 * attended[t][0], e[1] + attended[t][1]];
      const h = rms(afterAttention);
      const afterMlp = [afterAttention[0] + silu(h[0]) * h[1], afterAttention[1]];
      assertClose(logits[t], headLogits(rms(afterMlp, [1, 0.5])), `position ${t}`);
    });
    // The first position's logits worked on paper (ε = 1e-6), independently of the helpers above:
    // residual after attention [3 + 6/√12.5, 4 + 4/√12.5] = [4.697056, 5.131371]; normed
    // [0.954878, 1.043172]; after the MLP [4.697056 + silu(0.954878) × 1.043172, 5.131371] =
    // [5.416337, 5.131371]; final norm with weights [1, 0.5] and the head: [h0, h1, h0 + h1].
    [1.026642236, 0.486314108, 1.512956344].forEach((expected, i) =>
      assert.ok(Math.abs(logits[0][i] - expected) < 1e-8, `position 0, logit ${i}: ${logits[0][i]} vs ${expected} worked on paper`),
    );
  });
});

test('Qwen2 q/k/v biases are added: a zero v_proj with bias b yields b at every position', () => {
  withTempDir((dir) => {
    writeHandCheckpoint(handOptions(dir, { arch: 'qwen2' }), {
      ...uniformAttention,
      'self_attn.q_proj.bias': [5, -5],
      'self_attn.k_proj.bias': [0.5, 0.25],
      'self_attn.v_proj.weight': [0, 0, 0, 0],
      'self_attn.v_proj.bias': [1, 2],
      'self_attn.o_proj.weight': [1, 0, 0, 1],
      ...noMlp,
    });
    const logits = referenceLogits(loadReferenceModel(dir), [0, 1, 2]);
    EMBEDDINGS.forEach((e, t) => assertClose(logits[t], headLogits(rms([e[0] + 1, e[1] + 2])), `position ${t}`));
  });
});

test('Mistral sliding_window 2: each query sees itself and one position back', () => {
  withTempDir((dir) => {
    writeHandCheckpoint(handOptions(dir, { arch: 'mistral', slidingWindow: 2 }), {
      ...uniformAttention,
      'self_attn.v_proj.weight': [1, 0, 0, 1],
      'self_attn.o_proj.weight': [1, 0, 0, 1],
      ...noMlp,
    });
    const logits = referenceLogits(loadReferenceModel(dir), [0, 1, 2]);
    const normed = EMBEDDINGS.map((e) => rms(e));
    const visible = [[0], [0, 1], [1, 2]];
    EMBEDDINGS.forEach((e, t) => {
      const mean = [0, 1].map((d) => visible[t].reduce((sum, j) => sum + normed[j][d], 0) / visible[t].length);
      assertClose(logits[t], headLogits(rms([e[0] + mean[0], e[1] + mean[1]])), `position ${t}`);
    });
  });
});

test('RoPE pairs element i with i + headDim/2 and rotates by position · invFreq', () => {
  const invFreq = new Float64Array([1, 0.5]);
  const x = new Float64Array([1, 0, 0, 0]);
  applyRope(x, 0, 4, 3, invFreq);
  assertClose(x, [Math.cos(3), 0, Math.sin(3), 0], 'unit vector on the first pair');

  const y = new Float64Array([9, 1, 2, 3, 4, 9]);
  applyRope(y, 1, 4, 0, invFreq);
  assert.deepEqual([...y], [9, 1, 2, 3, 4, 9], 'position 0 is the identity and nothing outside the head moves');
});

test('RoPE scores depend only on relative position, and rotation keeps the norm', () => {
  const headDim = 8;
  const invFreq = ropeInverseFrequencies({ headDim, ropeTheta: 10000, ropeScaling: null });
  const q = new Float64Array([0.3, -1.2, 0.7, 2.1, -0.4, 0.9, 1.5, -0.6]);
  const k = new Float64Array([1.1, 0.2, -0.8, 0.5, 0.3, -1.7, 0.4, 0.6]);
  const rotatedDot = (qPosition: number, kPosition: number) => {
    const qr = q.slice();
    const kr = k.slice();
    applyRope(qr, 0, headDim, qPosition, invFreq);
    applyRope(kr, 0, headDim, kPosition, invFreq);
    return qr.reduce((sum, v, i) => sum + v * kr[i], 0);
  };
  for (const shift of [1, 17, 1000]) {
    assert.ok(Math.abs(rotatedDot(7, 3) - rotatedDot(7 + shift, 3 + shift)) < 1e-9, `shift ${shift}`);
  }
  const rotated = q.slice();
  applyRope(rotated, 0, headDim, 123, invFreq);
  const norm = (v: Float64Array) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
  assert.ok(Math.abs(norm(rotated) - norm(q)) < 1e-12);
});

test('inverse frequencies: default base^(-2i/d), and llama3 scaling band by band', () => {
  assertClose(ropeInverseFrequencies({ headDim: 4, ropeTheta: 10000, ropeScaling: null }), [1, 0.01], 'default');
  const scaled = ropeInverseFrequencies({
    headDim: 8,
    ropeTheta: 10000,
    ropeScaling: { factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 1000 },
  });
  // Unscaled [1, 0.1, 0.01, 0.001] have wavelengths 2π·[1, 10, 100, 1000]; the bands are
  // wavelength < 1000/4 (kept), > 1000/1 (divided by 8), and between (smoothly interpolated).
  const smooth = (1000 / (2 * Math.PI * 100) - 1) / (4 - 1);
  assertClose(scaled, [1, 0.1, ((1 - smooth) * 0.01) / 8 + smooth * 0.01, 0.001 / 8], 'llama3');
});

/** The same weights with each kv head repeated for its query heads: plain multi-head attention. */
function expandToMultiHead(model: ReferenceModel): ReferenceModel {
  const { numHeads, numKvHeads, headDim, hiddenSize } = model.config;
  const repeatRows = (weight: Float64Array) => {
    const out = new Float64Array(numHeads * headDim * hiddenSize);
    const rowsPerHead = headDim * hiddenSize;
    for (let h = 0; h < numHeads; h++) {
      const kvHead = Math.floor(h / (numHeads / numKvHeads));
      out.set(weight.subarray(kvHead * rowsPerHead, (kvHead + 1) * rowsPerHead), h * rowsPerHead);
    }
    return out;
  };
  return {
    ...model,
    config: { ...model.config, numKvHeads: numHeads },
    layers: model.layers.map((layer) => ({ ...layer, kProj: repeatRows(layer.kProj), vProj: repeatRows(layer.vProj) })),
  };
}

function smallRandomOptions(outDir: string, overrides: Partial<CheckpointOptions> = {}): CheckpointOptions {
  return {
    ...DEFAULT_OPTIONS,
    outDir,
    hiddenSize: 32,
    numLayers: 2,
    numHeads: 4,
    numKvHeads: 2,
    intermediateSize: 48,
    vocabSize: 50,
    dtype: 'fp32',
    seed: 11,
    ...overrides,
  };
}

const PROMPT = [3, 17, 42, 5, 5, 31, 0, 49];

test('GQA equals multi-head attention with each kv head repeated', () => {
  withTempDir((dir) => {
    writeRandomCheckpoint(smallRandomOptions(dir));
    const gqa = loadReferenceModel(dir);
    const gqaLogits = referenceLogits(gqa, PROMPT);
    const mhaLogits = referenceLogits(expandToMultiHead(gqa), PROMPT);
    gqaLogits.forEach((logits, t) => assert.ok(relativeError(logits, mhaLogits[t]) < 1e-14, `position ${t}`));
    // The grouping matters: pairing query heads with the wrong kv heads changes the logits.
    const swapped = { ...gqa, layers: gqa.layers.map((l) => ({ ...l, kProj: swapHalves(l.kProj), vProj: swapHalves(l.vProj) })) };
    assert.ok(relativeError(referenceLogits(swapped, PROMPT).at(-1)!, gqaLogits.at(-1)!) > 1e-3);
  });
});

function swapHalves(weight: Float64Array): Float64Array {
  const half = weight.length / 2;
  const out = new Float64Array(weight.length);
  out.set(weight.subarray(half), 0);
  out.set(weight.subarray(0, half), half);
  return out;
}

test('explicit head_dim, Qwen2 biases and llama3 rope_scaling load and run with non-trivial logits', () => {
  withTempDir((dir) => {
    writeRandomCheckpoint(smallRandomOptions(dir, { arch: 'qwen2', headDim: 12, ropeScalingLlama3: true, dtype: 'bf16' }));
    const model = loadReferenceModel(dir);
    assert.equal(model.config.headDim, 12);
    assert.equal(model.layers[0].qProj.length, 4 * 12 * 32);
    assert.ok(model.layers[1].vBias !== null);
    const logits = referenceLogits(model, PROMPT);
    for (const position of logits) {
      const mean = position.reduce((s, v) => s + v, 0) / position.length;
      const std = Math.sqrt(position.reduce((s, v) => s + (v - mean) ** 2, 0) / position.length);
      assert.ok(Number.isFinite(std) && std > 0.2 && std < 5, `logit std ${std}`);
    }
  });
});

test('logits at a position do not depend on later tokens (causal)', () => {
  withTempDir((dir) => {
    writeRandomCheckpoint(smallRandomOptions(dir));
    const model = loadReferenceModel(dir);
    const full = referenceLogits(model, PROMPT);
    const prefix = referenceLogits(model, PROMPT.slice(0, 5));
    prefix.forEach((logits, t) => assert.deepEqual(logits, full[t], `position ${t}`));
  });
});

test('a Mistral window only changes positions that reach past it', () => {
  withTempDir((dir) => {
    writeRandomCheckpoint(smallRandomOptions(dir, { arch: 'mistral', slidingWindow: 3 }));
    const windowed = loadReferenceModel(dir);
    const unlimited = { ...windowed, config: { ...windowed.config, slidingWindowTokens: null } };
    const windowedLogits = referenceLogits(windowed, PROMPT);
    const fullLogits = referenceLogits(unlimited, PROMPT);
    for (let t = 0; t < 3; t++) assert.deepEqual(windowedLogits[t], fullLogits[t], `position ${t}`);
    for (let t = 3; t < PROMPT.length; t++) assert.ok(relativeError(windowedLogits[t], fullLogits[t]) > 1e-6, `position ${t}`);
  });
});

test('tied checkpoints use the embedding as lm_head; bf16 weights are widened, not re-rounded', () => {
  withTempDir((dir) => {
    writeRandomCheckpoint(smallRandomOptions(dir, { tieWordEmbeddings: true, dtype: 'bf16' }));
    const model = loadReferenceModel(dir);
    assert.equal(model.lmHead, model.embedTokens);
    const checkpoint = readCheckpointTensors(dir);
    const name = 'model.layers.1.mlp.down_proj.weight';
    const stored = checkpoint.tensors.get(name)!;
    assert.equal(stored.dtype, 'BF16');
    const values = model.layers[1].downProj;
    assert.deepEqual(values, readTensorF64(stored.file, checkpoint.headers.get(stored.file)!, name));
    const bits = new Uint32Array(new Float32Array(values).buffer);
    assert.ok(bits.every((b) => (b & 0xffff) === 0), 'every value is exactly a bf16');
  });
});

test('relativeError is the largest deviation over the largest reference magnitude', () => {
  assert.equal(relativeError([1, 2, 3], [1, 2, 4]), 0.25);
  assert.equal(relativeError([-8, 0], [-8, 0]), 0);
  assert.throws(() => relativeError([1], [1, 2]), /1 logits vs 2/);
});

test('unsupported configs are refused with the file and field', () => {
  const base = buildConfig({ ...handOptions('/unused') });
  const plain = JSON.parse(toPythonJson(base));
  assert.throws(() => parseReferenceConfig({ ...plain, rope_scaling: { rope_type: 'yarn', factor: 2 } }, 'c.json'), /^Error: c\.json: rope_scaling type "yarn"/);
  assert.throws(() => parseReferenceConfig({ ...plain, architectures: ['GPT2LMHeadModel'] }, 'c.json'), /c\.json: architectures\[0\]/);
  assert.throws(
    () => parseReferenceConfig({ ...plain, architectures: ['Qwen2ForCausalLM'], use_sliding_window: true }, 'c.json'),
    /use_sliding_window/,
  );
  assert.throws(() => parseReferenceConfig({ ...plain, num_key_value_heads: 3, num_attention_heads: 4 }, 'c.json'), /multiple/);
  assert.equal(parseReferenceConfig({ ...plain, rope_scaling: { type: 'default' } }, 'c.json').ropeScaling, null);
});
