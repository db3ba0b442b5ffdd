// Phi-3 and Phi-4 (transformers' modeling_phi3.py; Phi-4 ships as Phi3ForCausalLM): Llama's
// layer with fused projections, qkv_proj (q, k, v rows in that order) and gate_up_proj (gate rows,
// then up rows), partial rotary embeddings (partial_rotary_factor: only the leading dims of each
// head rotate, Phi-4-mini's 0.75) and LongRoPE scaling (short and long per-dim factors, with
// original_max_position_embeddings at the top level of config.json). sliding_window applies to
// every layer.
import { rowRange } from '../checkpoint-reader.ts';
import { NO_MOE, denseFamilyResult, readShape, requireActivation, type Family } from './common.ts';

export const phi3: Family = (config, tensors, options) => {
  requireActivation(config, 'hidden_act', 'silu', 'silu');
  if (config.bool('attention_bias', false)) config.fail('attention_bias', 'false');
  const shape = readShape(config);
  const { hiddenSize, headDim } = shape;
  const intermediateSize = config.positiveInt('intermediate_size');
  const qSize = shape.numHeads * headDim;
  const kvSize = shape.numKvHeads * headDim;
  const window = config.has('sliding_window') ? config.positiveInt('sliding_window') : 0;
  const layers = Array.from({ length: shape.numLayers }, (_, i) => {
    const prefix = `model.layers.${i}`;
    const qkv = tensors.require(`${prefix}.self_attn.qkv_proj.weight`, [qSize + 2 * kvSize, hiddenSize]);
    const gateUp = tensors.require(`${prefix}.mlp.gate_up_proj.weight`, [2 * intermediateSize, hiddenSize]);
    return {
      inputNorm: tensors.require(`${prefix}.input_layernorm.weight`, [hiddenSize]),
      qProj: rowRange(qkv, hiddenSize, 0, qSize),
      kProj: rowRange(qkv, hiddenSize, qSize, kvSize),
      vProj: rowRange(qkv, hiddenSize, qSize + kvSize, kvSize),
      qBias: null,
      kBias: null,
      vBias: null,
      qNorm: null,
      kNorm: null,
      sinks: null,
      oProj: tensors.require(`${prefix}.self_attn.o_proj.weight`, [hiddenSize, qSize]),
      oBias: null,
      attentionOutputNorm: null,
      ffnNorm: tensors.require(`${prefix}.post_attention_layernorm.weight`, [hiddenSize]),
      ffnOutputNorm: null,
      slidingWindowTokens: window,
      ropeIndex: 0,
      gateProj: rowRange(gateUp, hiddenSize, 0, intermediateSize),
      upProj: rowRange(gateUp, hiddenSize, intermediateSize, intermediateSize),
      downProj: tensors.require(`${prefix}.mlp.down_proj.weight`, [hiddenSize, intermediateSize]),
      ...NO_MOE,
    };
  });
  const partialRotaryFactor = config.has('partial_rotary_factor') ? config.positiveNumber('partial_rotary_factor') : 1;
  if (partialRotaryFactor > 1) config.fail('partial_rotary_factor', 'at most 1');
  return denseFamilyResult(config, tensors, options, shape, intermediateSize, layers, partialRotaryFactor);
};
