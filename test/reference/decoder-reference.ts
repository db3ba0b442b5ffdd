// The fp64 reference forward pass of the newer families, written from transformers' modeling
// and configuration files (not from the C++): Qwen3 and Qwen3-MoE (modeling_qwen3.py,
// modeling_qwen3_moe.py), Mixtral (modeling_mixtral.py), Gemma 3 text (modeling_gemma3.py),
// Phi-3 / Phi-4 (modeling_phi3.py), gpt-oss (modeling_gpt_oss.py, integrations/mxfp4.py) and the
// rope types of modeling_rope_utils.py. Plain loops, full attention recomputed from scratch at
// every call, weights widened exactly from their stored form; slow and obviously correct.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { readCheckpointTensors, readTensorBytes, readTensorF64, type CheckpointTensors } from '../../native/safetensors.ts';
import { rmsNorm } from './llama-reference.ts';

type Json = Record<string, unknown>;

export type Family = 'qwen3' | 'qwen3_moe' | 'mixtral' | 'gemma3' | 'phi3' | 'gpt_oss';

const FAMILY_OF: Readonly<Record<string, Family>> = {
  Qwen3ForCausalLM: 'qwen3',
  Qwen3MoeForCausalLM: 'qwen3_moe',
  MixtralForCausalLM: 'mixtral',
  Gemma3ForCausalLM: 'gemma3',
  Phi3ForCausalLM: 'phi3',
  GptOssForCausalLM: 'gpt_oss',
};

interface Rope {
  rotaryDim: number;
  invFreq: Float64Array;
  /** cos and sin are multiplied by it (YaRN, LongRoPE). */
  attentionScaling: number;
}

interface Expert {
  gate: Float64Array; // [width, hidden]
  up: Float64Array;
  down: Float64Array; // [hidden, width]
  gateBias: Float64Array | null;
  upBias: Float64Array | null;
  downBias: Float64Array | null;
}

interface Layer {
  inputNorm: Float64Array;
  q: Float64Array;
  k: Float64Array;
  v: Float64Array;
  qBias: Float64Array | null;
  kBias: Float64Array | null;
  vBias: Float64Array | null;
  oBias: Float64Array | null;
  o: Float64Array;
  qNorm: Float64Array | null;
  kNorm: Float64Array | null;
  sinks: Float64Array | null;
  postAttentionNorm: Float64Array | null; // Gemma: on the attention output
  ffnNorm: Float64Array;
  postFeedforwardNorm: Float64Array | null;
  window: number | null;
  rope: Rope;
  dense: Expert | null;
  router: Float64Array | null; // [experts, hidden]
  routerBias: Float64Array | null;
  experts: Expert[];
}

export interface DecoderReference {
  family: Family;
  hiddenSize: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  vocabSize: number;
  eps: number;
  /** Gemma's norms multiply by (1 + w). */
  normAddsOne: boolean;
  embedScale: number;
  scaling: number;
  attnSoftcap: number | null;
  finalSoftcap: number | null;
  topK: number;
  normTopkProb: boolean;
  swigluAlpha: number;
  swigluLimit: number;
  embed: Float64Array;
  layers: Layer[];
  finalNorm: Float64Array;
  lmHead: Float64Array;
}

/** What served length LongRoPE picks its factors for (transformers: the sequence's own length). */
export interface ReferenceOptions {
  maxModelLen?: number;
}

// --- rope (modeling_rope_utils.py) ---------------------------------------------------------

