// A Hugging Face checkpoint (safetensors) of any family Conduit loads (Llama, Qwen2, Qwen3,
// Qwen3-MoE, Mixtral, Gemma 3, Phi-3, gpt-oss), with a byte-level BPE tokenizer (tokenizer.json)
// when it has one, as GGUF, laid out as llama.cpp's convert_hf_to_gguf.py lays one out, so that
// llama.cpp runs the very checkpoint Conduit serves (bench:latency, bench:native) and Conduit's
// GGUF loader is tested on the files users have. Matrices keep their dtype, or become the ggml
// type asked for (F32, F16, BF16, or blocks quantized by tools/ggml-quantize.ts); 1-D tensors
// (norms, biases, sinks) and routers become F32. The converter's transforms, each as it applies
// them: Llama's and Mixtral's q and k projections permuted from Hugging Face's rotate-half rotary
// layout to ggml's adjacent pairs (the others rotate halves in llama.cpp too); experts stacked
// into [experts, rows, k] tensors; Gemma 3's norms stored as 1 + w (summed in fp32); gpt-oss's
// fused, interleaved gate_up_proj ([experts, in, 2 * out]) split into gate and up stacks of
// [experts, out, in]; Phi-3's fused qkv_proj and gate_up_proj kept fused (attn_qkv, ffn_up).
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
  // Families past Llama's (config.json as tools/checkpoint-families.ts writes it).
  num_experts?: number;
  num_local_experts?: number;
  num_experts_per_tok?: number;
  moe_intermediate_size?: number;
  norm_topk_prob?: boolean;
  sliding_window?: number | null;
  use_sliding_window?: boolean;
  sliding_window_pattern?: number;
  layer_types?: string[];
  query_pre_attn_scalar?: number;
  attn_logit_softcapping?: number | null;
  final_logit_softcapping?: number | null;
  rope_local_base_freq?: number;
  partial_rotary_factor?: number;
  original_max_position_embeddings?: number;
  quantization_config?: unknown;
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
const FILE_TYPE: Readonly<Record<GgmlTypeName, number>> = { F32: 0, F16: 1, Q4_0: 2, Q8_0: 7, Q4_K: 15, Q5_K: 17, Q6_K: 18, BF16: 32, MXFP4: 38 };
/** transformers' class → general.architecture. */
const GGUF_ARCHITECTURES: Readonly<Record<string, string>> = {
  LlamaForCausalLM: 'llama',
  Qwen2ForCausalLM: 'qwen2',
  Qwen3ForCausalLM: 'qwen3',
  Qwen3MoeForCausalLM: 'qwen3moe',
  MixtralForCausalLM: 'llama',
  Gemma3ForCausalLM: 'gemma3',
  Phi3ForCausalLM: 'phi3',
  GptOssForCausalLM: 'gpt-oss',
};
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
  /** Types for the matrices whose GGUF name ends with a key ('ffn_up_exps.weight'), over matrixType: a mixed quantization. */
  typesBySuffix?: Readonly<Record<string, GgmlTypeName>>;
}

/** A float tensor's values in fp32 and its dtype (what the ggml type conversion starts from). */
interface Values {
  values: Float32Array;
  dtype: string;
}

/** [experts, rows, k] from [experts, k, rows] (transformers' gpt-oss experts keep [in, out]), rows parity, parity + step, .... */
function transposedExperts(values: Float32Array, numExperts: number, k: number, rows: number, parity: number, step: number): Float32Array {
  const outRows = rows / step;
  const out = new Float32Array(numExperts * outRows * k);
  for (let e = 0; e < numExperts; e++) {
    for (let r = 0; r < outRows; r++) {
      for (let i = 0; i < k; i++) out[(e * outRows + r) * k + i] = values[(e * k + i) * rows + r * step + parity];
    }
  }
  return out;
}

