// The fp64 reference forward pass that the C++ runtime's logits are checked against. It is
// written to be obviously correct, not fast: plain loops, no cache, full causal attention
// recomputed for every call, weights widened exactly from their stored dtype (bf16/fp16 values
// are not re-rounded). It follows transformers' Llama, Mistral and Qwen2 modeling code.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import type { Architecture } from '../../native/api.ts';
import { readCheckpointTensors, readTensorF64, type CheckpointTensors } from '../../native/safetensors.ts';

export interface Llama3RopeScaling {
  factor: number;
  lowFreqFactor: number;
  highFreqFactor: number;
  originalMaxPositionEmbeddings: number;
}

export interface ReferenceConfig {
  architecture: Architecture;
  hiddenSize: number;
  intermediateSize: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  vocabSize: number;
  rmsNormEps: number;
  ropeTheta: number;
  ropeScaling: Llama3RopeScaling | null;
  /**
   * Mistral's sliding_window: a query at position p attends to keys at positions in
   * (p - slidingWindowTokens, p], the last slidingWindowTokens positions including itself.
   * This is the contract the C++ runtime must match (transformers' masking_utils convention).
   * null means full causal attention.
   */
  slidingWindowTokens: number | null;
  tieWordEmbeddings: boolean;
  hasQkvBias: boolean;
}

export interface ReferenceLayer {
  inputNorm: Float64Array; // [hidden]
  qProj: Float64Array; // [numHeads * headDim, hidden]
  kProj: Float64Array; // [numKvHeads * headDim, hidden]
  vProj: Float64Array; // [numKvHeads * headDim, hidden]
  qBias: Float64Array | null;
  kBias: Float64Array | null;
  vBias: Float64Array | null;
  oProj: Float64Array; // [hidden, numHeads * headDim]
  postAttentionNorm: Float64Array; // [hidden]
  gateProj: Float64Array; // [intermediate, hidden]
  upProj: Float64Array; // [intermediate, hidden]
  downProj: Float64Array; // [hidden, intermediate]
}

export interface ReferenceModel {
  config: ReferenceConfig;
  embedTokens: Float64Array; // [vocab, hidden]
  layers: ReferenceLayer[];
  finalNorm: Float64Array; // [hidden]
  /** The embedding matrix itself when tied. */
  lmHead: Float64Array; // [vocab, hidden]
  /** RoPE inverse frequencies, [headDim / 2], after rope_scaling. */
  invFreq: Float64Array;
}

const ARCHITECTURES: readonly Architecture[] = ['LlamaForCausalLM', 'MistralForCausalLM', 'Qwen2ForCausalLM'];

export function parseReferenceConfig(raw: Record<string, unknown>, source: string): ReferenceConfig {
  const fail = (message: string): never => {
    throw new Error(`${source}: ${message}`);
  };
  const integer = (key: string, fallback?: number): number => {
    const value = raw[key] ?? fallback;
    if (!Number.isSafeInteger(value) || (value as number) < 1) fail(`${key} must be a positive integer, got ${JSON.stringify(value)}`);
    return value as number;
  };
  const number = (key: string, fallback: number): number => {
    const value = raw[key] ?? fallback;
    if (typeof value !== 'number' || !Number.isFinite(value)) fail(`${key} must be a number, got ${JSON.stringify(value)}`);
    return value as number;
  };
  const architecture = Array.isArray(raw.architectures) ? raw.architectures[0] : undefined;
  if (!ARCHITECTURES.includes(architecture)) fail(`architectures[0] ${JSON.stringify(architecture)} is not one of ${ARCHITECTURES.join(', ')}`);
  if ((raw.hidden_act ?? 'silu') !== 'silu') fail(`hidden_act ${JSON.stringify(raw.hidden_act)} is not silu`);
  if (raw.attention_bias === true || raw.mlp_bias === true) fail('attention_bias / mlp_bias are not supported');
  if (architecture === 'Qwen2ForCausalLM' && raw.use_sliding_window === true) fail('Qwen2 use_sliding_window is not supported');

  const hiddenSize = integer('hidden_size');
  const numHeads = integer('num_attention_heads');
  const numKvHeads = integer('num_key_value_heads', numHeads);
  if (numHeads % numKvHeads !== 0) fail(`num_attention_heads ${numHeads} is not a multiple of num_key_value_heads ${numKvHeads}`);
  const headDim = integer('head_dim', hiddenSize / numHeads);
  if (headDim % 2 !== 0) fail(`head_dim ${headDim} must be even for RoPE`);
  const slidingWindow = architecture === 'MistralForCausalLM' ? (raw.sliding_window ?? null) : null;
  if (slidingWindow !== null && !(Number.isSafeInteger(slidingWindow) && (slidingWindow as number) >= 1)) {
    fail(`sliding_window must be a positive integer or null, got ${JSON.stringify(slidingWindow)}`);
  }
  return {
    architecture: architecture as Architecture,
    hiddenSize,
    intermediateSize: integer('intermediate_size'),
    numLayers: integer('num_hidden_layers'),
    numHeads,
    numKvHeads,
    headDim,
    vocabSize: integer('vocab_size'),
    rmsNormEps: number('rms_norm_eps', 1e-6),
    ropeTheta: number('rope_theta', 10000),
    ropeScaling: parseRopeScaling(raw.rope_scaling, fail),
    slidingWindowTokens: slidingWindow as number | null,
    tieWordEmbeddings: raw.tie_word_embeddings === true,
    hasQkvBias: architecture === 'Qwen2ForCausalLM',
  };
}

