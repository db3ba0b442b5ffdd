// gpt-oss (transformers' modeling_gpt_oss.py, configuration_gpt_oss.py, integrations/mxfp4.py):
// attention with q/k/v/o biases and a learned sink logit per head (it joins every softmax's
// denominator), layers alternating sliding-window and full attention (layer_types), YaRN rope;
// a MoE MLP whose router has a bias and softmaxes over its top-k logits, and whose experts apply
// a clamped SwiGLU, (clamp(up) + 1) * g * sigmoid(alpha * g) with g = min(gate, limit), over gate
// and up rows interleaved in one gate_up_proj, biases included. Experts ship as MXFP4 blocks and
// scales ([experts, out, in / 32, 16] and [experts, out, in / 32]), read in place and converted
// at load to int8 blocks, exactly; dequantized checkpoints keep transformers' [experts, in, out]
// bf16 layout, read transposed. llama.cpp's GGUF splits them into gate, up and down stacks.
import type { ExpertRefs } from '../checkpoint.ts';
import { interleavedRows, slice, transposedColumns, type TensorCatalogue, type TensorRef } from '../checkpoint-reader.ts';
import { NO_DENSE_MLP, attentionRefs, defaultNumerics, embeddingAndHead, readShape, rope, ropeParametersOf, slidingLayers, type Family } from './common.ts';

/** llama.cpp's GGUF layout: gate, up and down each a stack [experts, out, in], biases beside. */
function stackedExpertsOf(tensors: TensorCatalogue, prefix: string, numExperts: number, hiddenSize: number, width: number): ExpertRefs[] {
  const stack = (name: string, shape: readonly number[]) => tensors.require(`${prefix}.${name}`, [numExperts, ...shape]);
  const gate = stack('gate_proj.weight', [width, hiddenSize]);
  const up = stack('up_proj.weight', [width, hiddenSize]);
  const down = stack('down_proj.weight', [hiddenSize, width]);
  const gateBias = stack('gate_proj.bias', [width]);
  const upBias = stack('up_proj.bias', [width]);
  const downBias = stack('down_proj.bias', [hiddenSize]);
  return Array.from({ length: numExperts }, (_, e) => ({
    gateProj: slice(gate, e, numExperts),
    upProj: slice(up, e, numExperts),
    downProj: slice(down, e, numExperts),
    gateBias: slice(gateBias, e, numExperts),
    upBias: slice(upBias, e, numExperts),
    downBias: slice(downBias, e, numExperts),
  }));
}

function expertsOf(tensors: TensorCatalogue, prefix: string, numExperts: number, hiddenSize: number, width: number): ExpertRefs[] {
  if (tensors.has(`${prefix}.gate_proj.weight`)) return stackedExpertsOf(tensors, prefix, numExperts, hiddenSize, width);
  const mxfp4 = tensors.has(`${prefix}.gate_up_proj_blocks`);
  const gateUp = mxfp4
    ? tensors.requireMxfp4(`${prefix}.gate_up_proj`, [numExperts], 2 * width, hiddenSize)
    : tensors.require(`${prefix}.gate_up_proj`, [numExperts, hiddenSize, 2 * width]);
  const down = mxfp4
    ? tensors.requireMxfp4(`${prefix}.down_proj`, [numExperts], hiddenSize, width)
    : tensors.require(`${prefix}.down_proj`, [numExperts, width, hiddenSize]);
  const gateUpBias = tensors.require(`${prefix}.gate_up_proj_bias`, [numExperts, 2 * width]);
  const downBias = tensors.require(`${prefix}.down_proj_bias`, [numExperts, hiddenSize]);
  // Gate rows are the even ones, up rows the odd (transformers' gate_up[..., ::2], [..., 1::2]).
  const half = (ref: TensorRef, parity: 0 | 1): TensorRef =>
    mxfp4 ? interleavedRows(ref, hiddenSize, parity) : transposedColumns(ref, 2 * width, parity, 2);
  return Array.from({ length: numExperts }, (_, e) => {
    const expertGateUp = slice(gateUp, e, numExperts);
    const expertDown = slice(down, e, numExperts);
    const expertBias = slice(gateUpBias, e, numExperts);
    return {
      gateProj: half(expertGateUp, 0),
      upProj: half(expertGateUp, 1),
      downProj: mxfp4 ? expertDown : transposedColumns(expertDown, hiddenSize, 0, 1),
      gateBias: interleavedRows(expertBias, 1, 0),
      upBias: interleavedRows(expertBias, 1, 1),
      downBias: slice(downBias, e, numExperts),
    };
  });
}

export const gptOss: Family = (config, tensors, options) => {
  const shape = readShape(config, 64);
  const width = config.positiveInt('intermediate_size');
  const numExperts = config.has('num_local_experts') ? config.positiveInt('num_local_experts') : config.positiveInt('num_experts');
  const numExpertsPerToken = config.has('num_experts_per_tok') ? config.positiveInt('num_experts_per_tok') : config.positiveInt('experts_per_token');
  if (numExpertsPerToken > numExperts) config.fail('num_experts_per_tok', `at most num_local_experts (${numExperts})`);
  const quantization = config.record('quantization_config');
  if (quantization !== null && quantization.quant_method !== 'mxfp4') config.fail('quantization_config', 'absent or of quant_method "mxfp4"');
  if (!config.bool('attention_bias', true)) config.fail('attention_bias', 'true (gpt-oss has q/k/v/o biases)');
  const window = config.positiveInt('sliding_window', 128);
  const sliding = slidingLayers(config, shape.numLayers, (i) => (i + 1) % 2 !== 0);
  const layers = Array.from({ length: shape.numLayers }, (_, i) => {
    const prefix = `model.layers.${i}`;
    return {
      inputNorm: tensors.require(`${prefix}.input_layernorm.weight`, [shape.hiddenSize]),
      ...attentionRefs(tensors, prefix, shape, { qkvBias: true, oBias: true, qkNorm: false, sinks: true }),
      attentionOutputNorm: null,
      ffnNorm: tensors.require(`${prefix}.post_attention_layernorm.weight`, [shape.hiddenSize]),
      ffnOutputNorm: null,
      slidingWindowTokens: sliding[i] ? window : 0,
      ropeIndex: 0,
      ...NO_DENSE_MLP,
      router: tensors.require(`${prefix}.mlp.router.weight`, [numExperts, shape.hiddenSize]),
      routerBias: tensors.require(`${prefix}.mlp.router.bias`, [numExperts]),
      experts: expertsOf(tensors, `${prefix}.mlp.experts`, numExperts, shape.hiddenSize, width),
    };
  });
  return {
    config,
    dims: { ...shape, intermediateSize: width, moeIntermediateSize: width, numExpertsPerToken },
    numerics: {
      ...defaultNumerics(config, shape.headDim),
      activation: 'clamped_swiglu',
      swigluAlpha: config.positiveNumber('swiglu_alpha', 1.702),
      swigluLimit: config.positiveNumber('swiglu_limit', 7),
      routing: 'topk_softmax',
    },
    ropes: [rope(config, ropeParametersOf(config, 150000), shape.headDim, options)],
    layers,
    ...embeddingAndHead(config, tensors, shape, false),
    maxPositionEmbeddings: config.positiveInt('max_position_embeddings'),
  };
};
