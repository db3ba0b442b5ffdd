// Building blocks the family modules share: a model's shape, the default numerics, rope
// parameters wherever a config keeps them, the attention and MLP tensors under their usual
// names, the embedding and LM head.
import type { ConfigReader, TensorCatalogue, TensorRef } from '../checkpoint-reader.ts';
import type { CheckpointOptions, ExpertRefs, LayerRefs, ModelSpec, RopeSpec } from '../checkpoint.ts';
import { resolveRope, type RopeParameters } from '../rope.ts';

/** A layer before the KV-cache groups are planned. */
export type FamilyLayer = Omit<LayerRefs, 'kvGroup' | 'kvSlot'>;

export interface FamilyModel {
  /** The record that holds torch_dtype. */
  config: ConfigReader;
  dims: Pick<
    ModelSpec,
    'numLayers' | 'hiddenSize' | 'intermediateSize' | 'numHeads' | 'numKvHeads' | 'headDim' | 'vocabSize' | 'moeIntermediateSize' | 'numExpertsPerToken'
  >;
  numerics: Pick<
    ModelSpec,
    | 'rmsNormEps'
    | 'normAddsOne'
    | 'embeddingScale'
    | 'attentionScale'
    | 'attentionSoftcap'
    | 'finalSoftcap'
    | 'activation'
    | 'swigluAlpha'
    | 'swigluLimit'
    | 'routing'
    | 'normTopkProb'
  >;
  ropes: RopeSpec[];
  layers: FamilyLayer[];
  embedTokens: TensorRef;
  finalNorm: TensorRef;
  lmHead: TensorRef;
  maxPositionEmbeddings: number;
  tieWordEmbeddings: boolean;
}

export type Family = (config: ConfigReader, tensors: TensorCatalogue, options: CheckpointOptions) => FamilyModel;

export interface Shape {
  numLayers: number;
  hiddenSize: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  vocabSize: number;
}

/** defaultHeadDim: the config class's head_dim when config.json has none (else hidden / heads). */
export function readShape(config: ConfigReader, defaultHeadDim?: number): Shape {
  const hiddenSize = config.positiveInt('hidden_size');
  const numHeads = config.positiveInt('num_attention_heads');
  const numKvHeads = config.positiveInt('num_key_value_heads', numHeads);
  if (numHeads % numKvHeads !== 0) config.fail('num_key_value_heads', `a divisor of num_attention_heads (${numHeads})`);
  const fallbackHeadDim = defaultHeadDim ?? hiddenSize / numHeads;
  if (!config.has('head_dim') && !Number.isInteger(fallbackHeadDim)) {
    config.fail('hidden_size', `a multiple of num_attention_heads (${numHeads}) when head_dim is absent`);
  }
  const headDim = config.positiveInt('head_dim', fallbackHeadDim);
  if (headDim % 2 !== 0) config.fail('head_dim', 'even (rotary embeddings pair its halves)');
  return {
    numLayers: config.positiveInt('num_hidden_layers'),
    hiddenSize,
    numHeads,
    numKvHeads,
    headDim,
    vocabSize: config.positiveInt('vocab_size'),
  };
}

export function defaultNumerics(config: ConfigReader, headDim: number): FamilyModel['numerics'] {
  return {
    rmsNormEps: config.positiveNumber('rms_norm_eps', 1e-6),
    normAddsOne: false,
    embeddingScale: 1,
    attentionScale: 1 / Math.sqrt(headDim),
    attentionSoftcap: 0,
    finalSoftcap: 0,
    activation: 'silu',
    swigluAlpha: 0,
    swigluLimit: 0,
    routing: 'softmax_topk',
    normTopkProb: false,
  };
}

export function requireActivation(config: ConfigReader, field: string, expected: string, fallback: string): void {
  if (config.string(field, fallback) !== expected) config.fail(field, JSON.stringify(expected));
}