function parseRopeScaling(raw: unknown, fail: (message: string) => never): Llama3RopeScaling | null {
  if (raw === undefined || raw === null) return null;
  if (typeof raw !== 'object') return fail('rope_scaling must be an object or null');
  const scaling = raw as Record<string, unknown>;
  const ropeType = scaling.rope_type ?? scaling.type;
  if (ropeType === 'default') return null;
  if (ropeType !== 'llama3') return fail(`rope_scaling type ${JSON.stringify(ropeType)} is not supported (only llama3)`);
  const field = (key: string): number => {
    const value = scaling[key];
    if (typeof value !== 'number' || !(value > 0)) fail(`rope_scaling.${key} must be a positive number`);
    return value as number;
  };
  const scalingParams = {
    factor: field('factor'),
    lowFreqFactor: field('low_freq_factor'),
    highFreqFactor: field('high_freq_factor'),
    originalMaxPositionEmbeddings: field('original_max_position_embeddings'),
  };
  if (scalingParams.highFreqFactor <= scalingParams.lowFreqFactor) fail('rope_scaling.high_freq_factor must exceed low_freq_factor');
  return scalingParams;
}

/** transformers' default inv_freq, then _compute_llama3_parameters when rope_scaling is llama3. */
export function ropeInverseFrequencies(config: Pick<ReferenceConfig, 'headDim' | 'ropeTheta' | 'ropeScaling'>): Float64Array {
  const half = config.headDim / 2;
  const invFreq = new Float64Array(half);
  for (let i = 0; i < half; i++) invFreq[i] = 1 / config.ropeTheta ** ((2 * i) / config.headDim);
  const scaling = config.ropeScaling;
  if (scaling === null) return invFreq;
  const lowFreqWavelen = scaling.originalMaxPositionEmbeddings / scaling.lowFreqFactor;
  const highFreqWavelen = scaling.originalMaxPositionEmbeddings / scaling.highFreqFactor;
  for (let i = 0; i < half; i++) {
    const wavelen = (2 * Math.PI) / invFreq[i];
    if (wavelen > lowFreqWavelen) {
      invFreq[i] /= scaling.factor;
    } else if (wavelen >= highFreqWavelen) {
      const smooth = (scaling.originalMaxPositionEmbeddings / wavelen - scaling.lowFreqFactor) / (scaling.highFreqFactor - scaling.lowFreqFactor);
      invFreq[i] = ((1 - smooth) * invFreq[i]) / scaling.factor + smooth * invFreq[i];
    }
  }
  return invFreq;
}

/**
 * Rotates vec[offset, offset + headDim) in place, HF "rotate_half" convention: element i pairs
 * with element i + headDim/2 (first half with second half, not interleaved neighbours).
 */
export function applyRope(vec: Float64Array, offset: number, headDim: number, position: number, invFreq: Float64Array): void {
  const half = headDim / 2;
  for (let i = 0; i < half; i++) {
    const angle = position * invFreq[i];
    const cos = Math.cos(angle);
    const sin = Math.sin(angle);
    const x1 = vec[offset + i];
    const x2 = vec[offset + i + half];
    vec[offset + i] = x1 * cos - x2 * sin;
    vec[offset + i + half] = x2 * cos + x1 * sin;
  }
}

