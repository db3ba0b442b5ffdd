// A GGUF file as a checkpoint: its metadata read into the config.json fields transformers would
// have written, its tensors renamed from llama.cpp's names (gguf-py's tensor_mapping.py, the
// names convert_hf_to_gguf.py writes) to Hugging Face's, so the family modules load it as they
// load safetensors. Matrices in ggml block types carry their encoding. The converter's transforms
// are undone in place, never by copying: Llama's and Mixtral's q and k rows, permuted into
// adjacent rotary pairs, are read back in rotate-half order; stacked expert tensors
// ([experts, rows, k]) are read as one matrix per expert; Gemma 3's norms, stored as 1 + w, are
// used as stored. The file is mapped by the runtime, not read.
import { closeSync, openSync, readSync } from 'node:fs';
import type { Architecture, WeightDtype } from './api.ts';
import type { Checkpoint, CheckpointOptions } from './checkpoint.ts';
import { assembleCheckpoint } from './checkpoint.ts';
import { ConfigReader, TensorCatalogue, type CatalogueTensor, type GgmlEncoding } from './checkpoint-reader.ts';
import { GgufMetadata, readGgufHeader, type GgmlTypeName, type GgufTensorInfo } from '../gguf.ts';
import type { SafetensorsDtype } from './safetensors.ts';

/** general.architecture → transformers' class (llama.cpp writes Mixtral as llama with experts). */
const ARCHITECTURES: Readonly<Record<string, Architecture>> = {
  llama: 'LlamaForCausalLM',
  qwen2: 'Qwen2ForCausalLM',
  qwen3: 'Qwen3ForCausalLM',
  qwen3moe: 'Qwen3MoeForCausalLM',
  gemma3: 'Gemma3ForCausalLM',
  phi3: 'Phi3ForCausalLM',
  'gpt-oss': 'GptOssForCausalLM',
};

const PLAIN_TYPES: Partial<Readonly<Record<GgmlTypeName, SafetensorsDtype>>> = { F32: 'F32', F16: 'F16', BF16: 'BF16' };
const BLOCK_ENCODINGS: Partial<Readonly<Record<GgmlTypeName, GgmlEncoding>>> = {
  Q8_0: 'q8_0',
  Q4_0: 'q4_0',
  Q4_K: 'q4_k',
  Q5_K: 'q5_k',
  Q6_K: 'q6_k',
  MXFP4: 'ggml_mxfp4',
};

/** Layer tensors every architecture names alike. */
const LAYER_TENSORS: Readonly<Record<string, string>> = {
  'attn_norm.weight': 'input_layernorm.weight',
  'attn_q.weight': 'self_attn.q_proj.weight',
  'attn_q.bias': 'self_attn.q_proj.bias',
  'attn_k.weight': 'self_attn.k_proj.weight',
  'attn_k.bias': 'self_attn.k_proj.bias',
  'attn_v.weight': 'self_attn.v_proj.weight',
  'attn_v.bias': 'self_attn.v_proj.bias',
  'attn_output.weight': 'self_attn.o_proj.weight',
  'attn_output.bias': 'self_attn.o_proj.bias',
  'attn_q_norm.weight': 'self_attn.q_norm.weight',
  'attn_k_norm.weight': 'self_attn.k_norm.weight',
  'ffn_norm.weight': 'post_attention_layernorm.weight',
  'ffn_gate.weight': 'mlp.gate_proj.weight',
  'ffn_up.weight': 'mlp.up_proj.weight',
  'ffn_down.weight': 'mlp.down_proj.weight',
};

/**
 * Where an architecture's names differ. `{e}` marks a stacked expert tensor [experts, rows, k]
 * read as one tensor per expert; gpt-oss's stacks keep their stacked names (its family reads
 * them whole, as it reads transformers' fused experts).
 */
