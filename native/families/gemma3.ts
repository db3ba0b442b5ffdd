// Gemma 3's text model (transformers' modeling_gemma3.py, configuration_gemma3.py), alone
// (Gemma3ForCausalLM) or inside the multimodal checkpoint (Gemma3ForConditionalGeneration: its
// text_config and language-model tensors; the vision tower is not loaded). Every RMS norm
// multiplies by (1 + w); embeddings are scaled by sqrt(hidden) in the weights' dtype; each layer
// norms its attention and MLP outputs too (post_attention_layernorm, post_feedforward_layernorm)
// besides their inputs (input_layernorm, pre_feedforward_layernorm); q and k heads are normed;
// scores are scaled by query_pre_attn_scalar^-0.5 and soft-capped when the config says so; the
// MLP is gelu_pytorch_tanh-gated. Layers slide (sliding_window) or see everything by layer_types,
// or by sliding_window_pattern (every pattern-th layer is global), and the two kinds rotate with
// their own bases: rope_theta with rope_scaling for global layers, rope_local_base_freq for local.
import type { ConfigReader, TensorCatalogue } from '../checkpoint-reader.ts';
import {
  NO_MOE,
  attentionRefs,
  defaultNumerics,
  denseMlpRefs,
  embeddingAndHead,
  readShape,
  rope,
  ropeParametersOf,
  slidingLayers,
  type Family,
} from './common.ts';

/** The text model's config record and tensor prefix (the multimodal checkpoint nests both). */
function textModel(config: ConfigReader, tensors: TensorCatalogue): { text: ConfigReader; prefix: string } {
  if (!config.has('text_config')) return { text: config, prefix: 'model' };
  // transformers 4.52+ saves model.language_model.*; the original release language_model.model.*.
  const prefix = tensors.firstPresent(['model.language_model.embed_tokens.weight', 'language_model.model.embed_tokens.weight']);
  return { text: config.nested('text_config'), prefix: prefix?.replace(/\.embed_tokens\.weight$/, '') ?? 'model.language_model' };
}

export const gemma3: Family = (config, tensors, options) => {
  const { text, prefix: modelPrefix } = textModel(config, tensors);
  const activation = text.has('hidden_activation') ? 'hidden_activation' : 'hidden_act';
  if (text.string(activation, 'gelu_pytorch_tanh') !== 'gelu_pytorch_tanh') text.fail(activation, '"gelu_pytorch_tanh"');
  if (text.bool('use_bidirectional_attention', false)) text.fail('use_bidirectional_attention', 'false (a causal language model)');
  if (text.bool('attention_bias', false)) text.fail('attention_bias', 'false');
  const shape = readShape(text, 256);
  const intermediateSize = text.positiveInt('intermediate_size');
  const window = text.positiveInt('sliding_window', 4096);
  const pattern = text.positiveInt('sliding_window_pattern', 6);
  const sliding = slidingLayers(text, shape.numLayers, (i) => (i + 1) % pattern !== 0);
  const layers = Array.from({ length: shape.numLayers }, (_, i) => {
    const prefix = `${modelPrefix}.layers.${i}`;
    const norm = (name: string) => tensors.require(`${prefix}.${name}.weight`, [shape.hiddenSize]);
    return {
      inputNorm: norm('input_layernorm'),
      ...attentionRefs(tensors, prefix, shape, { qkvBias: false, oBias: false, qkNorm: true, sinks: false }),
      attentionOutputNorm: norm('post_attention_layernorm'),
      ffnNorm: norm('pre_feedforward_layernorm'),
      ffnOutputNorm: norm('post_feedforward_layernorm'),
      slidingWindowTokens: sliding[i] ? window : 0,
      ropeIndex: sliding[i] ? 1 : 0,
      ...denseMlpRefs(tensors, `${prefix}.mlp`, shape.hiddenSize, intermediateSize),
      ...NO_MOE,
    };
  });
  const globalRope = rope(text, ropeParametersOf(text, 1e6, 'full_attention'), shape.headDim, options);
  const local = ropeParametersOf(text, 1e6, 'sliding_attention');
  const localRope = rope(
    text,
    text.has('rope_parameters') ? local : { ropeTheta: text.positiveNumber('rope_local_base_freq', 10000), scaling: null, originalMaxPositionEmbeddings: null },
    shape.headDim,
    options,
  );
  const softcap = (field: string) => text.optionalPositiveNumber(field) ?? 0;
  return {
    config,
    dims: { ...shape, intermediateSize, moeIntermediateSize: 0, numExpertsPerToken: 0 },
    numerics: {
      ...defaultNumerics(text, shape.headDim),
      normAddsOne: true,
      embeddingScale: Math.sqrt(shape.hiddenSize),
      attentionScale: text.positiveNumber('query_pre_attn_scalar', 256) ** -0.5,
      attentionSoftcap: softcap('attn_logit_softcapping'),
      finalSoftcap: softcap('final_logit_softcapping'),
      activation: 'gelu_tanh',
    },
    ropes: [globalRope, localRope],
    layers,
    ...embeddingAndHead(text, tensors, shape, true, modelPrefix),
    maxPositionEmbeddings: text.positiveInt('max_position_embeddings', 131072),
  };
};
