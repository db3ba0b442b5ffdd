// The newer families make-checkpoint writes: config.json with the fields the published
// checkpoints carry (Qwen/Qwen3-0.6B, Qwen/Qwen3-30B-A3B, mistralai/Mixtral-8x7B-v0.1,
// google/gemma-3-1b-it, microsoft/Phi-3-mini-128k-instruct and Phi-4-mini-instruct,
// openai/gpt-oss-20b), tensors under transformers' names and [out, in] shapes, and gpt-oss's
// experts as it ships them: MXFP4 blocks and scales (or the dequantized bf16 layout).
import type { TensorSpec, WriteDtype } from './safetensors-writer.ts';
import { headDimOf, type CheckpointOptions } from './make-checkpoint.ts';
import { PyFloat } from './python-json.ts';

export type NewArchName = 'qwen3' | 'qwen3_moe' | 'mixtral' | 'gemma3' | 'phi3' | 'gpt_oss';

export const NEW_ARCHITECTURES: Readonly<Record<NewArchName, string>> = {
  qwen3: 'Qwen3ForCausalLM',
  qwen3_moe: 'Qwen3MoeForCausalLM',
  mixtral: 'MixtralForCausalLM',
  gemma3: 'Gemma3ForCausalLM',
  phi3: 'Phi3ForCausalLM',
  gpt_oss: 'GptOssForCausalLM',
};

const MODEL_TYPES: Readonly<Record<NewArchName, string>> = {
  qwen3: 'qwen3',
  qwen3_moe: 'qwen3_moe',
  mixtral: 'mixtral',
  gemma3: 'gemma3_text',
  phi3: 'phi3',
  gpt_oss: 'gpt_oss',
};

export function isNewArch(arch: string): arch is NewArchName {
  return Object.hasOwn(NEW_ARCHITECTURES, arch);
}

/** Whether layer i is a sliding-window layer, as each config class derives it. */
export function slidingLayerOf(options: CheckpointOptions, layer: number): boolean {
  switch (options.arch) {
    case 'gemma3':
      return (layer + 1) % (options.slidingWindowPattern ?? 6) !== 0;
    case 'gpt_oss':
      return layer % 2 === 0;
    case 'qwen3':
      return options.slidingWindow !== undefined && layer >= (options.maxWindowLayers ?? options.numLayers);
    default:
      return options.slidingWindow !== undefined;
  }
}

/** Qwen3-MoE's rule: a sparse MLP unless listed in mlp_only_layers, every decoder_sparse_step-th layer. */
export function isMoeLayer(options: CheckpointOptions, layer: number): boolean {
  if (options.arch === 'mixtral' || options.arch === 'gpt_oss') return true;
  if (options.arch !== 'qwen3_moe') return false;
  return !(options.mlpOnlyLayers ?? []).includes(layer) && (layer + 1) % (options.decoderSparseStep ?? 1) === 0;
}

const f = (x: number) => new PyFloat(x);

function yarnScaling(options: CheckpointOptions): Record<string, unknown> | null {
  if (options.yarn === undefined) return null;
  return {
    beta_fast: f(32),
    beta_slow: f(1),
    factor: f(options.yarn.factor),
    original_max_position_embeddings: options.yarn.originalMaxPositionEmbeddings,
    rope_type: 'yarn',
    ...(options.arch === 'gpt_oss' ? { truncate: false } : {}),
  };
}

/** LongRoPE factors for Phi-3: a smooth ramp, long ones larger, so the two choices differ visibly. */
export function longRopeFactors(options: CheckpointOptions): { short: number[]; long: number[] } {
  const rotaryDim = Math.floor(headDimOf(options) * (options.partialRotaryFactor ?? 1));
  const half = rotaryDim / 2;
  const short = Array.from({ length: half }, (_, i) => 1 + (0.05 * i) / half);
  const long = Array.from({ length: half }, (_, i) => 1 + (6 * i * i) / (half * half));
  return { short, long };
}