export function loadReferenceModel(dir: string): ReferenceModel {
  const configFile = path.join(dir, 'config.json');
  const config = parseReferenceConfig(JSON.parse(readFileSync(configFile, 'utf8')), configFile);
  const checkpoint = readCheckpointTensors(dir);
  const { hiddenSize, intermediateSize, numHeads, numKvHeads, headDim, vocabSize } = config;
  const load = (name: string, shape: number[]) => loadTensor(checkpoint, name, shape);
  const layers: ReferenceLayer[] = [];
  for (let layer = 0; layer < config.numLayers; layer++) {
    const prefix = `model.layers.${layer}`;
    const bias = (name: string, size: number) => (config.hasQkvBias ? load(`${prefix}.self_attn.${name}.bias`, [size]) : null);
    layers.push({
      inputNorm: load(`${prefix}.input_layernorm.weight`, [hiddenSize]),
      qProj: load(`${prefix}.self_attn.q_proj.weight`, [numHeads * headDim, hiddenSize]),
      kProj: load(`${prefix}.self_attn.k_proj.weight`, [numKvHeads * headDim, hiddenSize]),
      vProj: load(`${prefix}.self_attn.v_proj.weight`, [numKvHeads * headDim, hiddenSize]),
      qBias: bias('q_proj', numHeads * headDim),
      kBias: bias('k_proj', numKvHeads * headDim),
      vBias: bias('v_proj', numKvHeads * headDim),
      oProj: load(`${prefix}.self_attn.o_proj.weight`, [hiddenSize, numHeads * headDim]),
      postAttentionNorm: load(`${prefix}.post_attention_layernorm.weight`, [hiddenSize]),
      gateProj: load(`${prefix}.mlp.gate_proj.weight`, [intermediateSize, hiddenSize]),
      upProj: load(`${prefix}.mlp.up_proj.weight`, [intermediateSize, hiddenSize]),
      downProj: load(`${prefix}.mlp.down_proj.weight`, [hiddenSize, intermediateSize]),
    });
  }
  const embedTokens = load('model.embed_tokens.weight', [vocabSize, hiddenSize]);
  return {
    config,
    embedTokens,
    layers,
    finalNorm: load('model.norm.weight', [hiddenSize]),
    lmHead: config.tieWordEmbeddings ? embedTokens : load('lm_head.weight', [vocabSize, hiddenSize]),
    invFreq: ropeInverseFrequencies(config),
  };
}

function loadTensor(checkpoint: CheckpointTensors, name: string, shape: number[]): Float64Array {
  const tensor = checkpoint.tensors.get(name);
  if (tensor === undefined) throw new Error(`checkpoint has no tensor ${name}`);
  if (tensor.shape.length !== shape.length || tensor.shape.some((d, i) => d !== shape[i])) {
    throw new Error(`${tensor.file}: tensor ${name} has shape [${tensor.shape.join(', ')}], config implies [${shape.join(', ')}]`);
  }
  return readTensorF64(tensor.file, checkpoint.headers.get(tensor.file)!, name);
}

/** out = W · x (+ bias), W row-major [rows, x.length]. */
function matVec(weight: Float64Array, x: Float64Array, bias: Float64Array | null = null): Float64Array {
  const cols = x.length;
  const rows = weight.length / cols;
  const out = new Float64Array(rows);
  for (let r = 0; r < rows; r++) {
    let sum = bias === null ? 0 : bias[r];
    for (let c = 0; c < cols; c++) sum += weight[r * cols + c] * x[c];
    out[r] = sum;
  }
  return out;
}

/** x / sqrt(mean(x²) + eps) · weight, as LlamaRMSNorm. */
export function rmsNorm(x: Float64Array, weight: Float64Array, eps: number): Float64Array {
  let sumSquares = 0;
  for (let i = 0; i < x.length; i++) sumSquares += x[i] * x[i];
  const scale = 1 / Math.sqrt(sumSquares / x.length + eps);
  return x.map((value, i) => value * scale * weight[i]);
}

function silu(x: number): number {
  return x / (1 + Math.exp(-x));
}