/**
 * A config's rope parameters: transformers 5's rope_parameters (its rope_theta inside), or the
 * published rope_theta and rope_scaling. Gemma 3 keys rope_parameters by layer type; layerType
 * picks that record.
 */
export function ropeParametersOf(config: ConfigReader, defaultTheta: number, layerType?: string): RopeParameters {
  const originalMaxPositionEmbeddings = config.has('original_max_position_embeddings') ? config.positiveInt('original_max_position_embeddings') : null;
  let parameters = config.record('rope_parameters');
  if (parameters !== null && layerType !== undefined && typeof parameters[layerType] === 'object') parameters = parameters[layerType] as Record<string, unknown>;
  if (parameters !== null && typeof parameters.rope_theta === 'number') {
    return { ropeTheta: parameters.rope_theta, scaling: parameters, originalMaxPositionEmbeddings };
  }
  return { ropeTheta: config.positiveNumber('rope_theta', defaultTheta), scaling: config.record('rope_scaling'), originalMaxPositionEmbeddings };
}

export function rope(config: ConfigReader, params: RopeParameters, headDim: number, options: CheckpointOptions, partialRotaryFactor = 1): RopeSpec {
  const maxPositionEmbeddings = config.positiveInt('max_position_embeddings');
  return resolveRope(
    params,
    { headDim, partialRotaryFactor, maxPositionEmbeddings, maxModelLen: options.maxModelLen ?? maxPositionEmbeddings },
    (field, expected, got) => {
      throw new Error(`${config.file}: ${field === 'partial_rotary_factor' ? field : `rope_scaling.${field}`} must be ${expected}, got ${JSON.stringify(got)}`);
    },
  );
}

/** Which layers slide, from layer_types ("sliding_attention" / "full_attention") or a fallback rule. */
export function slidingLayers(config: ConfigReader, numLayers: number, fallback: (layer: number) => boolean): boolean[] {
  const types = config.stringList('layer_types');
  if (types === null) return Array.from({ length: numLayers }, (_, i) => fallback(i));
  if (types.length !== numLayers || !types.every((type) => type === 'sliding_attention' || type === 'full_attention')) {
    config.fail('layer_types', `${numLayers} entries of "sliding_attention" or "full_attention"`);
  }
  return types.map((type) => type === 'sliding_attention');
}

export interface AttentionOptions {
  qkvBias: boolean;
  oBias: boolean;
  qkNorm: boolean;
  sinks: boolean;
}

type AttentionRefs = Pick<FamilyLayer, 'qProj' | 'kProj' | 'vProj' | 'qBias' | 'kBias' | 'vBias' | 'qNorm' | 'kNorm' | 'sinks' | 'oProj' | 'oBias'>;

/** self_attn.{q,k,v,o}_proj with the biases, per-head norms and sinks the architecture has. */
export function attentionRefs(tensors: TensorCatalogue, prefix: string, shape: Shape, options: AttentionOptions): AttentionRefs {
  const { hiddenSize, headDim } = shape;
  const qSize = shape.numHeads * headDim;
  const kvSize = shape.numKvHeads * headDim;
  const at = `${prefix}.self_attn`;
  const bias = (name: string, size: number) => (options.qkvBias ? tensors.require(`${at}.${name}.bias`, [size]) : null);
  return {
    qProj: tensors.require(`${at}.q_proj.weight`, [qSize, hiddenSize]),
    kProj: tensors.require(`${at}.k_proj.weight`, [kvSize, hiddenSize]),
    vProj: tensors.require(`${at}.v_proj.weight`, [kvSize, hiddenSize]),
    qBias: bias('q_proj', qSize),
    kBias: bias('k_proj', kvSize),
    vBias: bias('v_proj', kvSize),
    qNorm: options.qkNorm ? tensors.require(`${at}.q_norm.weight`, [headDim]) : null,
    kNorm: options.qkNorm ? tensors.require(`${at}.k_norm.weight`, [headDim]) : null,
    sinks: options.sinks ? tensors.require(`${at}.sinks`, [shape.numHeads]) : null,
    oProj: tensors.require(`${at}.o_proj.weight`, [hiddenSize, qSize]),
    oBias: options.oBias ? tensors.require(`${at}.o_proj.bias`, [hiddenSize]) : null,
  };
}

