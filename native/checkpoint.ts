// Reads and checks a Hugging Face checkpoint directory (config.json plus safetensors headers) and
// turns it into the plain spec the C++ runtime loads without further checks: file paths, byte
// ranges, dtypes and every hyperparameter resolved. Each architecture has a module under
// families/ that reads its config fields and tensor names as transformers defines them; this one
// dispatches on config.json's architectures and plans the KV-cache groups. Every error names the
// file and the field.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import type { Architecture, WeightDtype } from './api.ts';
import { ConfigReader, TensorCatalogue, type TensorRef } from './checkpoint-reader.ts';
import { FAMILIES, type FamilyModel } from './families/index.ts';
import { ggufFileOf } from '../gguf.ts';
import { readGgufCheckpoint } from './gguf-checkpoint.ts';
import { planKvGroups, type KvGroupPlan } from './kv-groups.ts';
import { INDEX_FILE_NAME, SINGLE_FILE_NAME, readCheckpointTensors, type CheckpointTensor } from './safetensors.ts';

export type { TensorRef } from './checkpoint-reader.ts';

export interface ExpertRefs {
  gateProj: TensorRef;
  upProj: TensorRef;
  downProj: TensorRef;
  gateBias: TensorRef | null;
  upBias: TensorRef | null;
  downBias: TensorRef | null;
}

/** One decoder layer (native/include/conduit.h, cd_layer_spec). */
export interface LayerRefs {
  inputNorm: TensorRef;
  qProj: TensorRef;
  kProj: TensorRef;
  vProj: TensorRef;
  qBias: TensorRef | null;
  kBias: TensorRef | null;
  vBias: TensorRef | null;
  qNorm: TensorRef | null;
  kNorm: TensorRef | null;
  sinks: TensorRef | null;
  oProj: TensorRef;
  oBias: TensorRef | null;
  attentionOutputNorm: TensorRef | null;
  ffnNorm: TensorRef;
  ffnOutputNorm: TensorRef | null;
  /** 0 when unlimited. */
  slidingWindowTokens: number;
  ropeIndex: number;
  kvGroup: number;
  kvSlot: number;
  /** Dense MLP; null in a MoE layer. */
  gateProj: TensorRef | null;
  upProj: TensorRef | null;
  downProj: TensorRef | null;
  /** MoE MLP; null in a dense layer. */
  router: TensorRef | null;
  routerBias: TensorRef | null;
  experts: ExpertRefs[] | null;
}

export interface RopeSpec {
  rotaryDim: number;
  /** [rotaryDim / 2], rope scaling applied. */
  invFreq: Float64Array;
  attentionScaling: number;
}

export type Activation = 'silu' | 'gelu_tanh' | 'clamped_swiglu';
export type Routing = 'softmax_topk' | 'topk_softmax';

/** What native/src/binding.cc marshals into cd_model_spec. */
export interface ModelSpec {
  filePaths: string[];
  numLayers: number;
  hiddenSize: number;
  intermediateSize: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  vocabSize: number;
  rmsNormEps: number;
  normAddsOne: boolean;
  /** Norm weights used in fp32 as stored (a GGUF's Gemma norms, 1 + w), not rounded to the weight dtype. */
  normsInFp32: boolean;
  embeddingScale: number;
  attentionScale: number;
  /** 0 when off. */
  attentionSoftcap: number;
  finalSoftcap: number;
  activation: Activation;
  swigluAlpha: number;
  swigluLimit: number;
  moeIntermediateSize: number;
  numExperts: number;
  numExpertsPerToken: number;
  routing: Routing;
  normTopkProb: boolean;
  ropes: RopeSpec[];
  numKvGroups: number;
  layersPerKvBlock: number;
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
  kvGroups: KvGroupPlan;
  spec: ModelSpec;
}

export interface CheckpointOptions {
  /** The longest sequence to be served (LongRoPE's factor choice); max_position_embeddings when absent. */
  maxModelLen?: number;
}

