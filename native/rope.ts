// Rotary embeddings as transformers' modeling_rope_utils.py computes them: the inverse frequencies
// of rope_type default, linear, llama3, yarn and longrope, and the attention factor that YaRN and
// LongRoPE multiply cos and sin by. Configs name the parameters either the way published
// checkpoints do (rope_theta, rope_scaling, original_max_position_embeddings at the top level) or
// transformers 5's way (rope_parameters); both arrive here as one flat record.
import type { RopeSpec } from './checkpoint.ts';

type Json = Record<string, unknown>;

/** The parameters of one rope: theta and the scaling fields, wherever the config kept them. */
export interface RopeParameters {
  ropeTheta: number;
  /** rope_scaling or rope_parameters, null for plain RoPE. */
  scaling: Json | null;
  /** The top-level original_max_position_embeddings (Phi-3), which scaling may also carry. */
  originalMaxPositionEmbeddings: number | null;
}

export interface RopeContext {
  headDim: number;
  partialRotaryFactor: number;
  maxPositionEmbeddings: number;
  /**
   * The longest sequence the server runs. LongRoPE's factors depend on a sequence's length
   * (transformers recomputes a sequence's whole cache with the long factors once it grows past
   * original_max_position_embeddings); a paged cache cannot, so the choice is made once: long
   * when the served length exceeds the original one, as vLLM and llama.cpp do.
   */
  maxModelLen: number;
}

/** Throws with the file and field; `where` names the config record ("config.json rope_scaling"). */
export type Fail = (field: string, expected: string, got: unknown) => never;

function positive(record: Json, key: string, fail: Fail): number {
  const value = record[key];
  if (typeof value !== 'number' || !(value > 0) || !Number.isFinite(value)) fail(key, 'a positive number', value);
  return value as number;
}

function optionalPositive(record: Json, key: string, fail: Fail): number | null {
  return record[key] === undefined || record[key] === null ? null : positive(record, key, fail);
}

export function ropeTypeOf(scaling: Json | null): string {
  if (scaling === null) return 'default';
  const type = scaling.rope_type ?? scaling.type;
  return typeof type === 'string' ? type : 'default';
}

export const ROPE_TYPES = ['default', 'linear', 'llama3', 'yarn', 'longrope'] as const;

export function resolveRope(params: RopeParameters, context: RopeContext, fail: Fail): RopeSpec {
  const rotaryDim = Math.floor(context.headDim * context.partialRotaryFactor);
  if (rotaryDim < 2 || rotaryDim % 2 !== 0) fail('partial_rotary_factor', `to leave an even rotary dim of at least 2 (head_dim ${context.headDim})`, context.partialRotaryFactor);
  const half = rotaryDim / 2;
  const base = params.ropeTheta;
  const plain = Float64Array.from({ length: half }, (_, i) => 1 / base ** ((2 * i) / rotaryDim));
  const scaling = params.scaling;
  const type = ropeTypeOf(scaling);
  if (scaling === null || type === 'default') return { rotaryDim, invFreq: plain, attentionScaling: 1 };
  switch (type) {
    case 'linear': {
      const factor = positive(scaling, 'factor', fail);
      return { rotaryDim, invFreq: plain.map((f) => f / factor), attentionScaling: 1 };
    }
    case 'llama3':
      return { rotaryDim, invFreq: llama3(plain, scaling, fail), attentionScaling: 1 };
    case 'yarn':
      return yarn(rotaryDim, base, scaling, params, context, fail);
    case 'longrope':
      return longrope(rotaryDim, base, scaling, params, context, fail);
    default:
      return fail('rope_scaling', `null or of rope_type ${ROPE_TYPES.join(', ')}`, type);
  }
}

function llama3(invFreq: Float64Array, scaling: Json, fail: Fail): Float64Array {
  const factor = positive(scaling, 'factor', fail);
  const lowFreqFactor = positive(scaling, 'low_freq_factor', fail);
  const highFreqFactor = positive(scaling, 'high_freq_factor', fail);
  const originalMaxPositions = positive(scaling, 'original_max_position_embeddings', fail);
  if (!(highFreqFactor > lowFreqFactor)) fail('high_freq_factor', 'greater than low_freq_factor', highFreqFactor);
  const lowFreqWavelen = originalMaxPositions / lowFreqFactor;
  const highFreqWavelen = originalMaxPositions / highFreqFactor;
  return invFreq.map((freq) => {
    const wavelen = (2 * Math.PI) / freq;
    if (wavelen < highFreqWavelen) return freq;
    if (wavelen > lowFreqWavelen) return freq / factor;
    const smooth = (originalMaxPositions / wavelen - lowFreqFactor) / (highFreqFactor - lowFreqFactor);
    return (1 - smooth) * (freq / factor) + smooth * freq;
  });
}

