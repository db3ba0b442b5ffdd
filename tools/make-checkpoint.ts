// Writes a Hugging Face checkpoint with random weights for tests and benchmarks: config.json
// as transformers writes it for Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Mixtral, Gemma 3, Phi-3
// and gpt-oss (tools/checkpoint-families.ts), tensors under their HF names and shapes (gpt-oss's
// experts in MXFP4, as shipped), optionally sharded with model.safetensors.index.json, and
// generation_config.json.
//
//   node --import tsx tools/make-checkpoint.ts --out DIR --hidden 768 --layers 12 --heads 12 \
//     --kv-heads 4 --ffn 2048 --vocab 32000 --dtype bf16 [--arch llama|mistral|qwen2|qwen3|...]
//     [--tie] [--head-dim N] [--sliding-window N] [--rope-theta X] [--rope-scaling-llama3]
//     [--experts N --experts-per-token N --moe-ffn N] [--shards N] [--seed N] [--max-pos N]
//     [--zeros]   (every weight zero, in sparse files: size without cost)
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { createRng } from '../loadtest/random.ts';
import type { WeightDtype } from '../native/api.ts';
import { buildNewConfig, canonicalTensorName, isNewArch, newTensorSpecs, quantizeMxfp4, type NewArchName } from './checkpoint-families.ts';
import { tokenIdOf, tokenizerConfigJson, tokenizerFits, tokenizerJson } from './checkpoint-tokenizer.ts';
import { PyFloat, toPythonJson } from './python-json.ts';

export { PyFloat, toPythonJson } from './python-json.ts';
import { numElements, tensorBytes, writeSafetensors, writeSparseSafetensors, type TensorSpec, type WriteDtype } from './safetensors-writer.ts';

export type ArchName = 'llama' | 'mistral' | 'qwen2' | NewArchName;

export const ARCH_NAMES: readonly ArchName[] = ['llama', 'mistral', 'qwen2', 'qwen3', 'qwen3_moe', 'mixtral', 'gemma3', 'phi3', 'gpt_oss'];

export interface CheckpointOptions {
  outDir: string;
  arch: ArchName;
  hiddenSize: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  intermediateSize: number;
  vocabSize: number;
  dtype: WeightDtype;
  tieWordEmbeddings: boolean;
  /** Written to config.json only when set; otherwise hiddenSize / numHeads. */
  headDim?: number;
  /**
   * Each query of a sliding layer sees this many most recent tokens, itself included: every layer
   * of Mistral, Mixtral, Phi-3 and Qwen3-MoE; Qwen3's layers from maxWindowLayers on; Gemma 3's
   * and gpt-oss's local layers (their default windows apply when unset).
   */
  slidingWindow?: number;
  /** Qwen3: layers before this one keep full attention (max_window_layers; default numLayers). */
  maxWindowLayers?: number;
  /** Qwen3 / Qwen3-MoE: q/k/v/o biases. */
  attentionBias?: boolean;
  /** MoE: experts per layer, experts per token; Qwen3-MoE's expert width and layer rules. */
  numExperts?: number;
  numExpertsPerToken?: number;
  moeIntermediateSize?: number;
  normTopkProb?: boolean;
  decoderSparseStep?: number;
  mlpOnlyLayers?: number[];
  /** Gemma 3. */
  slidingWindowPattern?: number;
  queryPreAttnScalar?: number;
  attnLogitSoftcapping?: number;
  finalLogitSoftcapping?: number;
  ropeLocalBaseFreq?: number;
  /** Gemma 3 as the multimodal checkpoint lays it out (Gemma3ForConditionalGeneration), the same text weights. */
  gemma3Multimodal?: boolean;
  /** Gemma 3's global layers: linear rope scaling by this factor. */
  ropeScalingLinear?: number;
  /** Phi-3 / Phi-4-mini. */
  partialRotaryFactor?: number;
  longRope?: { originalMaxPositionEmbeddings: number };
  /** YaRN rope scaling (gpt-oss ships it; Qwen3's long-context recipe). */
  yarn?: { factor: number; originalMaxPositionEmbeddings: number };
  /** gpt-oss: experts as shipped (mxfp4, the default) or dequantized to the [in, out] bf16 layout. */
  expertFormat?: 'mxfp4' | 'bf16';
  swigluLimit?: number;
  ropeTheta: number;
  ropeScalingLlama3: boolean;
  numShards: number;
  seed: number;
  maxPositionEmbeddings: number;
  rmsNormEps: number;
  bosTokenId: number;
  eosTokenId: number;
  /**
   * Every weight zero, each safetensors file a sparse one (tools/safetensors-writer.ts): a
   * checkpoint of any size that costs neither time nor disk, for tests of size alone.
   */
  zeros?: boolean;
  /** Sampling defaults for generation_config.json; without them it is the plain one derived from config.json. */
  generationDefaults?: Record<string, number | PyFloat>;
}

