// The contract between the engine and the native runtime. Plain data only: typed arrays in,
// typed arrays out. The engine builds a ForwardBatch from its SchedulerOutput; the runtime
// never sees requests, strings or scheduler state.

export type WeightDtype = 'fp32' | 'bf16' | 'fp16';
/** `auto` keeps the checkpoint's stored dtype (`torch_dtype` in config.json). */
export type DtypeSetting = 'auto' | WeightDtype;
/** Which SIMD kernels run. `auto` picks the best the CPU reports; the others force a path (tests). */
export type KernelPath = 'auto' | 'avx512' | 'avx2' | 'scalar';
/** `int8`: matrices quantized at load, Q8_0-style (int8 with one fp16 scale per 32 weights). */
export type Quantization = 'none' | 'int8';

export interface LoadOptions {
  /** A Hugging Face checkpoint directory: config.json and *.safetensors. */
  modelDir: string;
  dtype: DtypeSetting;
  kvCacheDtype: DtypeSetting;
  numKvBlocks: number;
  blockSizeTokens: number;
  numThreads: number;
  kernel: KernelPath;
  /** Default `none`. The embedding table, norms and KV cache keep `dtype`. */
  quantization?: Quantization;
}

export type Architecture = 'LlamaForCausalLM' | 'MistralForCausalLM' | 'Qwen2ForCausalLM';

/** A model's shape, resolved from config.json. */
export interface ModelDimensions {
  numLayers: number;
  hiddenSize: number;
  intermediateSize: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  vocabSize: number;
}

/** What the runtime resolved from config.json and the options. */
export interface ModelInfo extends ModelDimensions {
  architecture: Architecture;
  maxPositionEmbeddings: number;
  /** Tokens each query may look back, inclusive of itself; null when unlimited. */
  slidingWindowTokens: number | null;
  tieWordEmbeddings: boolean;
  dtype: WeightDtype;
  kvCacheDtype: WeightDtype;
  kernel: Exclude<KernelPath, 'auto'>;
  quantization: Quantization;
  numKvBlocks: number;
  blockSizeTokens: number;
  kvBytesPerBlock: number;
  numThreads: number;
}

/** Bits of ForwardBatch.seqFlags. */
export const SEQ_SAMPLE = 1;
export const SEQ_RETURN_LOGITS = 2;

/**
 * One forward pass over a flattened batch of tokens from many sequences: prompt chunks and
 * decode tokens mixed. Sequence i owns tokens [queryStarts[i], queryStarts[i+1]).
 * Every token's K and V are written to the paged cache at slot
 * blockTables[i * maxBlocksPerSeq + pos / blockSize] * blockSize + pos % blockSize
 * before attention reads it, so a token attends to positions [0, pos] of its sequence
 * (or the last slidingWindowTokens of them) wherever they were computed.
 * Sampling and logits refer to the last token of each sequence.
 */
export interface ForwardBatch {
  numSeqs: number;
  numTokens: number;
  tokenIds: Int32Array; // [numTokens]
  positions: Int32Array; // [numTokens]
  queryStarts: Int32Array; // [numSeqs + 1]
  maxBlocksPerSeq: number;
  blockTables: Int32Array; // [numSeqs * maxBlocksPerSeq], unused entries -1
  seqFlags: Uint8Array; // [numSeqs] SEQ_SAMPLE | SEQ_RETURN_LOGITS
  temperatures: Float32Array; // [numSeqs] 0 means greedy
  topPs: Float32Array; // [numSeqs] 1 disables
  topKs: Int32Array; // [numSeqs] 0 disables
  /** Counter-based sampling: the draw depends only on (seed, outputIndex). */
  seeds: BigUint64Array; // [numSeqs]
  outputIndices: Int32Array; // [numSeqs] index of the token being sampled within the output
}

export interface ForwardResult {
  /** [numSeqs]; -1 where the sequence was not sampled. */
  sampledTokenIds: Int32Array;
  /** [numSeqs] log-probability of the sampled token under the unmodified distribution. */
  sampledLogprobs: Float32Array;
  /** [numLogitSeqs * vocabSize] for the sequences flagged SEQ_RETURN_LOGITS, in batch order. */
  logits: Float32Array;
}

export interface NativeModel {
  readonly info: ModelInfo;
  /** Runs off the event loop on the runtime's own threads; rejects on error. One call at a time. */
  forward(batch: ForwardBatch): Promise<ForwardResult>;
  /** Unmaps weights and frees the KV cache. */
  close(): void;
}