function originalMaxOf(scaling: Json, params: RopeParameters, fail: Fail): number {
  const inScaling = optionalPositive(scaling, 'original_max_position_embeddings', fail);
  const value = inScaling ?? params.originalMaxPositionEmbeddings;
  if (value === null) fail('original_max_position_embeddings', 'set (in rope_scaling or config.json)', value);
  return value as number;
}

/** _compute_yarn_parameters: interpolation blended into extrapolation by a linear ramp over the dims. */
function yarn(rotaryDim: number, base: number, scaling: Json, params: RopeParameters, context: RopeContext, fail: Fail): RopeSpec {
  const originalMax = originalMaxOf(scaling, params, fail);
  const factor = optionalPositive(scaling, 'factor', fail) ?? context.maxPositionEmbeddings / originalMax;
  const mscale = optionalPositive(scaling, 'mscale', fail);
  const mscaleAllDim = optionalPositive(scaling, 'mscale_all_dim', fail);
  const getMscale = (scale: number, m = 1) => (scale <= 1 ? 1 : 0.1 * m * Math.log(scale) + 1);
  let attentionScaling = optionalPositive(scaling, 'attention_factor', fail);
  if (attentionScaling === null) {
    attentionScaling = mscale !== null && mscaleAllDim !== null ? getMscale(factor, mscale) / getMscale(factor, mscaleAllDim) : getMscale(factor);
  }
  const betaFast = optionalPositive(scaling, 'beta_fast', fail) ?? 32;
  const betaSlow = optionalPositive(scaling, 'beta_slow', fail) ?? 1;
  const truncate = scaling.truncate === undefined || scaling.truncate === null ? true : scaling.truncate === true;
  const correctionDim = (rotations: number) => (rotaryDim * Math.log(originalMax / (rotations * 2 * Math.PI))) / (2 * Math.log(base));
  let low = correctionDim(betaFast);
  let high = correctionDim(betaSlow);
  if (truncate) {
    low = Math.floor(low);
    high = Math.ceil(high);
  }
  low = Math.max(low, 0);
  high = Math.min(high, rotaryDim - 1);
  if (low === high) high += 0.001;
  const half = rotaryDim / 2;
  const invFreq = new Float64Array(half);
  for (let i = 0; i < half; i++) {
    const posFreq = base ** ((2 * i) / rotaryDim);
    const ramp = Math.min(1, Math.max(0, (i - low) / (high - low)));
    const extrapolationFactor = 1 - ramp;
    invFreq[i] = (1 / (factor * posFreq)) * (1 - extrapolationFactor) + (1 / posFreq) * extrapolationFactor;
  }
  return { rotaryDim, invFreq, attentionScaling };
}

/** _compute_longrope_parameters: per-dim factors, short or long by the served length. */
function longrope(rotaryDim: number, base: number, scaling: Json, params: RopeParameters, context: RopeContext, fail: Fail): RopeSpec {
  const originalMax = originalMaxOf(scaling, params, fail);
  const half = rotaryDim / 2;
  const factors = (key: string): number[] => {
    const value = scaling[key];
    if (!Array.isArray(value) || value.length !== half || !value.every((x) => typeof x === 'number' && x > 0)) {
      fail(key, `a list of ${half} positive numbers (rotary dim ${rotaryDim} / 2)`, value);
    }
    return value as number[];
  };
  const shortFactor = factors('short_factor');
  const longFactor = factors('long_factor');
  const factor = optionalPositive(scaling, 'factor', fail) ?? context.maxPositionEmbeddings / originalMax;
  let attentionScaling = optionalPositive(scaling, 'attention_factor', fail);
  if (attentionScaling === null) attentionScaling = factor <= 1 ? 1 : Math.sqrt(1 + Math.log(factor) / Math.log(originalMax));
  const ext = context.maxModelLen > originalMax ? longFactor : shortFactor;
  const invFreq = Float64Array.from({ length: half }, (_, i) => 1 / (ext[i] * base ** ((2 * i) / rotaryDim)));
  return { rotaryDim, invFreq, attentionScaling };
}