export const DEFAULT_OPTIONS = {
  arch: 'llama',
  dtype: 'bf16',
  tieWordEmbeddings: false,
  ropeTheta: 10000,
  ropeScalingLlama3: false,
  numShards: 1,
  seed: 0,
  maxPositionEmbeddings: 2048,
  rmsNormEps: 1e-6,
  bosTokenId: 1,
  eosTokenId: 2,
} as const satisfies Partial<CheckpointOptions>;

const ARCHITECTURE: Readonly<Record<'llama' | 'mistral' | 'qwen2', string>> = {
  llama: 'LlamaForCausalLM',
  mistral: 'MistralForCausalLM',
  qwen2: 'Qwen2ForCausalLM',
};

const SAFETENSORS_DTYPE: Readonly<Record<WeightDtype, WriteDtype>> = { fp32: 'F32', bf16: 'BF16', fp16: 'F16' };
const TORCH_DTYPE: Readonly<Record<WeightDtype, string>> = { fp32: 'float32', bf16: 'bfloat16', fp16: 'float16' };

/** Llama 3.1's published rope_scaling. */
export const LLAMA3_ROPE_SCALING = {
  factor: 8,
  low_freq_factor: 1,
  high_freq_factor: 4,
  original_max_position_embeddings: 8192,
} as const;

export function headDimOf(options: CheckpointOptions): number {
  return options.headDim ?? options.hiddenSize / options.numHeads;
}

