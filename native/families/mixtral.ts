// Mixtral (transformers' modeling_mixtral.py): Mistral's attention (sliding_window on every
// layer when set) and a block_sparse_moe MLP: a router (gate) softmaxes over num_local_experts,
// keeps the top num_experts_per_tok and renormalizes them (the softmax of the top-k logits); each
// expert is w2(silu(w1 x) * w3 x).
import {
  NO_DENSE_MLP,
  attentionRefs,
  defaultNumerics,
  embeddingAndHead,
  expertRefs,
  readShape,
  requireActivation,
  rope,
  ropeParametersOf,
  type Family,
} from './common.ts';

export const mixtral: Family = (config, tensors, options) => {
  requireActivation(config, 'hidden_act', 'silu', 'silu');
  const shape = readShape(config);
  const intermediateSize = config.positiveInt('intermediate_size');
  const numExperts = config.positiveInt('num_local_experts');
  const numExpertsPerToken = config.positiveInt('num_experts_per_tok');
  if (numExpertsPerToken > numExperts) config.fail('num_experts_per_tok', `at most num_local_experts (${numExperts})`);
  const window = config.has('sliding_window') ? config.positiveInt('sliding_window') : 0;
  const layers = Array.from({ length: shape.numLayers }, (_, i) => {
    const prefix = `model.layers.${i}`;
    const moe = `${prefix}.block_sparse_moe`;
    return {
      inputNorm: tensors.require(`${prefix}.input_layernorm.weight`, [shape.hiddenSize]),
      ...attentionRefs(tensors, prefix, shape, { qkvBias: false, oBias: false, qkNorm: false, sinks: false }),
      attentionOutputNorm: null,
      ffnNorm: tensors.require(`${prefix}.post_attention_layernorm.weight`, [shape.hiddenSize]),
      ffnOutputNorm: null,
      slidingWindowTokens: window,
      ropeIndex: 0,
      ...NO_DENSE_MLP,
      router: tensors.require(`${moe}.gate.weight`, [numExperts, shape.hiddenSize]),
      routerBias: null,
      experts: expertRefs(tensors, `${moe}.experts`, numExperts, shape.hiddenSize, intermediateSize, ['w1', 'w3', 'w2']),
    };
  });
  return {
    config,
    dims: { ...shape, intermediateSize, moeIntermediateSize: intermediateSize, numExpertsPerToken },
    numerics: { ...defaultNumerics(config, shape.headDim), normTopkProb: true },
    ropes: [rope(config, ropeParametersOf(config, 1e6), shape.headDim, options)],
    layers,
    ...embeddingAndHead(config, tensors, shape, false),
    maxPositionEmbeddings: config.positiveInt('max_position_embeddings'),
  };
};