function ropeOf(theta: number, scaling: Json | null, headDim: number, partial: number, maxPos: number, originalMax: number | null, maxModelLen: number): Rope {
  const dim = Math.floor(headDim * partial);
  const half = dim / 2;
  const base = Array.from({ length: half }, (_, i) => theta ** ((2 * i) / dim));
  const plain = Float64Array.from(base, (b) => 1 / b);
  const type = (scaling?.rope_type ?? scaling?.type ?? 'default') as string;
  if (scaling === null || type === 'default') return { rotaryDim: dim, invFreq: plain, attentionScaling: 1 };
  if (type === 'linear') return { rotaryDim: dim, invFreq: plain.map((x) => x / (scaling.factor as number)), attentionScaling: 1 };
  const original = (scaling.original_max_position_embeddings as number | undefined) ?? originalMax!;
  if (type === 'yarn') {
    const factor = (scaling.factor as number | undefined) ?? maxPos / original;
    const getMscale = (s: number, m = 1) => (s <= 1 ? 1 : 0.1 * m * Math.log(s) + 1);
    const mscale = scaling.mscale as number | undefined;
    const mscaleAllDim = scaling.mscale_all_dim as number | undefined;
    const attentionFactor =
      (scaling.attention_factor as number | undefined) ??
      (mscale && mscaleAllDim ? getMscale(factor, mscale) / getMscale(factor, mscaleAllDim) : getMscale(factor));
    const betaFast = (scaling.beta_fast as number | undefined) ?? 32;
    const betaSlow = (scaling.beta_slow as number | undefined) ?? 1;
    const findDim = (rot: number) => (dim * Math.log(original / (rot * 2 * Math.PI))) / (2 * Math.log(theta));
    let low = findDim(betaFast);
    let high = findDim(betaSlow);
    if (scaling.truncate !== false) {
      low = Math.floor(low);
      high = Math.ceil(high);
    }
    low = Math.max(low, 0);
    high = Math.min(high, dim - 1);
    if (low === high) high += 0.001;
    const invFreq = new Float64Array(half);
    for (let i = 0; i < half; i++) {
      const extrapolationFactor = 1 - Math.min(1, Math.max(0, (i - low) / (high - low)));
      invFreq[i] = (1 / (factor * base[i])) * (1 - extrapolationFactor) + (1 / base[i]) * extrapolationFactor;
    }
    return { rotaryDim: dim, invFreq, attentionScaling: attentionFactor };
  }
  if (type === 'longrope') {
    const factor = (scaling.factor as number | undefined) ?? maxPos / original;
    const attentionFactor = (scaling.attention_factor as number | undefined) ?? (factor <= 1 ? 1 : Math.sqrt(1 + Math.log(factor) / Math.log(original)));
    const ext = (maxModelLen > original ? scaling.long_factor : scaling.short_factor) as number[];
    return { rotaryDim: dim, invFreq: Float64Array.from(base, (b, i) => 1 / (ext[i] * b)), attentionScaling: attentionFactor };
  }
  throw new Error(`reference: rope type ${type} is not modelled`);
}

function rotate(vec: Float64Array, offset: number, position: number, rope: Rope): void {
  // rotate_half over the first rotaryDim dims; cos and sin scaled by the attention factor.
  const half = rope.rotaryDim / 2;
  const s = rope.attentionScaling;
  for (let i = 0; i < half; i++) {
    const angle = position * rope.invFreq[i];
    const cos = Math.cos(angle) * s;
    const sin = Math.sin(angle) * s;
    const a = vec[offset + i];
    const b = vec[offset + i + half];
    vec[offset + i] = a * cos - b * sin;
    vec[offset + i + half] = b * cos + a * sin;
  }
}

// --- loading ---------------------------------------------------------------------------------

const FP4_VALUES = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, -1, -1.5, -2, -3, -4, -6];

/** integrations/mxfp4.py convert_moe_packed_tensors: [..., rows, G, 16] + [..., rows, G] → [..., rows, G * 32]. */
function dequantizeMxfp4(blocks: Uint8Array, scales: Uint8Array): Float64Array {
  const out = new Float64Array(blocks.length * 2);
  for (let i = 0; i < blocks.length; i++) {
    const scale = 2 ** (scales[Math.floor(i / 16)] - 127);
    out[2 * i] = FP4_VALUES[blocks[i] & 0x0f] * scale;
    out[2 * i + 1] = FP4_VALUES[blocks[i] >> 4] * scale;
  }
  return out;
}

class Loader {
  constructor(private readonly checkpoint: CheckpointTensors) {}

  has(name: string): boolean {
    return this.checkpoint.tensors.has(name);
  }

  f64(name: string, shape: number[]): Float64Array {
    const tensor = this.checkpoint.tensors.get(name);
    if (tensor === undefined) throw new Error(`reference: no tensor ${name}`);
    if (tensor.shape.join() !== shape.join()) throw new Error(`reference: ${name} is [${tensor.shape}], expected [${shape}]`);
    return readTensorF64(tensor.file, this.checkpoint.headers.get(tensor.file)!, name);
  }

  optional(name: string, shape: number[]): Float64Array | null {
    return this.has(name) ? this.f64(name, shape) : null;
  }

