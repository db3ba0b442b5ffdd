// Qwen3 and Qwen3-MoE (transformers' modeling_qwen3.py, modeling_qwen3_moe.py): Llama's layer
// with an RMS norm of every query and key head (q_norm, k_norm over head_dim) before RoPE.
// Qwen3-MoE replaces the MLP of layer i with a sparse MoE block when i is not in mlp_only_layers
// and (i + 1) % decoder_sparse_step == 0: a router (mlp.gate) softmaxes over num_experts, keeps
// the top num_experts_per_tok, renormalized when norm_topk_prob is set.
import type { ConfigReader, TensorCatalogue } from '../checkpoint-reader.ts';
import {
  NO_DENSE_MLP,
  NO_MOE,
  attentionRefs,
  defaultNumerics,
  denseFamilyResult,
  denseMlpRefs,
  embeddingAndHead,
  expertRefs,
  readShape,
  requireActivation,
  rope,
  ropeParametersOf,
  slidingLayers,
  type Family,
  type FamilyLayer,
  type Shape,
} from './common.ts';

/** config.sliding_window when use_sliding_window is set (both configs null it otherwise), else 0. */
function windowOf(config: ConfigReader): number {
  if (!config.bool('use_sliding_window', false) || !config.has('sliding_window')) return 0;
  return config.positiveInt('sliding_window');
}

function attentionPart(config: ConfigReader, tensors: TensorCatalogue, prefix: string, shape: Shape) {
  const bias = config.bool('attention_bias', false);
  return {
    inputNorm: tensors.require(`${prefix}.input_layernorm.weight`, [shape.hiddenSize]),
    ...attentionRefs(tensors, prefix, shape, { qkvBias: bias, oBias: bias, qkNorm: true, sinks: false }),
    attentionOutputNorm: null,
    ffnNorm: tensors.require(`${prefix}.post_attention_layernorm.weight`, [shape.hiddenSize]),
    ffnOutputNorm: null,
    ropeIndex: 0,
  };
}

export const qwen3: Family = (config, tensors, options) => {
  requireActivation(config, 'hidden_act', 'silu', 'silu');
  // Qwen3Config's head_dim defaults to 128, not hidden / heads.
  const shape = readShape(config, 128);
  const intermediateSize = config.positiveInt('intermediate_size');
  const window = windowOf(config);
  // Qwen3Config: layers from max_window_layers on slide, unless layer_types says otherwise.
  const maxWindowLayers = config.nonNegativeInt('max_window_layers', 28);
  const sliding = slidingLayers(config, shape.numLayers, (i) => window > 0 && i >= maxWindowLayers);
  const layers: FamilyLayer[] = Array.from({ length: shape.numLayers }, (_, i) => {
    const prefix = `model.layers.${i}`;
    return {
      ...attentionPart(config, tensors, prefix, shape),
      slidingWindowTokens: sliding[i] ? window : 0,
      ...denseMlpRefs(tensors, `${prefix}.mlp`, shape.hiddenSize, intermediateSize),
      ...NO_MOE,
    };
  });
  return denseFamilyResult(config, tensors, options, shape, intermediateSize, layers);
};

export const qwen3Moe: Family = (config, tensors, options) => {
  requireActivation(config, 'hidden_act', 'silu', 'silu');
  const shape = readShape(config);
  const intermediateSize = config.positiveInt('intermediate_size');
  const moeIntermediateSize = config.positiveInt('moe_intermediate_size');
  const numExperts = config.has('num_experts') ? config.positiveInt('num_experts') : config.positiveInt('num_local_experts');
  const numExpertsPerToken = config.positiveInt('num_experts_per_tok');
  if (numExpertsPerToken > numExperts) config.fail('num_experts_per_tok', `at most num_experts (${numExperts})`);
  const sparseStep = config.positiveInt('decoder_sparse_step', 1);
  const mlpOnlyLayers = new Set(config.intList('mlp_only_layers', []));
  const window = windowOf(config);
  const layers: FamilyLayer[] = Array.from({ length: shape.numLayers }, (_, i) => {
    const prefix = `model.layers.${i}`;
    const sparse = !mlpOnlyLayers.has(i) && (i + 1) % sparseStep === 0;
    const mlp = sparse
      ? {
          ...NO_DENSE_MLP,
          router: tensors.require(`${prefix}.mlp.gate.weight`, [numExperts, shape.hiddenSize]),
          routerBias: null,
          experts: expertRefs(tensors, `${prefix}.mlp.experts`, numExperts, shape.hiddenSize, moeIntermediateSize, ['gate_proj', 'up_proj', 'down_proj']),
        }
      : { ...denseMlpRefs(tensors, `${prefix}.mlp`, shape.hiddenSize, intermediateSize), ...NO_MOE };
    return { ...attentionPart(config, tensors, prefix, shape), slidingWindowTokens: window, ...mlp };
  });
  return {
    config,
    dims: { ...shape, intermediateSize, moeIntermediateSize, numExpertsPerToken },
    numerics: { ...defaultNumerics(config, shape.headDim), normTopkProb: config.bool('norm_topk_prob', false) },
    ropes: [rope(config, ropeParametersOf(config, 10000), shape.headDim, options)],
    layers,
    ...embeddingAndHead(config, tensors, shape, false),
    maxPositionEmbeddings: config.positiveInt('max_position_embeddings'),
  };
};