/** A dense MLP's matrices, named as the family names them (gate, up, down). */
export function denseMlpRefs(
  tensors: TensorCatalogue,
  prefix: string,
  hiddenSize: number,
  intermediateSize: number,
  names: readonly [string, string, string] = ['gate_proj', 'up_proj', 'down_proj'],
): { gateProj: TensorRef; upProj: TensorRef; downProj: TensorRef } {
  return {
    gateProj: tensors.require(`${prefix}.${names[0]}.weight`, [intermediateSize, hiddenSize]),
    upProj: tensors.require(`${prefix}.${names[1]}.weight`, [intermediateSize, hiddenSize]),
    downProj: tensors.require(`${prefix}.${names[2]}.weight`, [hiddenSize, intermediateSize]),
  };
}

export const NO_MOE = { router: null, routerBias: null, experts: null } as const;
export const NO_DENSE_MLP = { gateProj: null, upProj: null, downProj: null } as const;

/** Per-expert tensors `${prefix}.${e}.{gate,up,down}.weight` (Qwen3-MoE's experts.N.gate_proj, Mixtral's experts.N.w1). */
export function expertRefs(
  tensors: TensorCatalogue,
  prefix: string,
  numExperts: number,
  hiddenSize: number,
  width: number,
  names: readonly [string, string, string],
): ExpertRefs[] {
  return Array.from({ length: numExperts }, (_, e) => ({
    ...denseMlpRefs(tensors, `${prefix}.${e}`, hiddenSize, width, names),
    gateBias: null,
    upBias: null,
    downBias: null,
  }));
}

/** embed_tokens, the final norm and the LM head (the embedding itself when tied). */
export function embeddingAndHead(
  config: ConfigReader,
  tensors: TensorCatalogue,
  shape: Shape,
  tieByDefault: boolean,
  modelPrefix = 'model',
): Pick<FamilyModel, 'embedTokens' | 'finalNorm' | 'lmHead' | 'tieWordEmbeddings'> {
  const tieWordEmbeddings = config.bool('tie_word_embeddings', tieByDefault);
  const embedTokens = tensors.require(`${modelPrefix}.embed_tokens.weight`, [shape.vocabSize, shape.hiddenSize]);
  return {
    embedTokens,
    finalNorm: tensors.require(`${modelPrefix}.norm.weight`, [shape.hiddenSize]),
    lmHead: tieWordEmbeddings ? embedTokens : tensors.require('lm_head.weight', [shape.vocabSize, shape.hiddenSize]),
    tieWordEmbeddings,
  };
}

/**
 * A dense decoder around its layers (Llama, Qwen3, Phi-3): the default numerics, one RoPE table
 * (theta 10000 unless the config says otherwise), the embedding and an untied-by-default head.
 */
export function denseFamilyResult(
  config: ConfigReader,
  tensors: TensorCatalogue,
  options: CheckpointOptions,
  shape: Shape,
  intermediateSize: number,
  layers: FamilyLayer[],
  partialRotaryFactor = 1,
): FamilyModel {
  return {
    config,
    dims: { ...shape, intermediateSize, moeIntermediateSize: 0, numExpertsPerToken: 0 },
    numerics: defaultNumerics(config, shape.headDim),
    ropes: [rope(config, ropeParametersOf(config, 10000), shape.headDim, options, partialRotaryFactor)],
    layers,
    ...embeddingAndHead(config, tensors, shape, false),
    maxPositionEmbeddings: config.positiveInt('max_position_embeddings'),
  };
}
