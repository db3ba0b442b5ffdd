// Reads and checks a Hugging Face checkpoint directory (config.json plus safetensors headers) and
// turns it into the plain spec the C++ runtime loads without further checks: file paths, byte
// ranges, dtypes and every hyperparameter resolved. Every error names the file and the field.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import type { Architecture, ModelDimensions, WeightDtype } from './api.ts';
import {
  INDEX_FILE_NAME,
  SINGLE_FILE_NAME,
  readCheckpointTensors,
  type CheckpointTensor,
  type SafetensorsDtype,
} from './safetensors.ts';

/** Where one tensor's bytes lie; sizeBytes 0 marks an absent optional tensor. */
export interface TensorRef {
  fileIndex: number;
  offsetBytes: number;
  sizeBytes: number;
  dtype: WeightDtype;
}

export interface LayerRefs {
  inputNorm: TensorRef;
  qProj: TensorRef;
  kProj: TensorRef;
  vProj: TensorRef;
  qBias: TensorRef | null;
  kBias: TensorRef | null;
  vBias: TensorRef | null;
  oProj: TensorRef;
  postAttentionNorm: TensorRef;
  gateProj: TensorRef;
  upProj: TensorRef;
  downProj: TensorRef;
}

/** What native/src/binding.cc marshals into cd_model_spec. */
export interface ModelSpec extends ModelDimensions {
  filePaths: string[];
  rmsNormEps: number;
  /** 0 when unlimited. */
  slidingWindowTokens: number;
  /** [headDim / 2], rope scaling applied. */
  ropeInvFreq: Float64Array;
  embedTokens: TensorRef;
  finalNorm: TensorRef;
  lmHead: TensorRef;
  layers: LayerRefs[];
}

export interface Checkpoint {
  architecture: Architecture;
  maxPositionEmbeddings: number;
  tieWordEmbeddings: boolean;
  /** torch_dtype from config.json, or the embedding's dtype when absent. */
  storedDtype: WeightDtype;
  spec: ModelSpec;
}

const ARCHITECTURES: readonly Architecture[] = ['LlamaForCausalLM', 'MistralForCausalLM', 'Qwen2ForCausalLM'];

const TORCH_DTYPES: Readonly<Record<string, WeightDtype>> = { float32: 'fp32', bfloat16: 'bf16', float16: 'fp16' };

const STORED_DTYPES: Partial<Readonly<Record<SafetensorsDtype, WeightDtype>>> = { F32: 'fp32', BF16: 'bf16', F16: 'fp16' };

type Json = Record<string, unknown>;

/** Reads config.json field by field; each failure names the file and the field. */
class ConfigReader {
  constructor(
    readonly file: string,
    readonly json: Json,
  ) {}

  fail(field: string, expected: string): never {
    throw new Error(`${this.file}: ${field} must be ${expected}, got ${JSON.stringify(this.json[field])}`);
  }

  has(field: string): boolean {
    return this.json[field] !== undefined && this.json[field] !== null;
  }

  positiveInt(field: string, fallback?: number): number {
    if (!this.has(field) && fallback !== undefined) return fallback;
    const value = this.json[field];
    if (!Number.isSafeInteger(value) || (value as number) < 1) this.fail(field, 'a positive integer');
    return value as number;
  }

  positiveNumber(field: string, fallback?: number): number {
    if (!this.has(field) && fallback !== undefined) return fallback;
    const value = this.json[field];
    if (typeof value !== 'number' || !(value > 0) || !Number.isFinite(value)) this.fail(field, 'a positive number');
    return value;
  }

  bool(field: string, fallback: boolean): boolean {
    if (!this.has(field)) return fallback;
    const value = this.json[field];
    if (typeof value !== 'boolean') this.fail(field, 'true or false');
    return value;
  }
}

function readConfig(modelDir: string): ConfigReader {
  const file = path.join(modelDir, 'config.json');
  let json: unknown;
  try {
    json = JSON.parse(readFileSync(file, 'utf8'));
  } catch (err) {
    throw new Error(`${file}: cannot read as JSON: ${(err as Error).message}`);
  }
  if (typeof json !== 'object' || json === null || Array.isArray(json)) throw new Error(`${file}: must hold a JSON object`);
  return new ConfigReader(file, json as Json);
}

function readArchitecture(config: ConfigReader): Architecture {
  const architectures = config.json.architectures;
  if (!Array.isArray(architectures) || architectures.length !== 1 || !ARCHITECTURES.includes(architectures[0])) {
    config.fail('architectures', `one of ${ARCHITECTURES.join(', ')}`);
  }
  return architectures[0] as Architecture;
}