/** config.json as the published checkpoint of the family lays it out (floats wrapped). */
export function buildNewConfig(options: CheckpointOptions & { arch: NewArchName }, torchDtype: string): Record<string, unknown> {
  const common: Record<string, unknown> = {
    architectures: [NEW_ARCHITECTURES[options.arch]],
    attention_dropout: f(0),
    bos_token_id: options.bosTokenId,
    eos_token_id: options.eosTokenId,
    hidden_size: options.hiddenSize,
    initializer_range: f(0.02),
    intermediate_size: options.intermediateSize,
    max_position_embeddings: options.maxPositionEmbeddings,
    model_type: MODEL_TYPES[options.arch],
    num_attention_heads: options.numHeads,
    num_hidden_layers: options.numLayers,
    num_key_value_heads: options.numKvHeads,
    rms_norm_eps: f(options.rmsNormEps),
    rope_theta: f(options.ropeTheta),
    tie_word_embeddings: options.tieWordEmbeddings,
    torch_dtype: torchDtype,
    use_cache: true,
    vocab_size: options.vocabSize,
  };
  if (options.headDim !== undefined) common.head_dim = options.headDim;
  const window = options.slidingWindow ?? null;
  const moe = {
    num_experts_per_tok: options.numExpertsPerToken,
    output_router_logits: false,
  };
  switch (options.arch) {
    case 'qwen3':
      return {
        ...common,
        attention_bias: options.attentionBias ?? false,
        head_dim: headDimOf(options),
        hidden_act: 'silu',
        max_window_layers: options.maxWindowLayers ?? options.numLayers,
        rope_scaling: yarnScaling(options),
        sliding_window: window,
        use_sliding_window: window !== null,
      };
    case 'qwen3_moe':
      return {
        ...common,
        ...moe,
        attention_bias: options.attentionBias ?? false,
        decoder_sparse_step: options.decoderSparseStep ?? 1,
        head_dim: headDimOf(options),
        hidden_act: 'silu',
        max_window_layers: options.numLayers,
        mlp_only_layers: options.mlpOnlyLayers ?? [],
        moe_intermediate_size: options.moeIntermediateSize,
        norm_topk_prob: options.normTopkProb ?? true,
        num_experts: options.numExperts,
        rope_scaling: yarnScaling(options),
        router_aux_loss_coef: f(0.001),
        sliding_window: window,
        use_sliding_window: window !== null,
      };
    case 'mixtral':
      return {
        ...common,
        ...moe,
        hidden_act: 'silu',
        num_local_experts: options.numExperts,
        router_aux_loss_coef: f(0.02),
        router_jitter_noise: f(0),
        sliding_window: window,
      };
    case 'gemma3': {
      const text = {
        ...common,
        attention_bias: false,
        attn_logit_softcapping: options.attnLogitSoftcapping === undefined ? null : f(options.attnLogitSoftcapping),
        cache_implementation: 'hybrid',
        final_logit_softcapping: options.finalLogitSoftcapping === undefined ? null : f(options.finalLogitSoftcapping),
        head_dim: headDimOf(options),
        hidden_activation: 'gelu_pytorch_tanh',
        pad_token_id: 0,
        query_pre_attn_scalar: options.queryPreAttnScalar ?? headDimOf(options),
        rope_local_base_freq: f(options.ropeLocalBaseFreq ?? 10000),
        rope_scaling: options.ropeScalingLinear === undefined ? null : { factor: f(options.ropeScalingLinear), rope_type: 'linear' },
        sliding_window: window ?? 4096,
        sliding_window_pattern: options.slidingWindowPattern ?? 6,
      };
      return options.gemma3Multimodal === true ? gemma3MultimodalConfig(text, torchDtype) : text;
    }
    case 'phi3': {
      const longRope = options.longRope;
      const factors = longRopeFactors(options);
      return {
        ...common,
        attention_bias: false,
        embd_pdrop: f(0),
        hidden_act: 'silu',
        ...(longRope === undefined ? {} : { original_max_position_embeddings: longRope.originalMaxPositionEmbeddings }),
        pad_token_id: options.eosTokenId,
        partial_rotary_factor: f(options.partialRotaryFactor ?? 1),
        resid_pdrop: f(0),
        rope_scaling:
          longRope === undefined ? null : { long_factor: factors.long.map(f), short_factor: factors.short.map(f), type: 'longrope' },
        sliding_window: window,
      };
    }
    case 'gpt_oss':
      return {
        ...common,
        ...moe,
        attention_bias: true,
        experts_per_token: options.numExpertsPerToken,
        head_dim: headDimOf(options),
        hidden_act: 'silu',
        initial_context_length: options.yarn?.originalMaxPositionEmbeddings ?? 4096,
        layer_types: Array.from({ length: options.numLayers }, (_, i) => (slidingLayerOf(options, i) ? 'sliding_attention' : 'full_attention')),
        num_local_experts: options.numExperts,
        pad_token_id: options.eosTokenId,
        ...(options.expertFormat === 'bf16'
          ? {}
          : {
              quantization_config: {
                modules_to_not_convert: ['model.layers.*.self_attn', 'model.layers.*.mlp.router', 'model.embed_tokens', 'lm_head'],
                quant_method: 'mxfp4',
              },
            }),
        rope_scaling: yarnScaling(options),
        router_aux_loss_coef: f(0.9),
        sliding_window: window ?? 128,
        swiglu_limit: f(options.swigluLimit ?? 7),
      };
  }
}