export function validateOptions(options: CheckpointOptions): void {
  const positive: Array<keyof CheckpointOptions> = [
    'hiddenSize',
    'numLayers',
    'numHeads',
    'numKvHeads',
    'intermediateSize',
    'vocabSize',
    'numShards',
    'maxPositionEmbeddings',
  ];
  for (const key of positive) {
    const value = options[key];
    if (!Number.isSafeInteger(value) || (value as number) < 1) throw new Error(`${key} must be a positive integer, got ${value}`);
  }
  if (options.numHeads % options.numKvHeads !== 0) {
    throw new Error(`numHeads (${options.numHeads}) must be a multiple of numKvHeads (${options.numKvHeads})`);
  }
  const headDim = headDimOf(options);
  if (!Number.isSafeInteger(headDim) || headDim % 2 !== 0) {
    throw new Error(`head dim ${headDim} must be an even integer (set headDim or make hiddenSize divisible by numHeads)`);
  }
  if (options.slidingWindow !== undefined && (options.arch === 'llama' || options.arch === 'qwen2')) {
    throw new Error(`slidingWindow is not a ${options.arch} setting`);
  }
  const moe = options.arch === 'qwen3_moe' || options.arch === 'mixtral' || options.arch === 'gpt_oss';
  if (moe) {
    for (const key of ['numExperts', 'numExpertsPerToken'] as const) {
      if (!(Number.isSafeInteger(options[key]) && (options[key] as number) >= 1)) throw new Error(`${key} must be a positive integer for ${options.arch}`);
    }
    if (options.numExpertsPerToken! > options.numExperts!) throw new Error(`numExpertsPerToken (${options.numExpertsPerToken}) exceeds numExperts (${options.numExperts})`);
  }
  if (options.arch === 'qwen3_moe' && !(Number.isSafeInteger(options.moeIntermediateSize) && options.moeIntermediateSize! >= 1)) {
    throw new Error('moeIntermediateSize must be a positive integer for qwen3_moe');
  }
  if (options.arch === 'gpt_oss' && options.expertFormat !== 'bf16' && (options.hiddenSize % 32 !== 0 || options.intermediateSize % 32 !== 0)) {
    throw new Error(`gpt-oss's MXFP4 experts need hiddenSize and intermediateSize in whole 32-element blocks (${options.hiddenSize}, ${options.intermediateSize})`);
  }
  if (options.slidingWindow !== undefined && !(Number.isSafeInteger(options.slidingWindow) && options.slidingWindow >= 1)) {
    throw new Error(`slidingWindow must be a positive integer, got ${options.slidingWindow}`);
  }
  for (const key of ['bosTokenId', 'eosTokenId'] as const) {
    if (!(Number.isSafeInteger(options[key]) && options[key] >= 0 && options[key] < options.vocabSize)) {
      throw new Error(`${key} ${options[key]} must be a token id below vocabSize ${options.vocabSize}`);
    }
  }
}

/** config.json as transformers writes it for the architecture (without transformers_version: it did not write this one). */
export function buildConfig(options: CheckpointOptions): Record<string, unknown> {
  if (isNewArch(options.arch)) return buildNewConfig(options as CheckpointOptions & { arch: NewArchName }, TORCH_DTYPE[options.dtype]);
  const config: Record<string, unknown> = {
    architectures: [ARCHITECTURE[options.arch as keyof typeof ARCHITECTURE]],
    attention_dropout: new PyFloat(0),
    bos_token_id: options.bosTokenId,
    eos_token_id: options.eosTokenId,
    hidden_act: 'silu',
    hidden_size: options.hiddenSize,
    initializer_range: new PyFloat(0.02),
    intermediate_size: options.intermediateSize,
    max_position_embeddings: options.maxPositionEmbeddings,
    model_type: options.arch,
    num_attention_heads: options.numHeads,
    num_hidden_layers: options.numLayers,
    num_key_value_heads: options.numKvHeads,
    rms_norm_eps: new PyFloat(options.rmsNormEps),
    rope_theta: new PyFloat(options.ropeTheta),
    tie_word_embeddings: options.tieWordEmbeddings,
    torch_dtype: TORCH_DTYPE[options.dtype],
    use_cache: true,
    vocab_size: options.vocabSize,
  };
  if (options.headDim !== undefined) config.head_dim = options.headDim;
  const ropeScaling = options.ropeScalingLlama3
    ? {
        rope_type: 'llama3',
        factor: new PyFloat(LLAMA3_ROPE_SCALING.factor),
        low_freq_factor: new PyFloat(LLAMA3_ROPE_SCALING.low_freq_factor),
        high_freq_factor: new PyFloat(LLAMA3_ROPE_SCALING.high_freq_factor),
        original_max_position_embeddings: LLAMA3_ROPE_SCALING.original_max_position_embeddings,
      }
    : null;
  switch (options.arch) {
    case 'llama':
      Object.assign(config, { attention_bias: false, mlp_bias: false, pretraining_tp: 1, rope_scaling: ropeScaling });
      break;
    case 'mistral':
      config.sliding_window = options.slidingWindow ?? null;
      if (ropeScaling !== null) config.rope_scaling = ropeScaling;
      break;
    case 'qwen2':
      // Qwen2 always has q/k/v biases; there is no config key for them.
      Object.assign(config, {
        max_window_layers: options.numLayers,
        rope_scaling: ropeScaling,
        sliding_window: null,
        use_sliding_window: false,
      });
      break;
  }
  return config;
}