const FAMILY_LAYER_TENSORS: Partial<Readonly<Record<Architecture, Readonly<Record<string, string>>>>> = {
  Qwen3MoeForCausalLM: {
    'ffn_gate_inp.weight': 'mlp.gate.weight',
    'ffn_gate_exps.weight': 'mlp.experts.{e}.gate_proj.weight',
    'ffn_up_exps.weight': 'mlp.experts.{e}.up_proj.weight',
    'ffn_down_exps.weight': 'mlp.experts.{e}.down_proj.weight',
  },
  MixtralForCausalLM: {
    'ffn_gate_inp.weight': 'block_sparse_moe.gate.weight',
    'ffn_gate_exps.weight': 'block_sparse_moe.experts.{e}.w1.weight',
    'ffn_up_exps.weight': 'block_sparse_moe.experts.{e}.w3.weight',
    'ffn_down_exps.weight': 'block_sparse_moe.experts.{e}.w2.weight',
  },
  Gemma3ForCausalLM: {
    'post_attention_norm.weight': 'post_attention_layernorm.weight',
    'ffn_norm.weight': 'pre_feedforward_layernorm.weight',
    'post_ffw_norm.weight': 'post_feedforward_layernorm.weight',
  },
  // Phi-3's fused projections keep their rows: q, k, v; gate, then up.
  Phi3ForCausalLM: {
    'attn_qkv.weight': 'self_attn.qkv_proj.weight',
    'ffn_up.weight': 'mlp.gate_up_proj.weight',
  },
  GptOssForCausalLM: {
    'post_attention_norm.weight': 'post_attention_layernorm.weight',
    'attn_sinks.weight': 'self_attn.sinks',
    'ffn_gate_inp.weight': 'mlp.router.weight',
    'ffn_gate_inp.bias': 'mlp.router.bias',
    'ffn_gate_exps.weight': 'mlp.experts.gate_proj.weight',
    'ffn_gate_exps.bias': 'mlp.experts.gate_proj.bias',
    'ffn_up_exps.weight': 'mlp.experts.up_proj.weight',
    'ffn_up_exps.bias': 'mlp.experts.up_proj.bias',
    'ffn_down_exps.weight': 'mlp.experts.down_proj.weight',
    'ffn_down_exps.bias': 'mlp.experts.down_proj.bias',
  },
};
const MODEL_TENSORS: Readonly<Record<string, string>> = {
  'token_embd.weight': 'model.embed_tokens.weight',
  'output_norm.weight': 'model.norm.weight',
  'output.weight': 'lm_head.weight',
};
const LAYER_NAME = /^blk\.(\d+)\.(.+)$/;
/** Architectures whose q and k rows llama.cpp's converter permutes (LlamaModel.permute). */
const ROTARY_PERMUTED: ReadonlySet<Architecture> = new Set(['LlamaForCausalLM', 'MixtralForCausalLM']);

/** The transformers class of a file's general.architecture. */
export function architectureOf(meta: GgufMetadata): Architecture {
  const arch = meta.string('general.architecture');
  const architecture = ARCHITECTURES[arch];
  if (architecture === undefined) meta.fail('general.architecture', `one of ${Object.keys(ARCHITECTURES).join(', ')}`);
  return architecture === 'LlamaForCausalLM' && meta.number('llama.expert_count', 0) > 0 ? 'MixtralForCausalLM' : architecture;
}

/**
 * The Hugging Face tensors a GGUF tensor holds: one, or one per expert of a stacked expert
 * tensor (byte ranges of its [rows, k] slices); none for a tensor the families do not read.
 */
export function huggingFaceTensors(architecture: Architecture, file: string, info: GgufTensorInfo): [string, CatalogueTensor][] {
  const layer = LAYER_NAME.exec(info.name);
  if (layer === null) {
    const name = MODEL_TENSORS[info.name];
    return name === undefined ? [] : [[name, catalogueTensor(file, info)]];
  }
  const suffix = FAMILY_LAYER_TENSORS[architecture]?.[layer[2]] ?? LAYER_TENSORS[layer[2]];
  if (suffix === undefined) return [];
  const name = `model.layers.${layer[1]}.${suffix}`;
  if (!name.includes('{e}')) return [[name, catalogueTensor(file, info)]];
  if (info.shape.length !== 3) throw new Error(`${file}: tensor "${info.name}" must be 3-D [experts, rows, k], got [${info.shape.join(', ')}]`);
  const [numExperts, ...shape] = info.shape;
  const expertBytes = (info.dataEnd - info.dataBegin) / numExperts;
  return Array.from({ length: numExperts }, (_, e) => {
    const dataBegin = info.dataBegin + e * expertBytes;
    return [name.replace('{e}', String(e)), catalogueTensor(file, { ...info, shape, dataBegin, dataEnd: dataBegin + expertBytes })];
  });
}

function catalogueTensor(file: string, info: GgufTensorInfo): CatalogueTensor {
  const range = { file, shape: info.shape, dataBegin: info.dataBegin, dataEnd: info.dataEnd };
  const plain = PLAIN_TYPES[info.type];
  if (plain !== undefined) return { ...range, dtype: plain };
  const encoding = BLOCK_ENCODINGS[info.type];
  if (encoding === undefined) throw new Error(`${file}: tensor "${info.name}" is ${info.type}, which Conduit does not load`);
  return { ...range, dtype: 'F32', encoding };
}