/** Logits for every position of tokenIds (positions 0..n-1), computed from scratch. */
export function referenceLogits(model: ReferenceModel, tokenIds: readonly number[]): Float64Array[] {
  const { hiddenSize, vocabSize, rmsNormEps } = model.config;
  const hidden = tokenIds.map((tokenId) => {
    if (!(Number.isSafeInteger(tokenId) && tokenId >= 0 && tokenId < vocabSize)) throw new Error(`token id ${tokenId} is outside [0, ${vocabSize})`);
    return model.embedTokens.slice(tokenId * hiddenSize, (tokenId + 1) * hiddenSize);
  });
  for (const layer of model.layers) {
    const attentionOut = attention(model, layer, hidden);
    for (let t = 0; t < hidden.length; t++) addInPlace(hidden[t], attentionOut[t]);
    for (const x of hidden) addInPlace(x, mlp(layer, rmsNorm(x, layer.postAttentionNorm, rmsNormEps)));
  }
  return hidden.map((x) => matVec(model.lmHead, rmsNorm(x, model.finalNorm, rmsNormEps)));
}

function addInPlace(target: Float64Array, addend: Float64Array): void {
  for (let i = 0; i < target.length; i++) target[i] += addend[i];
}

function mlp(layer: ReferenceLayer, x: Float64Array): Float64Array {
  const gate = matVec(layer.gateProj, x);
  const up = matVec(layer.upProj, x);
  return matVec(layer.downProj, gate.map((g, i) => silu(g) * up[i]));
}

/** Self-attention output (after o_proj) for every position; query head h reads kv head h / (numHeads / numKvHeads). */
function attention(model: ReferenceModel, layer: ReferenceLayer, hidden: Float64Array[]): Float64Array[] {
  const { numHeads, numKvHeads, headDim, rmsNormEps, slidingWindowTokens } = model.config;
  const queries: Float64Array[] = [];
  const keys: Float64Array[] = [];
  const values: Float64Array[] = [];
  hidden.forEach((x, position) => {
    const normed = rmsNorm(x, layer.inputNorm, rmsNormEps);
    const q = matVec(layer.qProj, normed, layer.qBias);
    const k = matVec(layer.kProj, normed, layer.kBias);
    for (let h = 0; h < numHeads; h++) applyRope(q, h * headDim, headDim, position, model.invFreq);
    for (let h = 0; h < numKvHeads; h++) applyRope(k, h * headDim, headDim, position, model.invFreq);
    queries.push(q);
    keys.push(k);
    values.push(matVec(layer.vProj, normed, layer.vBias));
  });
  const headsPerKv = numHeads / numKvHeads;
  const scale = 1 / Math.sqrt(headDim);
  return queries.map((q, position) => {
    const firstKey = slidingWindowTokens === null ? 0 : Math.max(0, position - slidingWindowTokens + 1);
    const out = new Float64Array(numHeads * headDim);
    for (let h = 0; h < numHeads; h++) {
      const kvOffset = Math.floor(h / headsPerKv) * headDim;
      const scores: number[] = [];
      for (let j = firstKey; j <= position; j++) {
        let dot = 0;
        for (let d = 0; d < headDim; d++) dot += q[h * headDim + d] * keys[j][kvOffset + d];
        scores.push(dot * scale);
      }
      const maxScore = Math.max(...scores);
      const weights = scores.map((s) => Math.exp(s - maxScore));
      const total = weights.reduce((sum, w) => sum + w, 0);
      for (let j = firstKey; j <= position; j++) {
        const p = weights[j - firstKey] / total;
        for (let d = 0; d < headDim; d++) out[h * headDim + d] += p * values[j][kvOffset + d];
      }
    }
    return matVec(layer.oProj, out);
  });
}

/** max |logit − ref| / max |ref| over one position's logits. */
export function relativeError(logits: ArrayLike<number>, ref: ArrayLike<number>): number {
  if (logits.length !== ref.length) throw new Error(`relativeError: ${logits.length} logits vs ${ref.length} reference values`);
  let maxDiff = 0;
  let maxRef = 0;
  for (let i = 0; i < ref.length; i++) {
    maxDiff = Math.max(maxDiff, Math.abs(logits[i] - ref[i]));
    maxRef = Math.max(maxRef, Math.abs(ref[i]));
  }
  return maxDiff / maxRef;
}