/** Every tensor of the checkpoint in Hugging Face order, with [out_features, in_features] shapes. */
export function checkpointTensorSpecs(options: CheckpointOptions): TensorSpec[] {
  const dtype = SAFETENSORS_DTYPE[options.dtype];
  if (isNewArch(options.arch)) return newTensorSpecs(options as CheckpointOptions & { arch: NewArchName }, dtype);
  const { hiddenSize, intermediateSize, numHeads, numKvHeads, vocabSize } = options;
  const qDim = numHeads * headDimOf(options);
  const kvDim = numKvHeads * headDimOf(options);
  const specs: TensorSpec[] = [{ name: 'model.embed_tokens.weight', dtype, shape: [vocabSize, hiddenSize] }];
  for (let layer = 0; layer < options.numLayers; layer++) {
    const prefix = `model.layers.${layer}`;
    const attention: Array<[string, number[]]> = [
      ['q_proj.weight', [qDim, hiddenSize]],
      ['k_proj.weight', [kvDim, hiddenSize]],
      ['v_proj.weight', [kvDim, hiddenSize]],
      ['o_proj.weight', [hiddenSize, qDim]],
    ];
    if (options.arch === 'qwen2') attention.push(['q_proj.bias', [qDim]], ['k_proj.bias', [kvDim]], ['v_proj.bias', [kvDim]]);
    for (const [name, shape] of attention) specs.push({ name: `${prefix}.self_attn.${name}`, dtype, shape });
    specs.push(
      { name: `${prefix}.mlp.gate_proj.weight`, dtype, shape: [intermediateSize, hiddenSize] },
      { name: `${prefix}.mlp.up_proj.weight`, dtype, shape: [intermediateSize, hiddenSize] },
      { name: `${prefix}.mlp.down_proj.weight`, dtype, shape: [hiddenSize, intermediateSize] },
      { name: `${prefix}.input_layernorm.weight`, dtype, shape: [hiddenSize] },
      { name: `${prefix}.post_attention_layernorm.weight`, dtype, shape: [hiddenSize] },
    );
  }
  specs.push({ name: 'model.norm.weight', dtype, shape: [hiddenSize] });
  if (!options.tieWordEmbeddings) specs.push({ name: 'lm_head.weight', dtype, shape: [vocabSize, hiddenSize] });
  return specs;
}

/**
 * Mulberry32 seeded from (seed, tensor name): each tensor's values depend only on those two,
 * so sharding or reordering does not change the weights.
 */
function tensorRandom(seed: number, name: string): () => number {
  let state = Math.imul(seed >>> 0, 0x9e3779b1) ^ 0x811c9dc5;
  for (let i = 0; i < name.length; i++) state = Math.imul(state ^ name.charCodeAt(i), 0x01000193);
  return createRng(state);
}

/** Fills `out` with mean + std · N(0, 1) draws (Box–Muller, both outputs used). */
function fillNormal(out: Float32Array, random: () => number, mean: number, std: number): void {
  for (let i = 0; i < out.length; i += 2) {
    const radius = Math.sqrt(-2 * Math.log(1 - random())) * std;
    const angle = 2 * Math.PI * random();
    out[i] = mean + radius * Math.cos(angle);
    if (i + 1 < out.length) out[i + 1] = mean + radius * Math.sin(angle);
  }
}

/**
 * Scales that keep activations O(1) through the stack: matrices get std 1/sqrt(fan_in); the two
 * projections that add into the residual stream also shrink by 1/sqrt(2 · layers) so it does not
 * grow with depth; embeddings get 1/sqrt(hidden) so (tied) logits come out with std near 1;
 * norm weights sit near 1 and biases near 0, with enough noise that a mix-up shows in the logits.
 */