/** Every tensor in Hugging Face order and [out, in] shapes. */
export function newTensorSpecs(options: CheckpointOptions & { arch: NewArchName }, dtype: WriteDtype): TensorSpec[] {
  const { hiddenSize, intermediateSize, numHeads, numKvHeads, vocabSize } = options;
  const headDim = headDimOf(options);
  const qDim = numHeads * headDim;
  const kvDim = numKvHeads * headDim;
  const experts = options.numExperts ?? 0;
  const moeWidth = options.arch === 'mixtral' || options.arch === 'gpt_oss' ? intermediateSize : (options.moeIntermediateSize ?? 0);
  const specs: TensorSpec[] = [{ name: 'model.embed_tokens.weight', dtype, shape: [vocabSize, hiddenSize] }];
  const add = (name: string, shape: number[], tensorDtype: TensorSpec['dtype'] = dtype) => specs.push({ name, dtype: tensorDtype, shape });
  for (let layer = 0; layer < options.numLayers; layer++) {
    const p = `model.layers.${layer}`;
    add(`${p}.input_layernorm.weight`, [hiddenSize]);
    if (options.arch === 'phi3') {
      add(`${p}.self_attn.qkv_proj.weight`, [qDim + 2 * kvDim, hiddenSize]);
    } else {
      add(`${p}.self_attn.q_proj.weight`, [qDim, hiddenSize]);
      add(`${p}.self_attn.k_proj.weight`, [kvDim, hiddenSize]);
      add(`${p}.self_attn.v_proj.weight`, [kvDim, hiddenSize]);
    }
    const attentionBias = options.arch === 'gpt_oss' || ((options.arch === 'qwen3' || options.arch === 'qwen3_moe') && options.attentionBias === true);
    if (attentionBias) {
      add(`${p}.self_attn.q_proj.bias`, [qDim]);
      add(`${p}.self_attn.k_proj.bias`, [kvDim]);
      add(`${p}.self_attn.v_proj.bias`, [kvDim]);
    }
    if (options.arch === 'qwen3' || options.arch === 'qwen3_moe' || options.arch === 'gemma3') {
      add(`${p}.self_attn.q_norm.weight`, [headDim]);
      add(`${p}.self_attn.k_norm.weight`, [headDim]);
    }
    add(`${p}.self_attn.o_proj.weight`, [hiddenSize, qDim]);
    if (attentionBias) add(`${p}.self_attn.o_proj.bias`, [hiddenSize]);
    if (options.arch === 'gpt_oss') add(`${p}.self_attn.sinks`, [numHeads]);
    add(`${p}.post_attention_layernorm.weight`, [hiddenSize]);
    if (options.arch === 'gemma3') {
      add(`${p}.pre_feedforward_layernorm.weight`, [hiddenSize]);
      add(`${p}.post_feedforward_layernorm.weight`, [hiddenSize]);
    }
    if (!isMoeLayer(options, layer)) {
      if (options.arch === 'phi3') {
        add(`${p}.mlp.gate_up_proj.weight`, [2 * intermediateSize, hiddenSize]);
      } else {
        add(`${p}.mlp.gate_proj.weight`, [intermediateSize, hiddenSize]);
        add(`${p}.mlp.up_proj.weight`, [intermediateSize, hiddenSize]);
      }
      add(`${p}.mlp.down_proj.weight`, [hiddenSize, intermediateSize]);
      continue;
    }
    if (options.arch === 'gpt_oss') {
      add(`${p}.mlp.router.weight`, [experts, hiddenSize]);
      add(`${p}.mlp.router.bias`, [experts]);
      if (options.expertFormat === 'bf16') {
        add(`${p}.mlp.experts.gate_up_proj`, [experts, hiddenSize, 2 * moeWidth]);
        add(`${p}.mlp.experts.down_proj`, [experts, moeWidth, hiddenSize]);
      } else {
        add(`${p}.mlp.experts.gate_up_proj_blocks`, [experts, 2 * moeWidth, hiddenSize / 32, 16], 'U8');
        add(`${p}.mlp.experts.gate_up_proj_scales`, [experts, 2 * moeWidth, hiddenSize / 32], 'U8');
        add(`${p}.mlp.experts.down_proj_blocks`, [experts, hiddenSize, moeWidth / 32, 16], 'U8');
        add(`${p}.mlp.experts.down_proj_scales`, [experts, hiddenSize, moeWidth / 32], 'U8');
      }
      add(`${p}.mlp.experts.gate_up_proj_bias`, [experts, 2 * moeWidth]);
      add(`${p}.mlp.experts.down_proj_bias`, [experts, hiddenSize]);
      continue;
    }
    const moePrefix = options.arch === 'mixtral' ? `${p}.block_sparse_moe` : `${p}.mlp`;
    const names = options.arch === 'mixtral' ? ['w1', 'w3', 'w2'] : ['gate_proj', 'up_proj', 'down_proj'];
    add(`${moePrefix}.gate.weight`, [experts, hiddenSize]);
    for (let e = 0; e < experts; e++) {
      add(`${moePrefix}.experts.${e}.${names[0]}.weight`, [moeWidth, hiddenSize]);
      add(`${moePrefix}.experts.${e}.${names[1]}.weight`, [moeWidth, hiddenSize]);
      add(`${moePrefix}.experts.${e}.${names[2]}.weight`, [hiddenSize, moeWidth]);
    }
  }
  add('model.norm.weight', [hiddenSize]);
  if (!options.tieWordEmbeddings) add('lm_head.weight', [vocabSize, hiddenSize]);
  if (options.arch === 'gemma3' && options.gemma3Multimodal === true) {
    // transformers 4.52+'s Gemma3ForConditionalGeneration: the text model under
    // model.language_model, lm_head at the top, and a vision tower (a stand-in of two tensors).
    const renamed = specs.map((spec) => ({ ...spec, name: spec.name.replace(/^model\./, 'model.language_model.') }));
    return [
      ...renamed,
      { name: 'model.multi_modal_projector.mm_input_projection_weight', dtype, shape: [GEMMA3_VISION.hidden_size, hiddenSize] },
      { name: 'model.vision_tower.vision_model.embeddings.patch_embedding.weight', dtype, shape: [GEMMA3_VISION.hidden_size, 3, 14, 14] },
    ];
  }
  return specs;
}