  bytes(name: string): Uint8Array {
    const tensor = this.checkpoint.tensors.get(name)!;
    return readTensorBytes(tensor.file, tensor);
  }
}

/** Rows [first, first + count) of a row-major [rows, cols] matrix. */
function rows(m: Float64Array, cols: number, first: number, count: number): Float64Array {
  return m.slice(first * cols, (first + count) * cols);
}

/** Every other row (parity 0 or 1) of a row-major [rows, cols] matrix. */
function interleaved(m: Float64Array, cols: number, parity: number): Float64Array {
  const n = m.length / cols / 2;
  const out = new Float64Array(n * cols);
  for (let r = 0; r < n; r++) out.set(m.subarray((2 * r + parity) * cols, (2 * r + parity + 1) * cols), r * cols);
  return out;
}

function transpose(m: Float64Array, rowsIn: number, cols: number): Float64Array {
  const out = new Float64Array(m.length);
  for (let r = 0; r < rowsIn; r++) for (let c = 0; c < cols; c++) out[c * rowsIn + r] = m[r * cols + c];
  return out;
}

export function loadDecoderReference(dir: string, options: ReferenceOptions = {}): DecoderReference {
  const raw = JSON.parse(readFileSync(path.join(dir, 'config.json'), 'utf8')) as Json;
  const arch = (raw.architectures as string[])[0];
  const family = FAMILY_OF[arch];
  if (family === undefined) throw new Error(`reference: ${arch} is not one of ${Object.keys(FAMILY_OF).join(', ')}`);
  const num = (key: string, fallback?: number): number => {
    const value = raw[key] ?? fallback;
    if (typeof value !== 'number') throw new Error(`reference: config ${key} is ${JSON.stringify(value)}`);
    return value;
  };
  const load = new Loader(readCheckpointTensors(dir));
  const hidden = num('hidden_size');
  const numHeads = num('num_attention_heads');
  const numKvHeads = num('num_key_value_heads', numHeads);
  const defaultHeadDim = family === 'gemma3' ? 256 : family === 'gpt_oss' ? 64 : family === 'qwen3' ? 128 : hidden / numHeads;
  const headDim = num('head_dim', defaultHeadDim);
  const numLayers = num('num_hidden_layers');
  const vocab = num('vocab_size');
  const inter = num('intermediate_size');
  const maxPos = num('max_position_embeddings');
  const maxModelLen = options.maxModelLen ?? maxPos;
  const dtype = raw.torch_dtype as string;

  // Which layers slide, and their window (each config class's rule).
  const window = (raw.sliding_window as number | null | undefined) ?? null;
  const layerTypes = raw.layer_types as string[] | undefined;
  const slides = (i: number): boolean => {
    if (layerTypes !== undefined) return layerTypes[i] === 'sliding_attention';
    switch (family) {
      case 'gemma3':
        return (i + 1) % num('sliding_window_pattern', 6) !== 0;
      case 'gpt_oss':
        return (i + 1) % 2 !== 0;
      case 'qwen3':
        return raw.use_sliding_window === true && window !== null && i >= num('max_window_layers', 28);
      case 'qwen3_moe':
        return raw.use_sliding_window === true && window !== null;
      default:
        return window !== null;
    }
  };
  const layerWindow = (i: number): number | null => {
    if (!slides(i)) return null;
    if ((family === 'qwen3' || family === 'qwen3_moe') && raw.use_sliding_window !== true) return null;
    return window;
  };

  const partial = num('partial_rotary_factor', 1);
  const theta = num('rope_theta', family === 'gemma3' ? 1e6 : family === 'gpt_oss' ? 150000 : 10000);
  const originalMax = (raw.original_max_position_embeddings as number | undefined) ?? null;
  const globalRope = ropeOf(theta, (raw.rope_scaling as Json | null | undefined) ?? null, headDim, partial, maxPos, originalMax, maxModelLen);
  // Gemma 3's local layers: rope_local_base_freq, no scaling.
  const localRope = family === 'gemma3' ? ropeOf(num('rope_local_base_freq', 10000), null, headDim, 1, maxPos, null, maxModelLen) : globalRope;

  const qSize = numHeads * headDim;
  const kvSize = numKvHeads * headDim;
  const numExperts = num('num_experts', (raw.num_local_experts as number | undefined) ?? 0);
  const moeWidth = family === 'qwen3_moe' ? num('moe_intermediate_size') : inter;
  const mlpOnly = (raw.mlp_only_layers as number[] | undefined) ?? [];
  const sparseStep = num('decoder_sparse_step', 1);
  const isMoe = (i: number) =>
    family === 'mixtral' || family === 'gpt_oss' || (family === 'qwen3_moe' && numExperts > 0 && !mlpOnly.includes(i) && (i + 1) % sparseStep === 0);

  const layers: Layer[] = [];
  for (let i = 0; i < numLayers; i++) {
    const p = `model.layers.${i}`;
    let q: Float64Array, k: Float64Array, v: Float64Array;
    if (family === 'phi3') {
      const qkv = load.f64(`${p}.self_attn.qkv_proj.weight`, [qSize + 2 * kvSize, hidden]);
      q = rows(qkv, hidden, 0, qSize);
      k = rows(qkv, hidden, qSize, kvSize);
      v = rows(qkv, hidden, qSize + kvSize, kvSize);
    } else {
      q = load.f64(`${p}.self_attn.q_proj.weight`, [qSize, hidden]);
      k = load.f64(`${p}.self_attn.k_proj.weight`, [kvSize, hidden]);
      v = load.f64(`${p}.self_attn.v_proj.weight`, [kvSize, hidden]);
    }
    const layer: Layer = {
      inputNorm: load.f64(`${p}.input_layernorm.weight`, [hidden]),
      q,
      k,
      v,
      qBias: load.optional(`${p}.self_attn.q_proj.bias`, [qSize]),
      kBias: load.optional(`${p}.self_attn.k_proj.bias`, [kvSize]),
      vBias: load.optional(`${p}.self_attn.v_proj.bias`, [kvSize]),
      o: load.f64(`${p}.self_attn.o_proj.weight`, [hidden, qSize]),
      oBias: load.optional(`${p}.self_attn.o_proj.bias`, [hidden]),
      qNorm: load.optional(`${p}.self_attn.q_norm.weight`, [headDim]),
      kNorm: load.optional(`${p}.self_attn.k_norm.weight`, [headDim]),
      sinks: load.optional(`${p}.self_attn.sinks`, [numHeads]),
      // Gemma 3 names the attention-output norm post_attention_layernorm and the pre-MLP one
      // pre_feedforward_layernorm; everyone else's post_attention_layernorm is the pre-MLP norm.
      postAttentionNorm: family === 'gemma3' ? load.f64(`${p}.post_attention_layernorm.weight`, [hidden]) : null,
      ffnNorm: load.f64(family === 'gemma3' ? `${p}.pre_feedforward_layernorm.weight` : `${p}.post_attention_layernorm.weight`, [hidden]),
      postFeedforwardNorm: family === 'gemma3' ? load.f64(`${p}.post_feedforward_layernorm.weight`, [hidden]) : null,
      window: layerWindow(i),
      rope: family === 'gemma3' && slides(i) ? localRope : globalRope,
      dense: null,
      router: null,
      routerBias: null,
      experts: [],
    };
    if (!isMoe(i)) {
      if (family === 'phi3') {
        const gateUp = load.f64(`${p}.mlp.gate_up_proj.weight`, [2 * inter, hidden]);
        layer.dense = { gate: rows(gateUp, hidden, 0, inter), up: rows(gateUp, hidden, inter, inter), down: load.f64(`${p}.mlp.down_proj.weight`, [hidden, inter]), gateBias: null, upBias: null, downBias: null };
      } else {
        layer.dense = {
          gate: load.f64(`${p}.mlp.gate_proj.weight`, [inter, hidden]),
          up: load.f64(`${p}.mlp.up_proj.weight`, [inter, hidden]),
          down: load.f64(`${p}.mlp.down_proj.weight`, [hidden, inter]),
          gateBias: null,
          upBias: null,
          downBias: null,
        };
      }
    } else if (family === 'gpt_oss') {
      layer.router = load.f64(`${p}.mlp.router.weight`, [numExperts, hidden]);
      layer.routerBias = load.f64(`${p}.mlp.router.bias`, [numExperts]);
      const e = `${p}.mlp.experts`;
      let gateUp: Float64Array; // [experts, 2 * width, hidden]
      let down: Float64Array; // [experts, hidden, width]
      if (load.has(`${e}.gate_up_proj_blocks`)) {
        gateUp = dequantizeMxfp4(load.bytes(`${e}.gate_up_proj_blocks`), load.bytes(`${e}.gate_up_proj_scales`));
        down = dequantizeMxfp4(load.bytes(`${e}.down_proj_blocks`), load.bytes(`${e}.down_proj_scales`));
      } else {
        // Dequantized checkpoints keep transformers' own [experts, in, out] layout.
        const gateUpIn = load.f64(`${e}.gate_up_proj`, [numExperts, hidden, 2 * moeWidth]);
        const downIn = load.f64(`${e}.down_proj`, [numExperts, moeWidth, hidden]);
        gateUp = new Float64Array(gateUpIn.length);
        down = new Float64Array(downIn.length);
        for (let x = 0; x < numExperts; x++) {
          gateUp.set(transpose(gateUpIn.subarray(x * hidden * 2 * moeWidth, (x + 1) * hidden * 2 * moeWidth), hidden, 2 * moeWidth), x * hidden * 2 * moeWidth);
          down.set(transpose(downIn.subarray(x * moeWidth * hidden, (x + 1) * moeWidth * hidden), moeWidth, hidden), x * moeWidth * hidden);
        }
      }
      const gateUpBias = load.f64(`${e}.gate_up_proj_bias`, [numExperts, 2 * moeWidth]);
      const downBias = load.f64(`${e}.down_proj_bias`, [numExperts, hidden]);
      for (let x = 0; x < numExperts; x++) {
        const gu = rows(gateUp, hidden, x * 2 * moeWidth, 2 * moeWidth);
        const guBias = gateUpBias.slice(x * 2 * moeWidth, (x + 1) * 2 * moeWidth);
        // _apply_gate: gate = gate_up[..., ::2], up = gate_up[..., 1::2].
        layer.experts.push({
          gate: interleaved(gu, hidden, 0),
          up: interleaved(gu, hidden, 1),
          down: rows(down, moeWidth, x * hidden, hidden),
          gateBias: interleaved(guBias, 1, 0),
          upBias: interleaved(guBias, 1, 1),
          downBias: downBias.slice(x * hidden, (x + 1) * hidden),
        });
      }
    } else {
      const moe = family === 'mixtral' ? `${p}.block_sparse_moe` : `${p}.mlp`;
      const [g, u, d] = family === 'mixtral' ? ['w1', 'w3', 'w2'] : ['gate_proj', 'up_proj', 'down_proj'];
      layer.router = load.f64(`${moe}.gate.weight`, [numExperts, hidden]);
      for (let x = 0; x < numExperts; x++) {
        layer.experts.push({
          gate: load.f64(`${moe}.experts.${x}.${g}.weight`, [moeWidth, hidden]),
          up: load.f64(`${moe}.experts.${x}.${u}.weight`, [moeWidth, hidden]),
          down: load.f64(`${moe}.experts.${x}.${d}.weight`, [hidden, moeWidth]),
          gateBias: null,
          upBias: null,
          downBias: null,
        });
      }
    }
    layers.push(layer);
  }
  const embed = load.f64('model.embed_tokens.weight', [vocab, hidden]);
  const tied = raw.tie_word_embeddings === true || (raw.tie_word_embeddings === undefined && family === 'gemma3');
  // Gemma3TextScaledWordEmbedding: embed_scale = sqrt(hidden), cast to the weights' dtype.
  const embedScale = family === 'gemma3' ? roundTo(Math.sqrt(hidden), dtype) : 1;
  return {
    family,
    hiddenSize: hidden,
    numHeads,
    numKvHeads,
    headDim,
    vocabSize: vocab,
    eps: num('rms_norm_eps', 1e-6),
    normAddsOne: family === 'gemma3',
    embedScale,
    scaling: family === 'gemma3' ? num('query_pre_attn_scalar', 256) ** -0.5 : headDim ** -0.5,
    attnSoftcap: family === 'gemma3' ? ((raw.attn_logit_softcapping as number | null) ?? null) : null,
    finalSoftcap: family === 'gemma3' ? ((raw.final_logit_softcapping as number | null) ?? null) : null,
    topK: numExperts > 0 ? num('num_experts_per_tok') : 0,
    normTopkProb: family === 'mixtral' || (family === 'qwen3_moe' && raw.norm_topk_prob === true),
    swigluAlpha: num('swiglu_alpha', 1.702),
    swigluLimit: num('swiglu_limit', 7),
    embed,
    layers,
    finalNorm: load.f64('model.norm.weight', [hidden]),
    lmHead: tied ? embed : load.f64('lm_head.weight', [vocab, hidden]),
  };
}

