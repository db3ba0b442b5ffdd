// A GGUF file as a checkpoint: its metadata read into the config.json fields transformers would
// have written, its tensors renamed from llama.cpp's names (llama-arch.cpp) to Hugging Face's,
// so the family modules load it as they load safetensors. Matrices in ggml block types carry
// their encoding; Llama's q and k rows, which llama.cpp's converter permutes into adjacent
// rotary pairs, are read back in rotate-half order. The file is mapped by the runtime, not read.
import { closeSync, openSync, readSync } from 'node:fs';
import type { Architecture, WeightDtype } from './api.ts';
import type { Checkpoint, CheckpointOptions } from './checkpoint.ts';
import { assembleCheckpoint } from './checkpoint.ts';
import { ConfigReader, TensorCatalogue, type CatalogueTensor, type GgmlEncoding } from './checkpoint-reader.ts';
import { GgufMetadata, readGgufHeader, type GgmlTypeName, type GgufTensorInfo } from '../gguf.ts';
import type { SafetensorsDtype } from './safetensors.ts';

/** general.architecture → transformers' class; each reads the same hyperparameter keys. */
const ARCHITECTURES: Readonly<Record<string, Architecture>> = {
  llama: 'LlamaForCausalLM',
  qwen2: 'Qwen2ForCausalLM',
  qwen3: 'Qwen3ForCausalLM',
};

const PLAIN_TYPES: Partial<Readonly<Record<GgmlTypeName, SafetensorsDtype>>> = { F32: 'F32', F16: 'F16', BF16: 'BF16' };
const BLOCK_ENCODINGS: Partial<Readonly<Record<GgmlTypeName, GgmlEncoding>>> = {
  Q8_0: 'q8_0',
  Q4_0: 'q4_0',
  Q4_K: 'q4_k',
  Q5_K: 'q5_k',
  Q6_K: 'q6_k',
};

const LAYER_TENSORS: Readonly<Record<string, string>> = {
  'attn_norm.weight': 'input_layernorm.weight',
  'attn_q.weight': 'self_attn.q_proj.weight',
  'attn_q.bias': 'self_attn.q_proj.bias',
  'attn_k.weight': 'self_attn.k_proj.weight',
  'attn_k.bias': 'self_attn.k_proj.bias',
  'attn_v.weight': 'self_attn.v_proj.weight',
  'attn_v.bias': 'self_attn.v_proj.bias',
  'attn_output.weight': 'self_attn.o_proj.weight',
  'attn_q_norm.weight': 'self_attn.q_norm.weight',
  'attn_k_norm.weight': 'self_attn.k_norm.weight',
  'ffn_norm.weight': 'post_attention_layernorm.weight',
  'ffn_gate.weight': 'mlp.gate_proj.weight',
  'ffn_up.weight': 'mlp.up_proj.weight',
  'ffn_down.weight': 'mlp.down_proj.weight',
};
const MODEL_TENSORS: Readonly<Record<string, string>> = {
  'token_embd.weight': 'model.embed_tokens.weight',
  'output_norm.weight': 'model.norm.weight',
  'output.weight': 'lm_head.weight',
};
const LAYER_NAME = /^blk\.(\d+)\.(.+)$/;

/** A tensor's Hugging Face name, or undefined for one the families do not read. */
export function huggingFaceName(name: string): string | undefined {
  const layer = LAYER_NAME.exec(name);
  if (layer === null) return MODEL_TENSORS[name];
  const suffix = LAYER_TENSORS[layer[2]];
  return suffix === undefined ? undefined : `model.layers.${layer[1]}.${suffix}`;
}

function catalogueTensor(file: string, info: GgufTensorInfo): CatalogueTensor {
  const range = { file, shape: info.shape, dataBegin: info.dataBegin, dataEnd: info.dataEnd };
  const plain = PLAIN_TYPES[info.type];
  if (plain !== undefined) return { ...range, dtype: plain };
  return { ...range, dtype: 'F32', encoding: BLOCK_ENCODINGS[info.type]! };
}

/** The dtype the file's matrices imply: their float type, or bf16 for a quantized file. */
function storedDtypeOf(infos: Iterable<GgufTensorInfo>): WeightDtype {
  const types = new Set<GgmlTypeName>();
  for (const info of infos) if (info.shape.length === 2) types.add(info.type);
  if (types.has('F16') && !types.has('BF16')) return 'fp16';
  if (types.size === 1 && types.has('F32')) return 'fp32';
  return 'bf16';
}