/** Refuses config switches that change the computation in ways the runtime does not implement. */
function rejectUnsupportedFeatures(config: ConfigReader, architecture: Architecture): void {
  if (config.has('hidden_act') && config.json.hidden_act !== 'silu') config.fail('hidden_act', '"silu"');
  if (architecture === 'LlamaForCausalLM') {
    if (config.bool('attention_bias', false)) config.fail('attention_bias', 'false (o_proj bias is not supported)');
    if (config.bool('mlp_bias', false)) config.fail('mlp_bias', 'false');
  }
  if (architecture === 'Qwen2ForCausalLM' && config.bool('use_sliding_window', false)) {
    config.fail('use_sliding_window', 'false (per-layer sliding windows are not supported)');
  }
}

function readSlidingWindow(config: ConfigReader, architecture: Architecture): number {
  if (architecture !== 'MistralForCausalLM' || !config.has('sliding_window')) return 0;
  return config.positiveInt('sliding_window');
}

/** Inverse rotary frequencies, with Llama 3's frequency-dependent scaling when configured. */
function ropeInvFreq(config: ConfigReader, headDim: number): Float64Array {
  const theta = config.positiveNumber('rope_theta', 10000);
  const half = headDim / 2;
  const invFreq = Float64Array.from({ length: half }, (_, i) => 1 / theta ** ((2 * i) / headDim));
  if (!config.has('rope_scaling')) return invFreq;
  const scaling = config.json.rope_scaling as Json;
  const ropeType = typeof scaling === 'object' ? (scaling.rope_type ?? scaling.type) : undefined;
  if (ropeType === 'default') return invFreq;
  if (ropeType !== 'llama3') config.fail('rope_scaling', 'null or of rope_type "default" or "llama3"');
  const scalingReader = new ConfigReader(`${config.file} rope_scaling`, scaling);
  const factor = scalingReader.positiveNumber('factor');
  const lowFreqFactor = scalingReader.positiveNumber('low_freq_factor');
  const highFreqFactor = scalingReader.positiveNumber('high_freq_factor');
  const originalMaxPositions = scalingReader.positiveInt('original_max_position_embeddings');
  if (!(highFreqFactor > lowFreqFactor)) scalingReader.fail('high_freq_factor', 'greater than low_freq_factor');
  const lowFreqWavelen = originalMaxPositions / lowFreqFactor;
  const highFreqWavelen = originalMaxPositions / highFreqFactor;
  return invFreq.map((freq) => {
    const wavelen = (2 * Math.PI) / freq;
    if (wavelen < highFreqWavelen) return freq;
    if (wavelen > lowFreqWavelen) return freq / factor;
    const smooth = (originalMaxPositions / wavelen - lowFreqFactor) / (highFreqFactor - lowFreqFactor);
    return (1 - smooth) * (freq / factor) + smooth * freq;
  });
}

/** Looks tensors up by name and checks dtype and shape; refs index into the ordered file list. */
class TensorCatalogue {
  readonly filePaths: string[] = [];
  private readonly fileIndices = new Map<string, number>();

  constructor(
    private readonly tensors: Map<string, CheckpointTensor>,
    /** Named in "missing tensor" errors: the index file or the single safetensors file. */
    private readonly listing: string,
  ) {}

  require(name: string, shape: readonly number[]): TensorRef {
    const tensor = this.tensors.get(name);
    if (tensor === undefined) throw new Error(`${this.listing}: missing tensor ${JSON.stringify(name)}`);
    const dtype = STORED_DTYPES[tensor.dtype];
    if (dtype === undefined) {
      throw new Error(`${tensor.file}: tensor ${JSON.stringify(name)} has dtype ${tensor.dtype}; expected F32, BF16 or F16`);
    }
    if (tensor.shape.length !== shape.length || tensor.shape.some((d, i) => d !== shape[i])) {
      throw new Error(
        `${tensor.file}: tensor ${JSON.stringify(name)} has shape [${tensor.shape.join(', ')}]; config.json implies [${shape.join(', ')}]`,
      );
    }
    let fileIndex = this.fileIndices.get(tensor.file);
    if (fileIndex === undefined) {
      fileIndex = this.filePaths.length;
      this.filePaths.push(tensor.file);
      this.fileIndices.set(tensor.file, fileIndex);
    }
    return { fileIndex, offsetBytes: tensor.dataBegin, sizeBytes: tensor.dataEnd - tensor.dataBegin, dtype };
  }
}

