// A Hugging Face LlamaForCausalLM checkpoint (safetensors) with a byte-level BPE tokenizer
// (tokenizer.json) as GGUF, laid out as llama.cpp's convert_hf_to_gguf.py lays one out, so that
// llama-server runs the very checkpoint Conduit serves (bench:latency). Matrices keep their
// dtype; 1-D tensors (the norms) become F32; the q and k projections are permuted from Hugging
// Face's rotate-half rotary layout to ggml's, whose rotated pairs are adjacent.
//
//   node --import tsx tools/llama-gguf.ts MODEL_DIR OUT.gguf
import { closeSync, openSync, readFileSync, readSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { f16BitsToNumber, readCheckpointTensors, type CheckpointTensor } from '../native/safetensors.ts';
import { writeGguf, type GgmlTypeName, type GgufTensor, type GgufValue } from './gguf-writer.ts';

interface LlamaConfig {
  architectures?: string[];
  hidden_size: number;
  num_hidden_layers: number;
  num_attention_heads: number;
  num_key_value_heads?: number;
  intermediate_size: number;
  max_position_embeddings: number;
  rms_norm_eps: number;
  rope_theta?: number;
  rope_scaling?: unknown;
  vocab_size: number;
  tie_word_embeddings?: boolean;
  bos_token_id?: number;
  eos_token_id?: number | number[];
}

interface TokenizerJson {
  model: { type: string; vocab: Record<string, number>; merges: (string | [string, string])[] };
  pre_tokenizer?: { type: string } | null;
  added_tokens?: { id: number; content: string; special: boolean }[];
}

/** llama_token_type */
const TokenType = { normal: 1, control: 3, userDefined: 4, unused: 5 } as const;
/** llama_ftype of the file's matrices. */
const FILE_TYPE: Readonly<Record<GgmlTypeName, number>> = { F32: 0, F16: 1, BF16: 32 };
const SAFETENSORS_TO_GGML: Readonly<Record<string, GgmlTypeName>> = { F32: 'F32', F16: 'F16', BF16: 'BF16' };

function readBytes(tensor: CheckpointTensor): Uint8Array {
  const bytes = new Uint8Array(tensor.dataEnd - tensor.dataBegin);
  const fd = openSync(tensor.file, 'r');
  try {
    for (let read = 0; read < bytes.length; ) {
      const count = readSync(fd, bytes, read, bytes.length - read, tensor.dataBegin + read);
      if (count === 0) throw new Error(`${tensor.file}: ends inside a tensor`);
      read += count;
    }
  } finally {
    closeSync(fd);
  }
  return bytes;
}

/** A 1-D tensor as F32 (ggml's norms are F32 whatever the checkpoint's dtype). */
function toF32(tensor: CheckpointTensor): Uint8Array {
  const bytes = readBytes(tensor);
  if (tensor.dtype === 'F32') return bytes;
  const halves = new Uint16Array(bytes.buffer, bytes.byteOffset, bytes.length / 2);
  const out = new Float32Array(halves.length);
  if (tensor.dtype === 'BF16') {
    new Uint32Array(out.buffer).set(Array.from(halves, (bits) => bits << 16));
    return new Uint8Array(out.buffer);
  }
  for (let i = 0; i < halves.length; i++) out[i] = f16BitsToNumber(halves[i]);
  return new Uint8Array(out.buffer);
}

/**
 * Rows of a q or k projection, head by head, from rotate-half order (dimension i pairs with
 * i + headDim / 2) to adjacent pairs (2i with 2i + 1): output row 2i + j is input row j·half + i.
 */
function permuteRotaryRows(bytes: Uint8Array, numHeads: number, numRows: number): Uint8Array {
  const rowBytes = bytes.length / numRows;
  const headDim = numRows / numHeads;
  const half = headDim / 2;
  const out = new Uint8Array(bytes.length);
  for (let head = 0; head < numHeads; head++) {
    for (let i = 0; i < half; i++) {
      for (let j = 0; j < 2; j++) {
        const from = (head * headDim + j * half + i) * rowBytes;
        out.set(bytes.subarray(from, from + rowBytes), (head * headDim + 2 * i + j) * rowBytes);
      }
    }
  }
  return out;
}

function tokenizerMetadata(modelDir: string, vocabSize: number, config: LlamaConfig): [string, GgufValue][] {
  const tokenizer = JSON.parse(readFileSync(path.join(modelDir, 'tokenizer.json'), 'utf8')) as TokenizerJson;
  if (tokenizer.model.type !== 'BPE' || tokenizer.pre_tokenizer?.type !== 'ByteLevel') {
    throw new Error(`${modelDir}/tokenizer.json: only byte-level BPE tokenizers (GPT-2's kind) are converted, not ${tokenizer.model.type} with ${tokenizer.pre_tokenizer?.type ?? 'no'} pre-tokenizer`);
  }
  const tokens = new Array<string>(vocabSize);
  const types = new Array<number>(vocabSize).fill(TokenType.unused);
  for (const [token, id] of Object.entries(tokenizer.model.vocab)) {
    if (id < vocabSize) {
      tokens[id] = token;
      types[id] = TokenType.normal;
    }
  }
  for (const added of tokenizer.added_tokens ?? []) {
    if (added.id >= vocabSize) continue;
    tokens[added.id] = added.content;
    types[added.id] = added.special ? TokenType.control : TokenType.userDefined;
  }
  // The embedding has rows the tokenizer never produces: named as convert_hf_to_gguf names them.
  for (let id = 0; id < vocabSize; id++) tokens[id] ??= `[PAD${id}]`;
  const merges = tokenizer.model.merges.map((merge) => (typeof merge === 'string' ? merge : merge.join(' ')));
  const tokenizerConfigFile = path.join(modelDir, 'tokenizer_config.json');
  const tokenizerConfig = JSON.parse(readFileSync(tokenizerConfigFile, 'utf8')) as { bos_token?: string | null; eos_token?: string | null; add_bos_token?: boolean };
  const idOf = (token: string | null | undefined, fallback: number | number[] | undefined): number | undefined => {
    const id = token == null ? -1 : tokens.indexOf(token);
    return id >= 0 ? id : Array.isArray(fallback) ? fallback[0] : fallback;
  };
  const metadata: [string, GgufValue][] = [
    ['tokenizer.ggml.model', { type: 'string', value: 'gpt2' }],
    ['tokenizer.ggml.pre', { type: 'string', value: 'gpt-2' }],
    ['tokenizer.ggml.tokens', { type: 'string[]', value: tokens }],
    ['tokenizer.ggml.token_type', { type: 'int32[]', value: types }],
    ['tokenizer.ggml.merges', { type: 'string[]', value: merges }],
  ];
  const bosId = idOf(tokenizerConfig.bos_token, config.bos_token_id);
  const eosId = idOf(tokenizerConfig.eos_token, config.eos_token_id);
  if (bosId !== undefined) metadata.push(['tokenizer.ggml.bos_token_id', { type: 'uint32', value: bosId }]);
  if (eosId !== undefined) metadata.push(['tokenizer.ggml.eos_token_id', { type: 'uint32', value: eosId }]);
  metadata.push(['tokenizer.ggml.add_bos_token', { type: 'bool', value: tokenizerConfig.add_bos_token ?? false }]);
  return metadata;
}

/** Writes modelDir's checkpoint and tokenizer to outFile as a llama.cpp GGUF. */
export function writeLlamaGguf(modelDir: string, outFile: string): void {
  const config = JSON.parse(readFileSync(path.join(modelDir, 'config.json'), 'utf8')) as LlamaConfig;
  const architecture = config.architectures?.[0];
  if (architecture !== 'LlamaForCausalLM' || config.rope_scaling != null) {
    throw new Error(`${modelDir}: only LlamaForCausalLM without rope_scaling is converted, not ${architecture}`);
  }
  const { tensors } = readCheckpointTensors(modelDir);
  const source = (name: string): CheckpointTensor => {
    const tensor = tensors.get(name);
    if (tensor === undefined) throw new Error(`${modelDir}: the checkpoint has no tensor ${name}`);
    return tensor;
  };
  const numHeads = config.num_attention_heads;
  const numKvHeads = config.num_key_value_heads ?? numHeads;
  const matrixType = SAFETENSORS_TO_GGML[source('model.embed_tokens.weight').dtype];
  if (matrixType === undefined) throw new Error(`${modelDir}: weights of ${source('model.embed_tokens.weight').dtype} are not converted`);

  const out: GgufTensor[] = [];
  const matrix = (ggufName: string, hfName: string, permuteHeads = 0) => {
    const tensor = source(hfName);
    const type = SAFETENSORS_TO_GGML[tensor.dtype];
    if (type === undefined) throw new Error(`${hfName}: ${tensor.dtype} is not converted`);
    out.push({
      name: ggufName,
      shape: tensor.shape,
      type,
      data: () => (permuteHeads > 0 ? permuteRotaryRows(readBytes(tensor), permuteHeads, tensor.shape[0]) : readBytes(tensor)),
    });
  };
  const norm = (ggufName: string, hfName: string) => {
    const tensor = source(hfName);
    out.push({ name: ggufName, shape: tensor.shape, type: 'F32', data: () => toF32(tensor) });
  };
  matrix('token_embd.weight', 'model.embed_tokens.weight');
  for (let layer = 0; layer < config.num_hidden_layers; layer++) {
    const hf = `model.layers.${layer}.`;
    const gguf = `blk.${layer}.`;
    norm(`${gguf}attn_norm.weight`, `${hf}input_layernorm.weight`);
    matrix(`${gguf}attn_q.weight`, `${hf}self_attn.q_proj.weight`, numHeads);
    matrix(`${gguf}attn_k.weight`, `${hf}self_attn.k_proj.weight`, numKvHeads);
    matrix(`${gguf}attn_v.weight`, `${hf}self_attn.v_proj.weight`);
    matrix(`${gguf}attn_output.weight`, `${hf}self_attn.o_proj.weight`);
    norm(`${gguf}ffn_norm.weight`, `${hf}post_attention_layernorm.weight`);
    matrix(`${gguf}ffn_gate.weight`, `${hf}mlp.gate_proj.weight`);
    matrix(`${gguf}ffn_up.weight`, `${hf}mlp.up_proj.weight`);
    matrix(`${gguf}ffn_down.weight`, `${hf}mlp.down_proj.weight`);
  }
  norm('output_norm.weight', 'model.norm.weight');
  if (!config.tie_word_embeddings) matrix('output.weight', 'lm_head.weight');

  const metadata: [string, GgufValue][] = [
    ['general.architecture', { type: 'string', value: 'llama' }],
    ['general.name', { type: 'string', value: path.basename(path.resolve(modelDir)) }],
    ['general.file_type', { type: 'uint32', value: FILE_TYPE[matrixType] }],
    ['llama.context_length', { type: 'uint32', value: config.max_position_embeddings }],
    ['llama.embedding_length', { type: 'uint32', value: config.hidden_size }],
    ['llama.block_count', { type: 'uint32', value: config.num_hidden_layers }],
    ['llama.feed_forward_length', { type: 'uint32', value: config.intermediate_size }],
    ['llama.attention.head_count', { type: 'uint32', value: numHeads }],
    ['llama.attention.head_count_kv', { type: 'uint32', value: numKvHeads }],
    ['llama.rope.dimension_count', { type: 'uint32', value: config.hidden_size / numHeads }],
    ['llama.rope.freq_base', { type: 'float32', value: config.rope_theta ?? 10000 }],
    ['llama.attention.layer_norm_rms_epsilon', { type: 'float32', value: config.rms_norm_eps }],
    ['llama.vocab_size', { type: 'uint32', value: config.vocab_size }],
    ...tokenizerMetadata(modelDir, config.vocab_size, config),
  ];
  writeGguf(outFile, metadata, out);
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const [modelDir, outFile] = process.argv.slice(2);
  if (modelDir === undefined || outFile === undefined) {
    console.error('usage: node --import tsx tools/llama-gguf.ts MODEL_DIR OUT.gguf');
    process.exit(2);
  }
  writeLlamaGguf(modelDir, outFile);
}