/** A value rounded to the dtype torch holds it in (bf16, fp16), as a number. */
function roundTo(value: number, dtype: string): number {
  const view = new DataView(new ArrayBuffer(4));
  view.setFloat32(0, value);
  if (dtype === 'bfloat16') {
    const bits = view.getUint32(0);
    view.setUint32(0, (((bits + 0x7fff + ((bits >>> 16) & 1)) >>> 16) << 16) >>> 0);
    return view.getFloat32(0);
  }
  if (dtype === 'float16') {
    const rounded = Math.fround(value);
    const exponent = Math.floor(Math.log2(Math.abs(rounded)));
    const ulp = 2 ** (exponent - 10);
    return Math.round(rounded / ulp) * ulp;
  }
  return dtype === 'float32' ? Math.fround(value) : value;
}

// --- forward ---------------------------------------------------------------------------------

function matVec(w: Float64Array, x: Float64Array, bias: Float64Array | null = null): Float64Array {
  const cols = x.length;
  const out = new Float64Array(w.length / cols);
  for (let r = 0; r < out.length; r++) {
    let sum = bias === null ? 0 : bias[r];
    for (let c = 0; c < cols; c++) sum += w[r * cols + c] * x[c];
    out[r] = sum;
  }
  return out;
}

function norm(model: DecoderReference, x: Float64Array, weight: Float64Array): Float64Array {
  // Gemma3RMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + w).
  return rmsNorm(x, model.normAddsOne ? weight.map((w) => 1 + w) : weight, model.eps);
}