function readLayer(tensors: TensorCatalogue, index: number, dims: ModelDimensions, hasQkvBias: boolean): LayerRefs {
  const prefix = `model.layers.${index}`;
  const { hiddenSize, intermediateSize } = dims;
  const qSize = dims.numHeads * dims.headDim;
  const kvSize = dims.numKvHeads * dims.headDim;
  const bias = (name: string, size: number) => (hasQkvBias ? tensors.require(`${prefix}.self_attn.${name}.bias`, [size]) : null);
  return {
    inputNorm: tensors.require(`${prefix}.input_layernorm.weight`, [hiddenSize]),
    qProj: tensors.require(`${prefix}.self_attn.q_proj.weight`, [qSize, hiddenSize]),
    kProj: tensors.require(`${prefix}.self_attn.k_proj.weight`, [kvSize, hiddenSize]),
    vProj: tensors.require(`${prefix}.self_attn.v_proj.weight`, [kvSize, hiddenSize]),
    qBias: bias('q_proj', qSize),
    kBias: bias('k_proj', kvSize),
    vBias: bias('v_proj', kvSize),
    oProj: tensors.require(`${prefix}.self_attn.o_proj.weight`, [hiddenSize, qSize]),
    postAttentionNorm: tensors.require(`${prefix}.post_attention_layernorm.weight`, [hiddenSize]),
    gateProj: tensors.require(`${prefix}.mlp.gate_proj.weight`, [intermediateSize, hiddenSize]),
    upProj: tensors.require(`${prefix}.mlp.up_proj.weight`, [intermediateSize, hiddenSize]),
    downProj: tensors.require(`${prefix}.mlp.down_proj.weight`, [hiddenSize, intermediateSize]),
  };
}


function readDims(config: ConfigReader): ModelDimensions {
  const hiddenSize = config.positiveInt('hidden_size');
  const numHeads = config.positiveInt('num_attention_heads');
  const numKvHeads = config.positiveInt('num_key_value_heads', numHeads);
  if (numHeads % numKvHeads !== 0) config.fail('num_key_value_heads', `a divisor of num_attention_heads (${numHeads})`);
  const defaultHeadDim = hiddenSize / numHeads;
  if (!config.has('head_dim') && !Number.isInteger(defaultHeadDim)) {
    config.fail('hidden_size', `a multiple of num_attention_heads (${numHeads}) when head_dim is absent`);
  }
  const headDim = config.positiveInt('head_dim', defaultHeadDim);
  if (headDim % 2 !== 0) config.fail('head_dim', 'even (rotary embeddings pair its halves)');
  return {
    numLayers: config.positiveInt('num_hidden_layers'),
    hiddenSize,
    intermediateSize: config.positiveInt('intermediate_size'),
    numHeads,
    numKvHeads,
    headDim,
    vocabSize: config.positiveInt('vocab_size'),
  };
}

function readStoredDtype(config: ConfigReader, embedTokens: TensorRef): WeightDtype {
  if (!config.has('torch_dtype')) return embedTokens.dtype;
  const dtype = TORCH_DTYPES[config.json.torch_dtype as string];
  if (dtype === undefined) config.fail('torch_dtype', `one of ${Object.keys(TORCH_DTYPES).join(', ')}`);
  return dtype;
}

function listingFile(modelDir: string, tensors: Map<string, CheckpointTensor>): string {
  const files = new Set([...tensors.values()].map((t) => t.file));
  return path.join(modelDir, files.size === 1 && files.has(path.join(modelDir, SINGLE_FILE_NAME)) ? SINGLE_FILE_NAME : INDEX_FILE_NAME);
}

export function readCheckpoint(modelDir: string): Checkpoint {
  const config = readConfig(modelDir);
  const architecture = readArchitecture(config);
  rejectUnsupportedFeatures(config, architecture);
  const dims = readDims(config);
  const { tensors } = readCheckpointTensors(modelDir);
  const catalogue = new TensorCatalogue(tensors, listingFile(modelDir, tensors));
  const tieWordEmbeddings = config.bool('tie_word_embeddings', false);
  const embedTokens = catalogue.require('model.embed_tokens.weight', [dims.vocabSize, dims.hiddenSize]);
  const hasQkvBias = architecture === 'Qwen2ForCausalLM';
  const layers = Array.from({ length: dims.numLayers }, (_, i) => readLayer(catalogue, i, dims, hasQkvBias));
  const spec: ModelSpec = {
    filePaths: catalogue.filePaths,
    ...dims,
    rmsNormEps: config.positiveNumber('rms_norm_eps', 1e-6),
    slidingWindowTokens: readSlidingWindow(config, architecture),
    ropeInvFreq: ropeInvFreq(config, dims.headDim),
    embedTokens,
    finalNorm: catalogue.require('model.norm.weight', [dims.hiddenSize]),
    lmHead: tieWordEmbeddings ? embedTokens : catalogue.require('lm_head.weight', [dims.vocabSize, dims.hiddenSize]),
    layers,
  };
  return {
    architecture,
    maxPositionEmbeddings: config.positiveInt('max_position_embeddings'),
    tieWordEmbeddings,
    storedDtype: readStoredDtype(config, embedTokens),
    spec,
  };
}