function initFor(spec: TensorSpec, options: CheckpointOptions): { mean: number; std: number } {
  const name = canonicalTensorName(spec.name);
  // Gemma's norms multiply by (1 + w): weights near 0 scale by about 1.
  if (name.endsWith('norm.weight')) return { mean: options.arch === 'gemma3' ? 0 : 1, std: 0.1 };
  if (name.endsWith('.bias') || name.endsWith('_bias')) return { mean: 0, std: 0.2 };
  if (name.endsWith('.sinks')) return { mean: 0, std: 1 };
  if (name === 'model.embed_tokens.weight' || name === 'lm_head.weight') return { mean: 0, std: 1 / Math.sqrt(options.hiddenSize) };
  // Experts stacked [experts, out, in], or gpt-oss's dequantized [experts, in, out].
  const fanIn = name.endsWith('experts.gate_up_proj') || name.endsWith('experts.down_proj') ? spec.shape[1] : spec.shape[spec.shape.length - 1];
  const residual = ['o_proj.weight', 'down_proj.weight', '.w2.weight', 'experts.down_proj'].some((suffix) => name.endsWith(suffix));
  const residualScale = residual ? 1 / Math.sqrt(2 * options.numLayers) : 1;
  return { mean: 0, std: residualScale / Math.sqrt(fanIn) };
}

/** gpt-oss's MXFP4 tensors: their values drawn as the dequantized [experts, rows, k] matrices are, then encoded. */
function mxfp4Data(spec: TensorSpec, options: CheckpointOptions): Uint8Array {
  const logical = spec.name.replace(/_(blocks|scales)$/, '');
  const [experts, rows, groups] = spec.shape;
  const k = groups * 32;
  const values = new Float32Array(experts * rows * k);
  const residualScale = logical.endsWith('down_proj') ? 1 / Math.sqrt(2 * options.numLayers) : 1;
  fillNormal(values, tensorRandom(options.seed, logical), 0, residualScale / Math.sqrt(k));
  const { blocks, scales } = quantizeMxfp4(values);
  return spec.name.endsWith('_blocks') ? blocks : scales;
}

/** Splits specs into contiguous runs of roughly equal bytes, as many as asked (never an empty shard). */
function splitIntoShards(specs: TensorSpec[], numShards: number): TensorSpec[][] {
  const count = Math.min(numShards, specs.length);
  const totalBytes = specs.reduce((sum, spec) => sum + tensorBytes(spec), 0);
  const shards: TensorSpec[][] = [];
  let current: TensorSpec[] = [];
  let bytesSoFar = 0;
  specs.forEach((spec, index) => {
    const remainingSpecs = specs.length - index;
    const remainingShards = count - shards.length;
    const boundaryBytes = (totalBytes * (shards.length + 1)) / count;
    if (current.length > 0 && (bytesSoFar >= boundaryBytes || remainingSpecs < remainingShards)) {
      shards.push(current);
      current = [];
    }
    current.push(spec);
    bytesSoFar += tensorBytes(spec);
  });
  shards.push(current);
  return shards;
}

function shardFileName(index: number, numShards: number): string {
  const pad = (n: number) => String(n).padStart(5, '0');
  return `model-${pad(index + 1)}-of-${pad(numShards)}.safetensors`;
}

export function buildGenerationConfig(options: CheckpointOptions): Record<string, unknown> {
  const config: Record<string, unknown> = { bos_token_id: options.bosTokenId, eos_token_id: options.eosTokenId };
  if (options.generationDefaults === undefined) config._from_model_config = true;
  return { ...config, ...options.generationDefaults };
}

/**
 * With the family's tokenizer (when its tokens and the 256 bytes fit the vocabulary), config.json
 * names its bos and eos ids and generation_config.json its end-of-turn tokens and sampling
 * defaults, as the published checkpoint does; the tokenizer files are written beside them.
 */