const silu = (x: number) => x / (1 + Math.exp(-x));
const geluTanh = (x: number) => 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x ** 3)));

function expertForward(model: DecoderReference, e: Expert, x: Float64Array): Float64Array {
  const gate = matVec(e.gate, x, e.gateBias);
  const up = matVec(e.up, x, e.upBias);
  const act = gate.map((g, i) => {
    switch (model.family) {
      case 'gemma3':
        return geluTanh(g) * up[i];
      case 'gpt_oss': {
        // GptOssExperts._apply_gate: clamp, then (up + 1) * gate * sigmoid(gate * alpha).
        const c = Math.min(g, model.swigluLimit);
        const u = Math.min(Math.max(up[i], -model.swigluLimit), model.swigluLimit);
        return (u + 1) * (c / (1 + Math.exp(-c * model.swigluAlpha)));
      }
      default:
        return silu(g) * up[i];
    }
  });
  return matVec(e.down, act, e.downBias);
}

export interface ReferenceOutput {
  /** [positions][vocab] */
  logits: Float64Array[];
  /**
   * Per position, the smallest router margin of that token over the MoE layers: the k-th
   * largest router logit minus the (k+1)-th, over the RMS of the token's logits. A runtime whose
   * logits differ by less keeps the same experts; Infinity for dense models.
   */
  routerMargins: number[];
}