/** The random values of a tensor follow its text-model name, so both Gemma 3 layouts hold the same weights. */
export function canonicalTensorName(name: string): string {
  return name.replace(/^model\.language_model\./, 'model.');
}

const GEMMA3_VISION = {
  hidden_size: 16,
  image_size: 28,
  intermediate_size: 32,
  model_type: 'siglip_vision_model',
  num_attention_heads: 2,
  num_hidden_layers: 1,
  patch_size: 14,
  vision_use_head: false,
};

/** Gemma3ForConditionalGeneration's config.json (google/gemma-3-4b-it's keys): the text model's under text_config. */
function gemma3MultimodalConfig(text: Record<string, unknown>, torchDtype: string): Record<string, unknown> {
  const { architectures: _architectures, torch_dtype: _dtype, bos_token_id: _bos, eos_token_id: eos, ...textConfig } = text;
  return {
    architectures: ['Gemma3ForConditionalGeneration'],
    boi_token_index: 255999,
    eoi_token_index: 256000,
    eos_token_id: eos,
    image_token_index: 262144,
    initializer_range: f(0.02),
    mm_tokens_per_image: 256,
    model_type: 'gemma3',
    text_config: textConfig,
    torch_dtype: torchDtype,
    transformers_version: '4.52.0',
    vision_config: GEMMA3_VISION,
  };
}

const FP4_VALUES = [0, 0.5, 1, 1.5, 2, 3, 4, 6];

/**
 * OCP MXFP4 of rows of 32-element blocks: per block, the E8M0 scale 2^(s - 127) that brings the
 * largest magnitude within E2M1's 6, and each value's nearest E2M1 code (sign in bit 3), two per
 * byte, the even element in the low nibble.
 */
export function quantizeMxfp4(values: Float32Array): { blocks: Uint8Array; scales: Uint8Array } {
  const numBlocks = values.length / 32;
  const blocks = new Uint8Array(numBlocks * 16);
  const scales = new Uint8Array(numBlocks);
  for (let b = 0; b < numBlocks; b++) {
    let maxAbs = 0;
    for (let i = 0; i < 32; i++) maxAbs = Math.max(maxAbs, Math.abs(values[b * 32 + i]));
    const exponent = maxAbs === 0 ? -127 : Math.max(-127, Math.ceil(Math.log2(maxAbs / 6)));
    scales[b] = exponent + 127;
    const scale = 2 ** exponent;
    for (let i = 0; i < 32; i++) {
      const x = values[b * 32 + i] / scale;
      let code = 0;
      for (let c = 1; c < 8; c++) if (Math.abs(Math.abs(x) - FP4_VALUES[c]) < Math.abs(Math.abs(x) - FP4_VALUES[code])) code = c;
      const nibble = (x < 0 && code !== 0 ? 8 : 0) | code;
      blocks[b * 16 + (i >> 1)] |= i % 2 === 0 ? nibble : nibble << 4;
    }
  }
  return { blocks, scales };
}