function withFamilyTokens(options: CheckpointOptions): { options: CheckpointOptions; generation: Record<string, unknown> } {
  const family = tokenizerFits(options.arch, options.vocabSize);
  if (family === null) return { options, generation: buildGenerationConfig(options) };
  const tokened = { ...options, bosTokenId: tokenIdOf(family, family.configBos), eosTokenId: tokenIdOf(family, family.configEos) };
  const eos = family.generationEos.map((token) => tokenIdOf(family, token));
  return {
    options: tokened,
    generation: {
      bos_token_id: tokened.bosTokenId,
      eos_token_id: eos.length === 1 ? eos[0] : eos,
      ...(family.padToken === null ? {} : { pad_token_id: tokenIdOf(family, family.padToken) }),
      ...family.generationDefaults,
      ...options.generationDefaults,
    },
  };
}

export function writeRandomCheckpoint(requested: CheckpointOptions): void {
  validateOptions(requested);
  const { options, generation } = withFamilyTokens(requested);
  mkdirSync(options.outDir, { recursive: true });
  writeFileSync(path.join(options.outDir, 'config.json'), `${toPythonJson(buildConfig(options))}\n`);
  writeFileSync(path.join(options.outDir, 'generation_config.json'), `${toPythonJson(generation)}\n`);
  const family = tokenizerFits(options.arch, options.vocabSize);
  if (family !== null) {
    writeFileSync(path.join(options.outDir, 'tokenizer.json'), `${JSON.stringify(tokenizerJson(family), null, 2)}\n`);
    writeFileSync(path.join(options.outDir, 'tokenizer_config.json'), `${JSON.stringify(tokenizerConfigJson(family, options.maxPositionEmbeddings), null, 2)}\n`);
  }

  const dataFor = (spec: TensorSpec): Float32Array | Uint8Array => {
    if (spec.dtype === 'U8') return mxfp4Data(spec, options);
    const data = new Float32Array(numElements(spec.shape));
    const { mean, std } = initFor(spec, options);
    fillNormal(data, tensorRandom(options.seed, canonicalTensorName(spec.name)), mean, std);
    return data;
  };
  const specs = checkpointTensorSpecs(options);
  const metadata = { format: 'pt' };
  const write = (file: string, fileSpecs: readonly TensorSpec[]): number =>
    options.zeros === true ? writeSparseSafetensors(file, fileSpecs, metadata) : writeSafetensors(file, fileSpecs, dataFor, metadata);
  if (options.numShards === 1) {
    write(path.join(options.outDir, 'model.safetensors'), specs);
    return;
  }
  const shards = splitIntoShards(specs, options.numShards);
  const weightMap: Record<string, string> = {};
  let totalBytes = 0;
  shards.forEach((shardSpecs, index) => {
    const fileName = shardFileName(index, shards.length);
    totalBytes += write(path.join(options.outDir, fileName), shardSpecs);
    for (const spec of shardSpecs) weightMap[spec.name] = fileName;
  });
  const index = { metadata: { total_size: totalBytes }, weight_map: weightMap };
  writeFileSync(path.join(options.outDir, 'model.safetensors.index.json'), `${toPythonJson(index)}\n`);
}

function definedOnly<T extends Record<string, unknown>>(record: T): Partial<T> {
  return Object.fromEntries(Object.entries(record).filter(([, value]) => value !== undefined)) as Partial<T>;
}

const USAGE =
  'usage: make-checkpoint --out DIR --hidden N --layers N --heads N --kv-heads N --ffn N --vocab N ' +
  `[--dtype fp32|bf16|fp16] [--arch ${ARCH_NAMES.join('|')}] [--tie] [--head-dim N] [--sliding-window N] ` +
  '[--rope-theta X] [--rope-scaling-llama3] [--experts N --experts-per-token N [--moe-ffn N]] [--shards N] [--seed N] [--max-pos N] [--zeros]';

