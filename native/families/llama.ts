// Llama, Mistral and Qwen2 (transformers' modeling_llama.py, modeling_mistral.py,
// modeling_qwen2.py): pre-norm decoder layers, SwiGLU MLP, RoPE on every head. Mistral's
// sliding_window applies to every layer; Qwen2 adds q/k/v biases.
import type { Architecture } from '../api.ts';
import { NO_MOE, attentionRefs, denseFamilyResult, denseMlpRefs, readShape, requireActivation, type Family } from './common.ts';

export function llamaFamily(architecture: Extract<Architecture, 'LlamaForCausalLM' | 'MistralForCausalLM' | 'Qwen2ForCausalLM'>): Family {
  return (config, tensors, options) => {
    requireActivation(config, 'hidden_act', 'silu', 'silu');
    if (architecture === 'LlamaForCausalLM') {
      if (config.bool('attention_bias', false)) config.fail('attention_bias', 'false (o_proj bias is not supported)');
      if (config.bool('mlp_bias', false)) config.fail('mlp_bias', 'false');
    }
    if (architecture === 'Qwen2ForCausalLM' && config.bool('use_sliding_window', false)) {
      config.fail('use_sliding_window', 'false (per-layer sliding windows are not supported)');
    }
    const shape = readShape(config);
    const intermediateSize = config.positiveInt('intermediate_size');
    const window = architecture === 'MistralForCausalLM' && config.has('sliding_window') ? config.positiveInt('sliding_window') : 0;
    const qkvBias = architecture === 'Qwen2ForCausalLM';
    const layers = Array.from({ length: shape.numLayers }, (_, i) => {
      const prefix = `model.layers.${i}`;
      return {
        inputNorm: tensors.require(`${prefix}.input_layernorm.weight`, [shape.hiddenSize]),
        ...attentionRefs(tensors, prefix, shape, { qkvBias, oBias: false, qkNorm: false, sinks: false }),
        attentionOutputNorm: null,
        ffnNorm: tensors.require(`${prefix}.post_attention_layernorm.weight`, [shape.hiddenSize]),
        ffnOutputNorm: null,
        slidingWindowTokens: window,
        ropeIndex: 0,
        ...denseMlpRefs(tensors, `${prefix}.mlp`, shape.hiddenSize, intermediateSize),
        ...NO_MOE,
      };
    });
    return denseFamilyResult(config, tensors, options, shape, intermediateSize, layers);
  };
}