/**
 * The dtype the file's matrices imply: their float type, or bf16 for a quantized file. MXFP4 is
 * gpt-oss's expert format whatever the file's type (transformers' checkpoints ship it so too).
 */
function storedDtypeOf(infos: Iterable<GgufTensorInfo>): WeightDtype {
  const types = new Set<GgmlTypeName>();
  for (const info of infos) if (info.shape.length >= 2 && info.type !== 'MXFP4') types.add(info.type);
  if (types.has('F16') && !types.has('BF16')) return 'fp16';
  if (types.size === 1 && types.has('F32')) return 'fp32';
  return 'bf16';
}

function readFloats(file: string, info: GgufTensorInfo): Float32Array {
  const bytes = Buffer.alloc(info.dataEnd - info.dataBegin);
  const fd = openSync(file, 'r');
  try {
    readSync(fd, bytes, 0, bytes.length, info.dataBegin);
  } finally {
    closeSync(fd);
  }
  return new Float32Array(bytes.buffer, bytes.byteOffset, bytes.length / 4);
}

/** A small F32 vector of the file (rope factors), checked. */
function vectorOf(meta: GgufMetadata, name: string, length: number): Float32Array {
  const info = meta.header.tensors.get(name)!;
  if (info.type !== 'F32' || info.shape.length !== 1 || info.shape[0] !== length) {
    throw new Error(`${meta.header.file}: ${name} must be F32 [${length}], got ${info.type} [${info.shape.join(', ')}]`);
  }
  return readFloats(meta.header.file, info);
}

/** The config.json record transformers' config class would hold for this file. */
function configOf(meta: GgufMetadata, architecture: Architecture): Record<string, unknown> {
  const arch = meta.string('general.architecture');
  const key = (name: string) => `${arch}.${name}`;
  const tensors = meta.header.tensors;
  const embedding = tensors.get('token_embd.weight');
  if (embedding === undefined || embedding.shape.length !== 2) throw new Error(`${meta.header.file}: no 2-D tensor token_embd.weight`);
  const numHeads = meta.number(key('attention.head_count'));
  const hiddenSize = meta.number(key('embedding_length'));
  const numLayers = meta.number(key('block_count'));
  const config: Record<string, unknown> = {
    architectures: [architecture],
    hidden_size: hiddenSize,
    num_hidden_layers: numLayers,
    num_attention_heads: numHeads,
    num_key_value_heads: meta.number(key('attention.head_count_kv'), numHeads),
    max_position_embeddings: meta.number(key('context_length')),
    rms_norm_eps: meta.number(key('attention.layer_norm_rms_epsilon')),
    rope_theta: meta.number(key('rope.freq_base'), 10000),
    vocab_size: embedding.shape[0],
    tie_word_embeddings: !tensors.has('output.weight'),
  };
  if (meta.has(key('feed_forward_length'))) config.intermediate_size = meta.number(key('feed_forward_length'));
  if (meta.has(key('attention.key_length'))) config.head_dim = meta.number(key('attention.key_length'));
  const headDim = (config.head_dim as number | undefined) ?? hiddenSize / numHeads;
  const scaling = meta.string(key('rope.scaling.type'), 'none');
  if (scaling === 'linear' || scaling === 'yarn') {
    config.rope_scaling = {
      rope_type: scaling,
      factor: meta.number(key('rope.scaling.factor')),
      ...(scaling === 'yarn' ? { original_max_position_embeddings: meta.number(key('rope.scaling.original_context_length')) } : {}),
      // gpt-oss was trained with YaRN's unrounded correction range (its config.json's truncate: false).
      ...(scaling === 'yarn' && architecture === 'GptOssForCausalLM' ? { truncate: false } : {}),
    };
  } else if (scaling !== 'none') {
    meta.fail(key('rope.scaling.type'), 'none, linear or yarn');
  }
  const window = meta.number(key('attention.sliding_window'), 0);
  /** Layers of the file that hold a router: the sparse ones. */
  const sparseLayers = () => Array.from({ length: numLayers }, (_, i) => tensors.has(`blk.${i}.ffn_gate_inp.weight`));
  switch (architecture) {
    case 'Qwen3MoeForCausalLM': {
      const sparse = sparseLayers();
      config.moe_intermediate_size = meta.number(key('expert_feed_forward_length'));
      config.intermediate_size ??= config.moe_intermediate_size;
      config.num_experts = meta.number(key('expert_count'));
      config.num_experts_per_tok = meta.number(key('expert_used_count'));
      // llama.cpp's qwen3moe always renormalizes the kept experts' weights (every release sets it).
      config.norm_topk_prob = true;
      config.mlp_only_layers = sparse.flatMap((isSparse, i) => (isSparse ? [] : [i]));
      break;
    }
    case 'MixtralForCausalLM':
      config.num_local_experts = meta.number(key('expert_count'));
      config.num_experts_per_tok = meta.number(key('expert_used_count'));
      break;
    case 'Gemma3ForCausalLM': {
      // llama.cpp: no sliding_window, no local layers; every pattern-th layer global otherwise.
      const pattern = meta.number(key('attention.sliding_window_pattern'), 6);
      config.sliding_window = window > 0 ? window : 4096;
      config.layer_types = Array.from({ length: numLayers }, (_, i) => (window > 0 && (i + 1) % pattern !== 0 ? 'sliding_attention' : 'full_attention'));
      config.rope_local_base_freq = meta.number(key('rope.freq_base_swa'), 10000);
      // llama.cpp's gemma3: scores scaled by head_dim^-0.5, but by (hidden / heads)^-0.5 for the
      // 62-layer 27B, whose query_pre_attn_scalar is that.
      config.query_pre_attn_scalar = numLayers === 62 ? hiddenSize / numHeads : headDim;
      if (meta.has(key('final_logit_softcapping'))) config.final_logit_softcapping = meta.number(key('final_logit_softcapping'));
      config.hidden_activation = 'gelu_pytorch_tanh';
      break;
    }
    case 'Phi3ForCausalLM': {
      // Phi-3's rotated dims per head (Phi-4-mini rotates 3/4 of them).
      const rotaryDim = meta.number(key('rope.dimension_count'), headDim);
      config.partial_rotary_factor = rotaryDim / headDim;
      if (window > 0) config.sliding_window = window;
      if (tensors.has('rope_factors_long.weight')) {
        config.original_max_position_embeddings = meta.number(key('rope.scaling.original_context_length'));
        config.rope_scaling = {
          type: 'longrope',
          long_factor: Array.from(vectorOf(meta, 'rope_factors_long.weight', rotaryDim / 2)),
          short_factor: Array.from(vectorOf(meta, 'rope_factors_short.weight', rotaryDim / 2)),
        };
      }
      break;
    }
    case 'GptOssForCausalLM':
      config.num_local_experts = meta.number(key('expert_count'));
      config.num_experts_per_tok = meta.number(key('expert_used_count'));
      config.intermediate_size = meta.number(key('expert_feed_forward_length'));
      config.sliding_window = window;
      // llama.cpp's gpt-oss: every second layer (the even ones) slides.
      config.layer_types = Array.from({ length: numLayers }, (_, i) => (i % 2 === 0 ? 'sliding_attention' : 'full_attention'));
      break;
    default:
      break;
  }
  if (architecture !== 'Gemma3ForCausalLM') config.hidden_act = 'silu';
  return config;
}