function moeForward(model: DecoderReference, layer: Layer, x: Float64Array, margin: { value: number }): Float64Array {
  const logits = matVec(layer.router!, x, layer.routerBias);
  const order = Array.from(logits.keys()).sort((a, b) => logits[b] - logits[a] || a - b);
  const k = model.topK;
  const chosen = order.slice(0, k);
  if (k < logits.length) {
    const rms = Math.sqrt(logits.reduce((s, l) => s + l * l, 0) / logits.length);
    margin.value = Math.min(margin.value, (logits[order[k - 1]] - logits[order[k]]) / rms);
  }
  let weights: number[];
  if (model.family === 'gpt_oss') {
    // GptOssTopKRouter: top k of the logits, softmax over them.
    const max = logits[chosen[0]];
    const exps = chosen.map((e) => Math.exp(logits[e] - max));
    const total = exps.reduce((s, w) => s + w, 0);
    weights = exps.map((w) => w / total);
  } else {
    // softmax over every expert, the top k, renormalized (Mixtral; Qwen3-MoE with norm_topk_prob).
    const max = Math.max(...logits);
    const total = logits.reduce((s, l) => s + Math.exp(l - max), 0);
    weights = chosen.map((e) => Math.exp(logits[e] - max) / total);
    if (model.normTopkProb) {
      const sum = weights.reduce((s, w) => s + w, 0);
      weights = weights.map((w) => w / sum);
    }
  }
  const out = new Float64Array(x.length);
  chosen.forEach((e, i) => {
    const y = expertForward(model, layer.experts[e], x);
    for (let j = 0; j < out.length; j++) out[j] += weights[i] * y[j];
  });
  return out;
}