const TORCH_DTYPES: Readonly<Record<string, WeightDtype>> = { float32: 'fp32', bfloat16: 'bf16', float16: 'fp16' };

function readConfig(modelDir: string): ConfigReader {
  const file = path.join(modelDir, 'config.json');
  let json: unknown;
  try {
    json = JSON.parse(readFileSync(file, 'utf8'));
  } catch (err) {
    throw new Error(`${file}: cannot read as JSON: ${(err as Error).message}`);
  }
  if (typeof json !== 'object' || json === null || Array.isArray(json)) throw new Error(`${file}: must hold a JSON object`);
  return new ConfigReader(file, json as Record<string, unknown>);
}

function readArchitecture(config: ConfigReader): Architecture {
  const architectures = config.json.architectures;
  const names = Object.keys(FAMILIES);
  if (!Array.isArray(architectures) || architectures.length !== 1 || !names.includes(architectures[0])) {
    config.fail('architectures', `one of ${names.join(', ')}`);
  }
  return architectures[0] as Architecture;
}

function readStoredDtype(config: ConfigReader, embedTokens: TensorRef): WeightDtype {
  // transformers 5 writes `dtype`; earlier versions `torch_dtype`.
  const field = config.has('torch_dtype') ? 'torch_dtype' : config.has('dtype') ? 'dtype' : null;
  if (field === null) return embedTokens.dtype;
  const dtype = TORCH_DTYPES[config.json[field] as string];
  if (dtype === undefined) config.fail(field, `one of ${Object.keys(TORCH_DTYPES).join(', ')}`);
  return dtype;
}

function listingFile(modelDir: string, tensors: Map<string, CheckpointTensor>): string {
  const files = new Set([...tensors.values()].map((t) => t.file));
  return path.join(modelDir, files.size === 1 && files.has(path.join(modelDir, SINGLE_FILE_NAME)) ? SINGLE_FILE_NAME : INDEX_FILE_NAME);
}

export function readCheckpoint(modelDir: string, options: CheckpointOptions = {}): Checkpoint {
  const ggufFile = ggufFileOf(modelDir);
  if (ggufFile !== null) return readGgufCheckpoint(ggufFile, options);
  const config = readConfig(modelDir);
  const architecture = readArchitecture(config);
  const { tensors } = readCheckpointTensors(modelDir);
  const catalogue = new TensorCatalogue(tensors, listingFile(modelDir, tensors));
  return assembleCheckpoint(architecture, config, catalogue, options, (model) => readStoredDtype(model.config, model.embedTokens));
}

/** The spec of a family's model: KV-cache groups planned, every tensor and dimension in place. */
export function assembleCheckpoint(
  architecture: Architecture,
  config: ConfigReader,
  catalogue: TensorCatalogue,
  options: CheckpointOptions,
  storedDtypeOf: (model: FamilyModel) => WeightDtype,
): Checkpoint {
  const model: FamilyModel = FAMILIES[architecture](config, catalogue, options);
  const kvGroups = planKvGroups(model.layers.map((layer) => layer.slidingWindowTokens));
  const layers: LayerRefs[] = model.layers.map((layer, i) => ({ ...layer, kvGroup: kvGroups.layerGroups[i], kvSlot: kvGroups.layerSlots[i] }));
  const numExperts = layers.reduce((most, layer) => Math.max(most, layer.experts?.length ?? 0), 0);
  const spec: ModelSpec = {
    filePaths: catalogue.filePaths,
    ...model.dims,
    ...model.numerics,
    numExperts,
    normsInFp32: false,
    ropes: model.ropes,
    numKvGroups: kvGroups.groups.length,
    layersPerKvBlock: kvGroups.layersPerBlock,
    embedTokens: model.embedTokens,
    finalNorm: model.finalNorm,
    lmHead: model.lmHead,
    layers,
  };
  return {
    architecture,
    maxPositionEmbeddings: model.maxPositionEmbeddings,
    tieWordEmbeddings: model.tieWordEmbeddings,
    storedDtype: storedDtypeOf(model),
    kvGroups,
    spec,
  };
}