export function parseCliOptions(argv: string[]): CheckpointOptions {
  const { values } = parseArgs({
    args: argv,
    strict: true,
    options: {
      out: { type: 'string' },
      hidden: { type: 'string' },
      layers: { type: 'string' },
      heads: { type: 'string' },
      'kv-heads': { type: 'string' },
      ffn: { type: 'string' },
      vocab: { type: 'string' },
      dtype: { type: 'string', default: DEFAULT_OPTIONS.dtype },
      arch: { type: 'string', default: DEFAULT_OPTIONS.arch },
      tie: { type: 'boolean', default: false },
      'head-dim': { type: 'string' },
      'sliding-window': { type: 'string' },
      'rope-theta': { type: 'string' },
      'rope-scaling-llama3': { type: 'boolean', default: false },
      shards: { type: 'string' },
      seed: { type: 'string' },
      'max-pos': { type: 'string' },
      experts: { type: 'string' },
      'experts-per-token': { type: 'string' },
      'moe-ffn': { type: 'string' },
      zeros: { type: 'boolean', default: false },
    },
  });
  const required = (flag: string): string => {
    const value = values[flag as keyof typeof values];
    if (typeof value !== 'string') throw new Error(`--${flag} is required\n${USAGE}`);
    return value;
  };
  const integer = (flag: string, text: string): number => {
    if (!/^\d+$/.test(text)) throw new Error(`--${flag} must be a non-negative integer, got ${JSON.stringify(text)}`);
    return Number(text);
  };
  const optionalInteger = (flag: string): number | undefined => {
    const value = values[flag as keyof typeof values];
    return typeof value === 'string' ? integer(flag, value) : undefined;
  };
  const dtype = values.dtype;
  if (dtype !== 'fp32' && dtype !== 'bf16' && dtype !== 'fp16') throw new Error(`--dtype must be fp32, bf16 or fp16, got ${values.dtype}`);
  const arch = values.arch as ArchName;
  if (!ARCH_NAMES.includes(arch)) throw new Error(`--arch must be one of ${ARCH_NAMES.join(', ')}, got ${arch}`);
  const ropeTheta = values['rope-theta'] === undefined ? DEFAULT_OPTIONS.ropeTheta : Number(values['rope-theta']);
  if (!(ropeTheta > 0)) throw new Error(`--rope-theta must be a positive number, got ${values['rope-theta']}`);
  return {
    ...DEFAULT_OPTIONS,
    outDir: required('out'),
    arch,
    dtype,
    hiddenSize: integer('hidden', required('hidden')),
    numLayers: integer('layers', required('layers')),
    numHeads: integer('heads', required('heads')),
    numKvHeads: integer('kv-heads', required('kv-heads')),
    intermediateSize: integer('ffn', required('ffn')),
    vocabSize: integer('vocab', required('vocab')),
    tieWordEmbeddings: values.tie,
    headDim: optionalInteger('head-dim'),
    slidingWindow: optionalInteger('sliding-window'),
    ropeTheta,
    ropeScalingLlama3: values['rope-scaling-llama3'],
    numShards: optionalInteger('shards') ?? DEFAULT_OPTIONS.numShards,
    seed: optionalInteger('seed') ?? DEFAULT_OPTIONS.seed,
    maxPositionEmbeddings: optionalInteger('max-pos') ?? DEFAULT_OPTIONS.maxPositionEmbeddings,
    ...definedOnly({
      numExperts: optionalInteger('experts'),
      numExpertsPerToken: optionalInteger('experts-per-token'),
      moeIntermediateSize: optionalInteger('moe-ffn'),
      zeros: values.zeros ? true : undefined,
    }),
  };
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(path.resolve(process.argv[1])).href) {
  try {
    const options = parseCliOptions(process.argv.slice(2));
    writeRandomCheckpoint(options);
    console.log(`wrote ${options.outDir}`);
  } catch (err) {
    console.error((err as Error).message);
    process.exitCode = 1;
  }
}