/** Writes modelDir's checkpoint and tokenizer to outFile as a llama.cpp GGUF. */
export function writeLlamaGguf(modelDir: string, outFile: string, options: GgufWriteOptions = {}): void {
  const config = JSON.parse(readFileSync(path.join(modelDir, 'config.json'), 'utf8')) as LlamaConfig;
  const architecture = config.architectures?.[0];
  const arch = architecture === undefined ? undefined : GGUF_ARCHITECTURES[architecture];
  const refuse = (what: string): never => {
    throw new Error(`${modelDir}: ${what}: llama.cpp's ${arch ?? architecture} has no place for it`);
  };
  if (arch === undefined) throw new Error(`${modelDir}: only ${Object.keys(GGUF_ARCHITECTURES).join(', ')} are converted, not ${architecture}`);
  const ropeScaling = (config.rope_scaling ?? null) as Record<string, unknown> | null;
  const ropeType = ropeScaling === null ? null : String(ropeScaling.rope_type ?? ropeScaling.type);
  const allowedScaling: Readonly<Record<string, readonly string[]>> = { Gemma3ForCausalLM: ['linear'], Phi3ForCausalLM: ['longrope'], GptOssForCausalLM: ['yarn'], Qwen3ForCausalLM: ['yarn'], Qwen3MoeForCausalLM: ['yarn'] };
  if (ropeType !== null && !(allowedScaling[architecture!] ?? []).includes(ropeType)) refuse(`rope_scaling of type ${ropeType}`);
  const { tensors } = readCheckpointTensors(modelDir);
  const source = (name: string): CheckpointTensor => {
    const tensor = tensors.get(name);
    if (tensor === undefined) throw new Error(`${modelDir}: the checkpoint has no tensor ${name}`);
    return tensor;
  };
  const read = (name: string): Values => {
    const tensor = source(name);
    const bytes = readBytes(tensor);
    return { values: valuesOf(bytes, tensor.dtype), dtype: tensor.dtype };
  };
  const numHeads = config.num_attention_heads;
  const numKvHeads = config.num_key_value_heads ?? numHeads;
  const headDim = config.head_dim ?? config.hidden_size / numHeads;
  const embedDtype = source('model.embed_tokens.weight').dtype;
  const matrixType = options.matrixType ?? SAFETENSORS_TO_GGML[embedDtype];
  if (matrixType === undefined) throw new Error(`${modelDir}: weights of ${embedDtype} are not converted`);
  const permutesRotary = architecture === 'LlamaForCausalLM' || architecture === 'MixtralForCausalLM';
  const gemma = architecture === 'Gemma3ForCausalLM';

  const out: GgufTensor[] = [];
  const typeOf = (dtype: string, name: string): GgmlTypeName => {
    const suffix = Object.keys(options.typesBySuffix ?? {}).find((key) => name.endsWith(key));
    const type = (suffix === undefined ? undefined : options.typesBySuffix![suffix]) ?? options.matrixType ?? SAFETENSORS_TO_GGML[dtype];
    if (type === undefined || SAFETENSORS_TO_GGML[dtype] === undefined) throw new Error(`${name}: ${dtype} is not converted`);
    return type;
  };
  /** A matrix (or stack of them) from values made when it is written. */
  const pushMatrix = (ggufName: string, shape: number[], dtype: string, produce: () => Uint8Array) => {
    const type = typeOf(dtype, ggufName);
    if (shape[shape.length - 1] % GGML_TYPES[type].blockElements !== 0) {
      throw new Error(`${ggufName}: rows of ${shape[shape.length - 1]} are not whole ${type} blocks of ${GGML_TYPES[type].blockElements}`);
    }
    out.push({ name: ggufName, shape, type, data: () => convertMatrix(produce(), dtype, type) });
  };
  const matrix = (ggufName: string, hfName: string, permuteHeads = 0) => {
    const tensor = source(hfName);
    pushMatrix(ggufName, tensor.shape, tensor.dtype, () => {
      const bytes = readBytes(tensor);
      return permuteHeads > 0 && permutesRotary ? permuteRotaryRows(bytes, permuteHeads, tensor.shape[0]) : bytes;
    });
  };
  /** Per-expert [rows, k] matrices stacked into one [experts, rows, k] tensor (torch.stack). */
  const stackedExperts = (ggufName: string, hfNames: string[]) => {
    const first = source(hfNames[0]);
    pushMatrix(ggufName, [hfNames.length, ...first.shape], first.dtype, () => {
      const parts = hfNames.map((name) => readBytes(source(name)));
      const bytes = new Uint8Array(parts.reduce((sum, part) => sum + part.length, 0));
      parts.reduce((at, part) => (bytes.set(part, at), at + part.length), 0);
      return bytes;
    });
  };
  /** An fp32 tensor (norms, biases, sinks, routers); shift: Gemma's 1 + w; q and k biases permuted as their rows. */
  const f32 = (ggufName: string, hfName: string, shift = 0) => {
    const tensor = source(hfName);
    const permuteHeads = !permutesRotary ? 0 : hfName.endsWith('q_proj.bias') ? numHeads : hfName.endsWith('k_proj.bias') ? numKvHeads : 0;
    out.push({
      name: ggufName,
      shape: tensor.shape,
      type: 'F32',
      data: () => {
        const values = Float32Array.from(valuesOf(readBytes(tensor), tensor.dtype));
        if (shift !== 0) values.forEach((w, i) => (values[i] = w + shift));
        const bytes = new Uint8Array(values.buffer);
        return permuteHeads > 0 ? permuteRotaryRows(bytes, permuteHeads, values.length) : bytes;
      },
    });
  };
  const norm = (ggufName: string, hfName: string) => f32(ggufName, hfName, gemma ? 1 : 0);
  const optional = (ggufName: string, hfName: string, write: (ggufName: string, hfName: string) => void) => {
    if (tensors.has(hfName)) write(ggufName, hfName);
  };

  matrix('token_embd.weight', 'model.embed_tokens.weight');
  let numExperts = 0;
  for (let layer = 0; layer < config.num_hidden_layers; layer++) {
    const hf = `model.layers.${layer}.`;
    const gguf = `blk.${layer}.`;
    norm(`${gguf}attn_norm.weight`, `${hf}input_layernorm.weight`);
    if (architecture === 'Phi3ForCausalLM') {
      matrix(`${gguf}attn_qkv.weight`, `${hf}self_attn.qkv_proj.weight`);
    } else {
      matrix(`${gguf}attn_q.weight`, `${hf}self_attn.q_proj.weight`, numHeads);
      matrix(`${gguf}attn_k.weight`, `${hf}self_attn.k_proj.weight`, numKvHeads);
      matrix(`${gguf}attn_v.weight`, `${hf}self_attn.v_proj.weight`);
    }
    matrix(`${gguf}attn_output.weight`, `${hf}self_attn.o_proj.weight`);
    for (const proj of ['q', 'k', 'v', 'o'] as const) optional(`${gguf}attn_${proj === 'o' ? 'output' : proj}.bias`, `${hf}self_attn.${proj}_proj.bias`, f32);
    optional(`${gguf}attn_q_norm.weight`, `${hf}self_attn.q_norm.weight`, norm);
    optional(`${gguf}attn_k_norm.weight`, `${hf}self_attn.k_norm.weight`, norm);
    optional(`${gguf}attn_sinks.weight`, `${hf}self_attn.sinks`, f32);
    if (gemma) {
      norm(`${gguf}post_attention_norm.weight`, `${hf}post_attention_layernorm.weight`);
      norm(`${gguf}ffn_norm.weight`, `${hf}pre_feedforward_layernorm.weight`);
      norm(`${gguf}post_ffw_norm.weight`, `${hf}post_feedforward_layernorm.weight`);
    } else {
      // gpt-oss's norm before its MLP is post_attention_norm in llama.cpp, everyone else's ffn_norm.
      norm(`${gguf}${architecture === 'GptOssForCausalLM' ? 'post_attention_norm' : 'ffn_norm'}.weight`, `${hf}post_attention_layernorm.weight`);
    }
    const router = { Qwen3MoeForCausalLM: 'mlp.gate', MixtralForCausalLM: 'block_sparse_moe.gate', GptOssForCausalLM: 'mlp.router' }[architecture!];
    if (router === undefined || !tensors.has(`${hf}${router}.weight`)) {
      if (architecture === 'Phi3ForCausalLM') {
        matrix(`${gguf}ffn_up.weight`, `${hf}mlp.gate_up_proj.weight`);
      } else {
        matrix(`${gguf}ffn_gate.weight`, `${hf}mlp.gate_proj.weight`);
        matrix(`${gguf}ffn_up.weight`, `${hf}mlp.up_proj.weight`);
      }
      matrix(`${gguf}ffn_down.weight`, `${hf}mlp.down_proj.weight`);
      continue;
    }
    f32(`${gguf}ffn_gate_inp.weight`, `${hf}${router}.weight`);
    numExperts = source(`${hf}${router}.weight`).shape[0];
    if (architecture === 'GptOssForCausalLM') {
      gptOssExperts(gguf, `${hf}mlp.experts`);
      f32(`${gguf}ffn_gate_inp.bias`, `${hf}${router}.bias`);
      continue;
    }
    const [gate, up, down] = architecture === 'MixtralForCausalLM' ? ['w1', 'w3', 'w2'] : ['gate_proj', 'up_proj', 'down_proj'];
    const experts = (name: string) => Array.from({ length: numExperts }, (_, e) => `${hf}${architecture === 'MixtralForCausalLM' ? 'block_sparse_moe' : 'mlp'}.experts.${e}.${name}.weight`);
    stackedExperts(`${gguf}ffn_gate_exps.weight`, experts(gate));
    stackedExperts(`${gguf}ffn_up_exps.weight`, experts(up));
    stackedExperts(`${gguf}ffn_down_exps.weight`, experts(down));
  }
  norm('output_norm.weight', 'model.norm.weight');
  if (!(config.tie_word_embeddings ?? gemma)) matrix('output.weight', 'lm_head.weight');

  /** gpt-oss's experts (GptOssModel): gate_up split by parity into gate and up stacks, biases too. */
  function gptOssExperts(gguf: string, prefix: string): void {
    if (tensors.has(`${prefix}.gate_up_proj_blocks`)) {
      mxfp4Experts(gguf, prefix);
    } else {
      dequantizedExperts(gguf, prefix);
    }
    const gateUpBias = source(`${prefix}.gate_up_proj_bias`);
    const [count, twiceWidth] = gateUpBias.shape;
    const bias = (parity: number) => () => {
      const values = valuesOf(readBytes(gateUpBias), gateUpBias.dtype);
      return new Uint8Array(Float32Array.from({ length: values.length / 2 }, (_, i) => values[2 * i + parity]).buffer);
    };
    out.push({ name: `${gguf}ffn_gate_exps.bias`, shape: [count, twiceWidth / 2], type: 'F32', data: bias(0) });
    out.push({ name: `${gguf}ffn_up_exps.bias`, shape: [count, twiceWidth / 2], type: 'F32', data: bias(1) });
    f32(`${gguf}ffn_down_exps.bias`, `${prefix}.down_proj_bias`);
  }

  /** Dequantized experts, [experts, in, out] in transformers: transposed (GptOssModel.modify_tensors). */
  function dequantizedExperts(gguf: string, prefix: string): void {
    const gateUp = source(`${prefix}.gate_up_proj`);
    const [count, hidden, twiceWidth] = gateUp.shape;
    const width = twiceWidth / 2;
    const cached = new Map<string, Values>();
    const once = (name: string) => cached.get(name) ?? cached.set(name, read(name)).get(name)!;
    const half = (parity: number) => () => new Uint8Array(transposedExperts(once(`${prefix}.gate_up_proj`).values, count, hidden, twiceWidth, parity, 2).buffer);
    pushMatrix(`${gguf}ffn_gate_exps.weight`, [count, width, hidden], 'F32', half(0));
    pushMatrix(`${gguf}ffn_up_exps.weight`, [count, width, hidden], 'F32', half(1));
    pushMatrix(`${gguf}ffn_down_exps.weight`, [count, hidden, width], 'F32', () => new Uint8Array(transposedExperts(read(`${prefix}.down_proj`).values, count, width, hidden, 0, 1).buffer));
  }

  /**
   * gpt-oss's MXFP4 experts repacked as ggml's blocks (GptOssModel.repack_mxfp4): per 32 of a row,
   * the scale byte, then byte j holding element j (low nibble) and j + 16 (high); gate rows are
   * gate_up's even ones, up rows its odd ones.
   */
  function mxfp4Experts(gguf: string, prefix: string): void {
    const pack = (name: string, parity: number, step: number) => {
      const blocks = source(`${prefix}.${name}_blocks`);
      const [count, rows, numBlocks] = blocks.shape;
      const outRows = rows / step;
      return {
        shape: [count, outRows, numBlocks * 32],
        data: () => {
          const codes = readBytes(blocks);
          const scales = readBytes(source(`${prefix}.${name}_scales`));
          const out = new Uint8Array(count * outRows * numBlocks * 17);
          for (let e = 0; e < count; e++) {
            for (let r = 0; r < outRows; r++) {
              for (let b = 0; b < numBlocks; b++) {
                const from = (e * rows + r * step + parity) * numBlocks + b;
                const at = ((e * outRows + r) * numBlocks + b) * 17;
                out[at] = scales[from];
                const code = (m: number) => (codes[from * 16 + (m >> 1)] >> (4 * (m & 1))) & 0x0f;
                for (let j = 0; j < 16; j++) out[at + 1 + j] = code(j) | (code(j + 16) << 4);
              }
            }
          }
          return out;
        },
      };
    };
    for (const [ggufName, name, parity, step] of [['ffn_gate_exps', 'gate_up_proj', 0, 2], ['ffn_up_exps', 'gate_up_proj', 1, 2], ['ffn_down_exps', 'down_proj', 0, 1]] as const) {
      out.push({ name: `${gguf}${ggufName}.weight`, type: 'MXFP4', ...pack(name, parity, step) });
    }
  }

  const u32 = (value: number): GgufValue => ({ type: 'uint32', value });
  const f32Value = (value: number): GgufValue => ({ type: 'float32', value });
  const metadata: [string, GgufValue][] = [
    ['general.architecture', { type: 'string', value: arch }],
    ['general.name', { type: 'string', value: path.basename(path.resolve(modelDir)) }],
    ['general.file_type', u32(FILE_TYPE[matrixType])],
    [`${arch}.context_length`, u32(config.max_position_embeddings)],
    [`${arch}.embedding_length`, u32(config.hidden_size)],
    [`${arch}.block_count`, u32(config.num_hidden_layers)],
    [`${arch}.feed_forward_length`, u32(config.intermediate_size)],
    [`${arch}.attention.head_count`, u32(numHeads)],
    [`${arch}.attention.head_count_kv`, u32(numKvHeads)],
    [`${arch}.rope.freq_base`, f32Value(config.rope_theta ?? 10000)],
    [`${arch}.attention.layer_norm_rms_epsilon`, f32Value(config.rms_norm_eps)],
    [`${arch}.vocab_size`, u32(config.vocab_size)],
  ];
  const add = (name: string, value: GgufValue) => metadata.push([`${arch}.${name}`, value]);
  if (architecture === 'Phi3ForCausalLM') {
    // Phi3MiniModel: rotated dims per head, the window (0: none), LongRoPE's factors as tensors.
    const rotaryDim = Math.floor(Math.floor((config.partial_rotary_factor ?? 1) * config.hidden_size) / numHeads);
    add('rope.dimension_count', u32(rotaryDim));
    add('rope.scaling.original_context_length', u32(config.original_max_position_embeddings ?? config.max_position_embeddings));
    add('attention.sliding_window', u32(config.sliding_window ?? 0));
    if (ropeType === 'longrope') {
      const scale = config.max_position_embeddings / config.original_max_position_embeddings!;
      add('rope.scaling.attn_factor', f32Value(scale > 1 ? Math.sqrt(1 + Math.log(scale) / Math.log(config.original_max_position_embeddings!)) : 1));
      for (const which of ['long', 'short'] as const) {
        const factors = ropeScaling![`${which}_factor`] as number[];
        out.push({ name: `rope_factors_${which}.weight`, shape: [factors.length], type: 'F32', data: () => new Uint8Array(Float32Array.from(factors).buffer) });
      }
    }
  } else {
    add('rope.dimension_count', u32(headDim));
    add('attention.key_length', u32(headDim));
    add('attention.value_length', u32(headDim));
  }
  if (ropeType === 'linear' || ropeType === 'yarn') {
    add('rope.scaling.type', { type: 'string', value: ropeType });
    add('rope.scaling.factor', f32Value(Number(ropeScaling!.factor)));
    if (ropeType === 'yarn') add('rope.scaling.original_context_length', u32(Number(ropeScaling!.original_max_position_embeddings)));
  }
  switch (architecture) {
    case 'Qwen3MoeForCausalLM':
      if (config.norm_topk_prob === false) refuse('norm_topk_prob false (it always renormalizes)');
      if (config.use_sliding_window === true) refuse('a sliding window');
      add('expert_count', u32(config.num_experts!));
      add('expert_used_count', u32(config.num_experts_per_tok!));
      add('expert_feed_forward_length', u32(config.moe_intermediate_size!));
      break;
    case 'Qwen3ForCausalLM':
      if (config.use_sliding_window === true) refuse('a sliding window');
      break;
    case 'MixtralForCausalLM':
      if (config.sliding_window != null) refuse('a sliding window');
      add('expert_count', u32(config.num_local_experts!));
      add('expert_used_count', u32(config.num_experts_per_tok!));
      break;
    case 'Gemma3ForCausalLM': {
      if (config.attn_logit_softcapping != null) refuse('attn_logit_softcapping');
      const pattern = config.sliding_window_pattern ?? 6;
      const expectedTypes = Array.from({ length: config.num_hidden_layers }, (_, i) => ((i + 1) % pattern !== 0 ? 'sliding_attention' : 'full_attention'));
      if (config.layer_types !== undefined && config.layer_types.some((type, i) => type !== expectedTypes[i])) refuse('layer_types off the sliding_window_pattern');
      // llama.cpp scales scores by head_dim^-0.5 (by (hidden / heads)^-0.5 for the 62-layer 27B).
      const scalar = config.num_hidden_layers === 62 ? config.hidden_size / numHeads : headDim;
      if ((config.query_pre_attn_scalar ?? 256) !== scalar) refuse(`query_pre_attn_scalar ${config.query_pre_attn_scalar} (llama.cpp derives ${scalar})`);
      if (pattern !== 1) add('attention.sliding_window', u32(config.sliding_window ?? 4096));
      if (pattern !== 6) add('attention.sliding_window_pattern', u32(pattern));
      if (config.final_logit_softcapping != null) add('final_logit_softcapping', f32Value(config.final_logit_softcapping));
      if ((config.rope_local_base_freq ?? 10000) !== 10000) add('rope.freq_base_swa', f32Value(config.rope_local_base_freq!));
      break;
    }
    case 'GptOssForCausalLM':
      add('attention.sliding_window', u32(config.sliding_window ?? 128));
      add('expert_count', u32(config.num_local_experts!));
      add('expert_used_count', u32(config.num_experts_per_tok!));
      add('expert_feed_forward_length', u32(config.intermediate_size));
      break;
    default:
      break;
  }
  // A checkpoint without tokenizer.json (the runtime's random test models) gets no tokenizer.
  if (existsSync(path.join(modelDir, 'tokenizer.json'))) metadata.push(...tokenizerMetadata(modelDir, config.vocab_size, config));
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
