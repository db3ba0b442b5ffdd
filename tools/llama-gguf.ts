// A Hugging Face LlamaForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM checkpoint
// (safetensors) with a byte-level BPE tokenizer (tokenizer.json) as GGUF, laid out as llama.cpp's
// convert_hf_to_gguf.py lays one out, so that llama.cpp runs the very checkpoint Conduit serves
// (bench:latency, bench:native). Matrices keep their dtype, or become the ggml type asked for
// (F32, F16, BF16, or blocks quantized by tools/ggml-quantize.ts); 1-D tensors (norms, biases)
// become F32; Llama's q and k projections are permuted from Hugging Face's rotate-half rotary
// layout to ggml's, whose rotated pairs are adjacent (Qwen's rotate halves in llama.cpp too).
//
//   node --import tsx tools/llama-gguf.ts MODEL_DIR OUT.gguf [TYPE]
import { closeSync, existsSync, openSync, readFileSync, readSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { f16BitsToNumber, readCheckpointTensors, type CheckpointTensor } from '../native/safetensors.ts';
import { GGML_TYPES } from '../gguf.ts';
import { quantizeRows, type BlockTypeName } from './ggml-quantize.ts';
import { roundF32BitsToBf16Bits, roundF32BitsToF16Bits } from './safetensors-writer.ts';
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
  head_dim?: number;
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
const FILE_TYPE: Readonly<Record<GgmlTypeName, number>> = { F32: 0, F16: 1, Q4_0: 2, Q8_0: 7, Q4_K: 15, Q5_K: 17, Q6_K: 18, BF16: 32 };
/** transformers' class → general.architecture. */
const GGUF_ARCHITECTURES: Readonly<Record<string, string>> = { LlamaForCausalLM: 'llama', Qwen2ForCausalLM: 'qwen2', Qwen3ForCausalLM: 'qwen3' };
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

/** A tensor's values as fp32 (exact from F32, BF16 and F16). */
function valuesOf(bytes: Uint8Array, dtype: string): Float32Array {
  if (dtype === 'F32') return new Float32Array(bytes.buffer, bytes.byteOffset, bytes.length / 4);
  const halves = new Uint16Array(bytes.buffer, bytes.byteOffset, bytes.length / 2);
  const out = new Float32Array(halves.length);
  if (dtype === 'BF16') {
    new Uint32Array(out.buffer).set(Array.from(halves, (bits) => bits << 16));
    return out;
  }
  for (let i = 0; i < halves.length; i++) out[i] = f16BitsToNumber(halves[i]);
  return out;
}

/** A 1-D tensor as F32 (ggml's norms are F32 whatever the checkpoint's dtype). */
function toF32(tensor: CheckpointTensor): Uint8Array {
  const bytes = readBytes(tensor);
  if (tensor.dtype === 'F32') return bytes;
  return new Uint8Array(valuesOf(bytes, tensor.dtype).buffer);
}

/** A matrix's bytes (stored as dtype) as type: the bytes themselves, rounded floats, or blocks. */
function convertMatrix(bytes: Uint8Array, dtype: string, type: GgmlTypeName): Uint8Array {
  if (SAFETENSORS_TO_GGML[dtype] === type) return bytes;
  const values = valuesOf(bytes, dtype);
  if (type === 'F32') return new Uint8Array(values.buffer.slice(values.byteOffset, values.byteOffset + values.byteLength));
  if (type === 'F16' || type === 'BF16') {
    const bits = new Uint32Array(values.buffer, values.byteOffset, values.length);
    const round = type === 'F16' ? roundF32BitsToF16Bits : roundF32BitsToBf16Bits;
    return new Uint8Array(Uint16Array.from(bits, round).buffer);
  }
  return quantizeRows(values, type as BlockTypeName);
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
  const tokenizerConfig = JSON.parse(readFileSync(tokenizerConfigFile, 'utf8')) as {
    bos_token?: string | null;
    eos_token?: string | null;
    add_bos_token?: boolean;
    chat_template?: unknown;
  };
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
  if (typeof tokenizerConfig.chat_template === 'string') metadata.push(['tokenizer.chat_template', { type: 'string', value: tokenizerConfig.chat_template }]);
  return metadata;
}

export interface GgufWriteOptions {
  /** The ggml type of every matrix (embedding and LM head included); absent: the stored dtype. */
  matrixType?: GgmlTypeName;
}

/** Writes modelDir's checkpoint and tokenizer to outFile as a llama.cpp GGUF. */
export function writeLlamaGguf(modelDir: string, outFile: string, options: GgufWriteOptions = {}): void {
  const config = JSON.parse(readFileSync(path.join(modelDir, 'config.json'), 'utf8')) as LlamaConfig;
  const architecture = config.architectures?.[0];
  const arch = architecture === undefined ? undefined : GGUF_ARCHITECTURES[architecture];
  if (arch === undefined || config.rope_scaling != null) {
    throw new Error(`${modelDir}: only ${Object.keys(GGUF_ARCHITECTURES).join(', ')} without rope_scaling are converted, not ${architecture}`);
  }
  const { tensors } = readCheckpointTensors(modelDir);
  const source = (name: string): CheckpointTensor => {
    const tensor = tensors.get(name);
    if (tensor === undefined) throw new Error(`${modelDir}: the checkpoint has no tensor ${name}`);
    return tensor;
  };
  const numHeads = config.num_attention_heads;
  const numKvHeads = config.num_key_value_heads ?? numHeads;
  const headDim = config.head_dim ?? config.hidden_size / numHeads;
  const matrixType = options.matrixType ?? SAFETENSORS_TO_GGML[source('model.embed_tokens.weight').dtype];
  if (matrixType === undefined) throw new Error(`${modelDir}: weights of ${source('model.embed_tokens.weight').dtype} are not converted`);

  const out: GgufTensor[] = [];
  const matrix = (ggufName: string, hfName: string, permuteHeads = 0) => {
    const tensor = source(hfName);
    const type = options.matrixType ?? SAFETENSORS_TO_GGML[tensor.dtype];
    if (type === undefined || SAFETENSORS_TO_GGML[tensor.dtype] === undefined) throw new Error(`${hfName}: ${tensor.dtype} is not converted`);
    if (tensor.shape[1] % GGML_TYPES[type].blockElements !== 0) {
      throw new Error(`${hfName}: rows of ${tensor.shape[1]} are not whole ${type} blocks of ${GGML_TYPES[type].blockElements}`);
    }
    out.push({
      name: ggufName,
      shape: tensor.shape,
      type,
      data: () => {
        const bytes = readBytes(tensor);
        return convertMatrix(permuteHeads > 0 && arch === 'llama' ? permuteRotaryRows(bytes, permuteHeads, tensor.shape[0]) : bytes, tensor.dtype, type);
      },
    });
  };
  const optionalNorm = (ggufName: string, hfName: string) => {
    if (tensors.has(hfName)) norm(ggufName, hfName);
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
    for (const proj of ['q', 'k', 'v'] as const) optionalNorm(`${gguf}attn_${proj}.bias`, `${hf}self_attn.${proj}_proj.bias`);
    optionalNorm(`${gguf}attn_q_norm.weight`, `${hf}self_attn.q_norm.weight`);
    optionalNorm(`${gguf}attn_k_norm.weight`, `${hf}self_attn.k_norm.weight`);
    norm(`${gguf}ffn_norm.weight`, `${hf}post_attention_layernorm.weight`);
    matrix(`${gguf}ffn_gate.weight`, `${hf}mlp.gate_proj.weight`);
    matrix(`${gguf}ffn_up.weight`, `${hf}mlp.up_proj.weight`);
    matrix(`${gguf}ffn_down.weight`, `${hf}mlp.down_proj.weight`);
  }
  norm('output_norm.weight', 'model.norm.weight');
  if (!config.tie_word_embeddings) matrix('output.weight', 'lm_head.weight');

  const metadata: [string, GgufValue][] = [
    ['general.architecture', { type: 'string', value: arch }],
    ['general.name', { type: 'string', value: path.basename(path.resolve(modelDir)) }],
    ['general.file_type', { type: 'uint32', value: FILE_TYPE[matrixType] }],
    [`${arch}.context_length`, { type: 'uint32', value: config.max_position_embeddings }],
    [`${arch}.embedding_length`, { type: 'uint32', value: config.hidden_size }],
    [`${arch}.block_count`, { type: 'uint32', value: config.num_hidden_layers }],
    [`${arch}.feed_forward_length`, { type: 'uint32', value: config.intermediate_size }],
    [`${arch}.attention.head_count`, { type: 'uint32', value: numHeads }],
    [`${arch}.attention.head_count_kv`, { type: 'uint32', value: numKvHeads }],
    [`${arch}.rope.dimension_count`, { type: 'uint32', value: headDim }],
    [`${arch}.attention.key_length`, { type: 'uint32', value: headDim }],
    [`${arch}.attention.value_length`, { type: 'uint32', value: headDim }],
    [`${arch}.rope.freq_base`, { type: 'float32', value: config.rope_theta ?? 10000 }],
    [`${arch}.attention.layer_norm_rms_epsilon`, { type: 'float32', value: config.rms_norm_eps }],
    [`${arch}.vocab_size`, { type: 'uint32', value: config.vocab_size }],
    // A checkpoint without tokenizer.json (the runtime's random test models) gets no tokenizer.
    ...(existsSync(path.join(modelDir, 'tokenizer.json')) ? tokenizerMetadata(modelDir, config.vocab_size, config) : []),
  ];
  writeGguf(outFile, metadata, out);
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const [modelDir, outFile, matrixType] = process.argv.slice(2);
  if (modelDir === undefined || outFile === undefined || (matrixType !== undefined && !(matrixType in GGML_TYPES))) {
    console.error(`usage: node --import tsx tools/llama-gguf.ts MODEL_DIR OUT.gguf [${Object.keys(GGML_TYPES).join('|')}]`);
    process.exit(2);
  }
  writeLlamaGguf(modelDir, outFile, { matrixType: matrixType as GgmlTypeName | undefined });
}