function softcap(x: number, cap: number | null): number {
  return cap === null ? x : Math.tanh(x / cap) * cap;
}

/** Logits (and router margins) at every position of tokenIds, positions 0..n-1, from scratch. */
export function decoderReferenceForward(model: DecoderReference, tokenIds: readonly number[]): ReferenceOutput {
  const { hiddenSize, numHeads, numKvHeads, headDim } = model;
  const hidden = tokenIds.map((id) => model.embed.slice(id * hiddenSize, (id + 1) * hiddenSize).map((x) => x * model.embedScale));
  const margins = tokenIds.map(() => ({ value: Infinity }));
  for (const layer of model.layers) {
    const qs: Float64Array[] = [];
    const ks: Float64Array[] = [];
    const vs: Float64Array[] = [];
    hidden.forEach((x, position) => {
      const normed = norm(model, x, layer.inputNorm);
      const q = matVec(layer.q, normed, layer.qBias);
      const k = matVec(layer.k, normed, layer.kBias);
      for (let h = 0; h < numHeads; h++) {
        if (layer.qNorm !== null) q.set(norm(model, q.slice(h * headDim, (h + 1) * headDim), layer.qNorm), h * headDim);
        rotate(q, h * headDim, position, layer.rope);
      }
      for (let h = 0; h < numKvHeads; h++) {
        if (layer.kNorm !== null) k.set(norm(model, k.slice(h * headDim, (h + 1) * headDim), layer.kNorm), h * headDim);
        rotate(k, h * headDim, position, layer.rope);
      }
      qs.push(q);
      ks.push(k);
      vs.push(matVec(layer.v, normed, layer.vBias));
    });
    const group = numHeads / numKvHeads;
    const attention = qs.map((q, position) => {
      const first = layer.window === null ? 0 : Math.max(0, position - layer.window + 1);
      const out = new Float64Array(numHeads * headDim);
      for (let h = 0; h < numHeads; h++) {
        const kv = Math.floor(h / group) * headDim;
        const scores: number[] = [];
        for (let j = first; j <= position; j++) {
          let dot = 0;
          for (let d = 0; d < headDim; d++) dot += q[h * headDim + d] * ks[j][kv + d];
          scores.push(softcap(dot * model.scaling, model.attnSoftcap));
        }
        // gpt-oss: the head's sink joins the softmax's denominator and is dropped.
        const sink = layer.sinks === null ? -Infinity : layer.sinks[h];
        const max = Math.max(sink, ...scores);
        const weights = scores.map((s) => Math.exp(s - max));
        const total = weights.reduce((s, w) => s + w, 0) + Math.exp(sink - max);
        for (let j = first; j <= position; j++) {
          const p = weights[j - first] / total;
          for (let d = 0; d < headDim; d++) out[h * headDim + d] += p * vs[j][kv + d];
        }
      }
      let o = matVec(layer.o, out, layer.oBias);
      if (layer.postAttentionNorm !== null) o = norm(model, o, layer.postAttentionNorm);
      return o;
    });
    hidden.forEach((x, t) => {
      for (let i = 0; i < hiddenSize; i++) x[i] += attention[t][i];
      const normed = norm(model, x, layer.ffnNorm);
      let y = layer.dense !== null ? expertForward(model, layer.dense, normed) : moeForward(model, layer, normed, margins[t]);
      if (layer.postFeedforwardNorm !== null) y = norm(model, y, layer.postFeedforwardNorm);
      for (let i = 0; i < hiddenSize; i++) x[i] += y[i];
    });
  }
  // A token's margin bounds every later position too: its experts shape what they attend to.
  const routerMargins: number[] = [];
  let smallest = Infinity;
  for (const m of margins) routerMargins.push((smallest = Math.min(smallest, m.value)));
  const logits = hidden.map((x) => matVec(model.lmHead, norm(model, x, model.finalNorm)).map((l) => softcap(l, model.finalSoftcap)));
  return { logits, routerMargins };
}