export function readGgufCheckpoint(file: string, options: CheckpointOptions = {}): Checkpoint {
  const header = readGgufHeader(file);
  const meta = new GgufMetadata(header);
  const architecture = architectureOf(meta);
  const config = new ConfigReader(`${file} (GGUF metadata)`, configOf(meta, architecture));
  const numHeads = config.positiveInt('num_attention_heads');
  const headDim = config.positiveInt('head_dim', config.positiveInt('hidden_size') / numHeads);
  const tensors = new Map<string, CatalogueTensor>();
  for (const info of header.tensors.values()) {
    for (const [name, tensor] of huggingFaceTensors(architecture, file, info)) {
      // llama.cpp's Llama converter permutes q and k (and their biases) per head; the others use
      // NEOX rotation and keep Hugging Face's order.
      if (ROTARY_PERMUTED.has(architecture) && /self_attn\.[qk]_proj\./.test(name)) tensor.rotaryPermutedHeadDim = headDim;
      tensors.set(name, tensor);
    }
  }
  const checkpoint = assembleCheckpoint(architecture, config, new TensorCatalogue(tensors, file), options, () => storedDtypeOf(header.tensors.values()));
  if (architecture === 'Gemma3ForCausalLM') {
    // convert_hf_to_gguf stores Gemma's norms as 1 + w, summed in fp32: what transformers multiplies by.
    checkpoint.spec.normAddsOne = false;
    checkpoint.spec.normsInFp32 = true;
  }
  // Llama 3's rope scaling arrives as per-frequency divisors (convert_hf_to_gguf's rope_freqs).
  if (header.tensors.has('rope_freqs.weight')) {
    const factors = vectorOf(meta, 'rope_freqs.weight', headDim / 2);
    for (const rope of checkpoint.spec.ropes) rope.invFreq.forEach((freq, i) => (rope.invFreq[i] = freq / factors[i]));
  }
  return checkpoint;
}