/** The config.json record transformers' config class would hold for this file. */
function configOf(meta: GgufMetadata, arch: string, architecture: Architecture, tensors: Map<string, GgufTensorInfo>): Record<string, unknown> {
  const key = (name: string) => `${arch}.${name}`;
  const embedding = tensors.get('token_embd.weight');
  if (embedding === undefined || embedding.shape.length !== 2) throw new Error(`${meta.header.file}: no 2-D tensor token_embd.weight`);
  const numHeads = meta.number(key('attention.head_count'));
  const hiddenSize = meta.number(key('embedding_length'));
  const config: Record<string, unknown> = {
    architectures: [architecture],
    hidden_size: hiddenSize,
    num_hidden_layers: meta.number(key('block_count')),
    num_attention_heads: numHeads,
    num_key_value_heads: meta.number(key('attention.head_count_kv'), numHeads),
    intermediate_size: meta.number(key('feed_forward_length')),
    max_position_embeddings: meta.number(key('context_length')),
    rms_norm_eps: meta.number(key('attention.layer_norm_rms_epsilon')),
    rope_theta: meta.number(key('rope.freq_base'), 10000),
    vocab_size: embedding.shape[0],
    tie_word_embeddings: !tensors.has('output.weight'),
    hidden_act: 'silu',
  };
  if (meta.has(key('attention.key_length'))) config.head_dim = meta.number(key('attention.key_length'));
  const scaling = meta.string(key('rope.scaling.type'), 'none');
  if (scaling === 'linear' || scaling === 'yarn') {
    config.rope_scaling = {
      rope_type: scaling,
      factor: meta.number(key('rope.scaling.factor')),
      ...(scaling === 'yarn' ? { original_max_position_embeddings: meta.number(key('rope.scaling.original_context_length')) } : {}),
    };
  } else if (scaling !== 'none') {
    meta.fail(key('rope.scaling.type'), 'none, linear or yarn');
  }
  return config;
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

export function readGgufCheckpoint(file: string, options: CheckpointOptions = {}): Checkpoint {
  const header = readGgufHeader(file);
  const meta = new GgufMetadata(header);
  const arch = meta.string('general.architecture');
  const architecture = ARCHITECTURES[arch];
  if (architecture === undefined) meta.fail('general.architecture', `one of ${Object.keys(ARCHITECTURES).join(', ')}`);
  const config = new ConfigReader(`${file} (GGUF metadata)`, configOf(meta, arch, architecture, header.tensors));
  const numHeads = config.positiveInt('num_attention_heads');
  const headDim = config.positiveInt('head_dim', config.positiveInt('hidden_size') / numHeads);
  const tensors = new Map<string, CatalogueTensor>();
  for (const info of header.tensors.values()) {
    const name = huggingFaceName(info.name);
    if (name === undefined) continue;
    const tensor = catalogueTensor(file, info);
    // llama.cpp's Llama converter permutes q and k (and their biases) per head; Qwen's use NEOX
    // rotation and keep Hugging Face's order.
    if (arch === 'llama' && /self_attn\.[qk]_proj\./.test(name)) tensor.rotaryPermutedHeadDim = headDim;
    tensors.set(name, tensor);
  }
  const checkpoint = assembleCheckpoint(architecture, config, new TensorCatalogue(tensors, file), options, () => storedDtypeOf(header.tensors.values()));
  // Llama 3's rope scaling arrives as per-frequency divisors (convert_hf_to_gguf's rope_freqs).
  const ropeFreqs = header.tensors.get('rope_freqs.weight');
  if (ropeFreqs !== undefined) {
    if (ropeFreqs.type !== 'F32' || ropeFreqs.shape.length !== 1 || ropeFreqs.shape[0] !== headDim / 2) {
      throw new Error(`${file}: rope_freqs.weight must be F32 [${headDim / 2}], got ${ropeFreqs.type} [${ropeFreqs.shape.join(', ')}]`);
    }
    const factors = readFloats(file, ropeFreqs);
    for (const rope of checkpoint.spec.ropes) rope.invFreq.forEach((freq, i) => (rope.invFreq[i] = freq / factors[i]));
  }
  return checkpoint;
}
