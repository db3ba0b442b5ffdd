// The contract between the engine and the native runtime. Plain data only: typed arrays in,
// typed arrays out. The engine builds a ForwardBatch from its SchedulerOutput; the runtime
// never sees requests, strings or scheduler state.

export type WeightDtype = 'fp32' | 'bf16' | 'fp16';
/** `auto` keeps the checkpoint's stored dtype (`torch_dtype` in config.json). */
export type DtypeSetting = 'auto' | WeightDtype;
/** Which SIMD kernels run. `auto` picks the best the CPU reports; the others force a path (tests). */
export type KernelPath = 'auto' | 'amx' | 'avx512' | 'avx2' | 'scalar';
/**
 * `int8`: matrices quantized at load, Q8_0-style (int8 with one fp16 scale per 32 weights);
 * `int4`: 4-bit codes with an fp32 scale and min per 32 weights (GGUF's Q4_K and Q4_0 load so
 * whatever the setting).
 */
export type Quantization = 'none' | 'int8' | 'int4';
/**
 * How a loaded weight matrix is held, as its kernels read it: panels of fp32, fp16 or bf16;
 * `int8` and `int4` (Quantization's formats); `q4_k`: GGUF Q4_K blocks as they are (4-bit codes,
 * 6-bit scales and mins per 32, fp16 factors per 256); `q8_k`: GGUF Q5_K and Q6_K values as int8
 * with their blocks' scales.
 */
export type MatrixFormat = 'fp32' | 'fp16' | 'bf16' | 'int8' | 'int4' | 'q4_k' | 'q8_k';
/** Where the weights and KV cache live and passes run: `cpu`, or `cuda` (a plugin opened on demand). */
export type Device = 'cpu' | 'cuda';

export interface LoadOptions {
  /** A Hugging Face checkpoint directory: config.json and *.safetensors. */
  modelDir: string;
  dtype: DtypeSetting;
  kvCacheDtype: DtypeSetting;
  numKvBlocks: number;
  blockSizeTokens: number;
  numThreads: number;
  kernel: KernelPath;
  /**
   * This process's place in a tensor-parallel group (absent: the whole model). Rank 0 serves
   * forward(); ranks > 0 run serveRank() (native/index.ts).
   */
  tensorParallel?: TensorParallelOptions;
  /** Default `cpu`. A device this build or machine cannot use rejects with CD_ERR_UNSUPPORTED_DEVICE, saying why. */
  device?: Device;
  /** With device `cuda`: which GPU (default 0). */
  deviceIndex?: number;
  /**
   * Default `none`. The embedding table, norms and KV cache keep `dtype`; MoE routers stay fp32.
   * MXFP4 experts (gpt-oss as shipped) become int8 blocks either way, exactly.
   */
  quantization?: Quantization;
  /**
   * The longest sequence the server will run; max_position_embeddings when absent. LongRoPE
   * (Phi-3) uses its long factors when this exceeds original_max_position_embeddings.
   */
  maxModelLen?: number;
  /**
   * The memory this load may take, in bytes; by default what the machine has available now
   * (native/memory.ts). A load whose packed weights and KV cache need more is refused before
   * anything is allocated, with code CD_ERR_OUT_OF_MEMORY and both figures in its message.
   */
  memoryLimitBytes?: number;
}

/**
 * Megatron-style tensor parallelism over ranks joined through a shared-memory segment: each rank
 * holds 1/size of the heads, KV heads, MLP columns (column-parallel q/k/v and gate/up,
 * row-parallel o_proj and down_proj) and vocabulary (the LM head); rank 0 samples. Logits are
 * bitwise the same at every size (native/README.md, "Tensor parallelism").
 */
export interface TensorParallelOptions {
  /** 1, 2, 4 or 8; must divide the heads, the KV heads and the intermediate size. */
  size: number;
  rank: number;
  /**
   * The group's name: its segment is /dev/shm/<group> ([A-Za-z0-9._-]+). Or 'mpi:': the ranks of
   * MPI_COMM_WORLD, started by an MPI launcher on one machine or several, joined through the MPI
   * library (MPICH ABI, libmpich.so.12 / libmpi.so.12, or CONDUIT_MPI_LIBRARY), opened at run time.
   * With device cuda one process drives every rank and the name is not used (GPU_GROUP).
   */
  group: string;
  /**
   * How long a rank waits for rank 0's segment, and rank 0 for every rank to load (default 600 000).
   * Over MPI also how long a rank's close() waits for every other rank to close: the job ends when
   * all have (none is left for the launcher to kill), or a rank that has not is named and the job aborted.
   */
  connectTimeoutMs?: number;
  /** Rank 0: the processes started as ranks 1.., so that one dying before it connects fails the load at once. */
  rankPids?: number[];
}

export type Architecture =
  | 'LlamaForCausalLM'
  | 'MistralForCausalLM'
  | 'Qwen2ForCausalLM'
  | 'Qwen3ForCausalLM'
  | 'Qwen3MoeForCausalLM'
  | 'MixtralForCausalLM'
  | 'Gemma3ForCausalLM'
  | 'Gemma3ForConditionalGeneration'
  | 'Phi3ForCausalLM'
  | 'GptOssForCausalLM';

/**
 * One KV-cache group (vLLM's hybrid allocator): layers that see the same span share a block
 * table, one per group in ForwardBatch.blockTables. A block holds `layersPerKvBlock` layers of one
 * group; the blocks a sliding window has left are needed by none of its group's layers.
 */
export interface KvCacheGroup {
  /** Tokens each query of the group's layers looks back, itself included; null when unlimited. */
  slidingWindowTokens: number | null;
  numLayers: number;
}

/** A model's shape, resolved from config.json. */
export interface ModelDimensions {
  numLayers: number;
  hiddenSize: number;
  intermediateSize: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  vocabSize: number;
  /** MoE layers: experts per layer and experts per token; 0 for a dense model. */
  numExperts: number;
  numExpertsPerToken: number;
}

/** What the runtime resolved from config.json and the options. */
export interface ModelInfo extends ModelDimensions {
  architecture: Architecture;
  maxPositionEmbeddings: number;
  /** The window every layer shares, inclusive of the query; null when some layer sees every position. */
  slidingWindowTokens: number | null;
  kvCacheGroups: KvCacheGroup[];
  layersPerKvBlock: number;
  tieWordEmbeddings: boolean;
  dtype: WeightDtype;
  kvCacheDtype: WeightDtype;
  kernel: Exclude<KernelPath, 'auto'>;
  quantization: Quantization;
  numKvBlocks: number;
  blockSizeTokens: number;
  /** K and V of one block: layersPerKvBlock layers of one group. */
  kvBytesPerBlock: number;
  numThreads: number;
}

/** Bits of ForwardBatch.seqFlags. */
export const SEQ_SAMPLE = 1;
export const SEQ_RETURN_LOGITS = 2;
/** Log-probabilities of every known next token in this sequence's chunk (prompt logprobs). */
export const SEQ_PROMPT_LOGPROBS = 4;

/** The most alternatives a sampled or prompt position reports; the row stride of the top-logprob outputs. */
export const MAX_TOP_LOGPROBS = 20;

/**
 * One forward pass over a flattened batch of tokens from many sequences: prompt chunks and
 * decode tokens mixed. Sequence i owns tokens [queryStarts[i], queryStarts[i+1]).
 * blockTables holds one table per KV-cache group (ModelInfo.kvCacheGroups), group g's at
 * [g * numSeqs * maxBlocksPerSeq, (g + 1) * numSeqs * maxBlocksPerSeq). For a layer of group g,
 * every token's K and V are written to the paged cache at slot
 * blockTables[(g * numSeqs + i) * maxBlocksPerSeq + pos / blockSize] * blockSize + pos % blockSize
 * before attention reads it, so a token attends to positions [0, pos] of its sequence
 * (or the last slidingWindowTokens of them) wherever they were computed. A group's table may hold
 * -1 for blocks its window no longer reaches.
 * Sampling, logits and top logprobs refer to the last token of each sequence (its last k + 1
 * with k proposals, see numDraftTokens); prompt logprobs to every token of a flagged sequence's
 * chunk.
 *
 * Sampling a sequence (vLLM v1's order): raw logits → the structured output's token bitmask
 * (when the sequence has one) → logit bias → repetition penalty →
 * frequency and presence penalties → argmax when temperature is 0 or topK is 1, otherwise
 * temperature → min-p → top-k → top-p → one inverse-CDF draw. sampledLogprobs, topLogprobs and
 * promptLogprobs are all taken from the raw logits.
 */
export interface ForwardBatch {
  numSeqs: number;
  numTokens: number;
  tokenIds: Int32Array; // [numTokens]
  positions: Int32Array; // [numTokens]
  queryStarts: Int32Array; // [numSeqs + 1]
  maxBlocksPerSeq: number;
  blockTables: Int32Array; // [numKvGroups * numSeqs * maxBlocksPerSeq], unused entries -1
  seqFlags: Uint8Array; // [numSeqs] SEQ_SAMPLE | SEQ_RETURN_LOGITS | SEQ_PROMPT_LOGPROBS
  temperatures: Float32Array; // [numSeqs] 0 means greedy
  topPs: Float32Array; // [numSeqs] 1 disables
  topKs: Int32Array; // [numSeqs] 0 disables
  /** Counter-based sampling: the draw depends only on (seed, outputIndex). */
  seeds: BigUint64Array; // [numSeqs]
  outputIndices: Int32Array; // [numSeqs] index of the token being sampled within the output
  /**
   * [numSeqs] in [0, 1], 0 disables. After temperature, tokens whose probability is below
   * minP × the largest probability are dropped.
   */
  minPs: Float32Array;
  /**
   * [numSeqs] in [-2, 2], 0 disables (OpenAI semantics): logit -= frequencyPenalty × count +
   * presencePenalty × (count > 0), count = the token's occurrences among the output tokens so far
   * (penaltyOutputCounts).
   */
  presencePenalties: Float32Array;
  frequencyPenalties: Float32Array;
  /**
   * [numSeqs] finite and > 0, 1 disables (Hugging Face / vLLM semantics): every token that occurs
   * in the prompt or the output so far gets logit > 0 ? logit / penalty : logit × penalty.
   */
  repetitionPenalties: Float32Array;
  /**
   * The penalties' history, CSR over sequences: sequence i's distinct tokens are entries
   * [penaltyStarts[i], penaltyStarts[i+1]), each token id at most once per sequence. A sequence
   * whose penalties are all neutral may have an empty range.
   */
  penaltyStarts: Int32Array; // [numSeqs + 1], from 0, non-decreasing
  penaltyTokenIds: Int32Array; // [penaltyStarts[numSeqs]]
  /** Occurrences among the output tokens; 0 for a token seen only in the prompt. */
  penaltyOutputCounts: Int32Array; // [penaltyStarts[numSeqs]]
  /** 1 where the token occurs in the prompt, else 0. */
  penaltyInPrompt: Uint8Array; // [penaltyStarts[numSeqs]]
  /**
   * Logit bias, CSR over sequences like the penalties: biasValues are added to the logits of
   * biasTokenIds (each id at most once per sequence); finite, or -Infinity to ban a token (how the
   * engine keeps stop tokens out before min_tokens).
   */
  biasStarts: Int32Array; // [numSeqs + 1], from 0, non-decreasing
  biasTokenIds: Int32Array; // [biasStarts[numSeqs]]
  biasValues: Float32Array; // [biasStarts[numSeqs]]
  /** [numSeqs] 0..MAX_TOP_LOGPROBS: the most likely tokens to report for the sampled position. */
  numTopLogprobs: Int32Array;
  /** [numSeqs] 0..MAX_TOP_LOGPROBS: alternatives to report per prompt position (SEQ_PROMPT_LOGPROBS). */
  numPromptTopLogprobs: Int32Array;
  /**
   * [numSeqs] for SEQ_PROMPT_LOGPROBS: the token that follows this chunk's last token, or -1 when
   * the chunk ends the known tokens (nothing is then reported at the chunk's last position).
   */
  promptNextTokenIds: Int32Array;
  /**
   * Structured outputs (optional; absent or null when no sequence is constrained, which costs
   * nothing). [numSeqs]: the row of tokenBitmask that restricts sequence i's sample, -1 for none.
   * The mask applies first, before bias, penalties, temperature, min-p, top-k and top-p: a
   * constrained sequence samples only among the tokens its row allows (greedy: the argmax of
   * those). Logprobs stay those of the raw logits (see ForwardResult).
   */
  bitmaskRows?: Int32Array | null;
  /** [rows × bitmaskWords] packed bits: token id is allowed when bit id & 31 of word id >> 5 is set. */
  tokenBitmask?: Int32Array | null;
  /** ceil(vocabSize / 32). */
  bitmaskWords?: number;
  /**
   * Optional, with tokenBitmask on a SharedArrayBuffer that other threads are still filling: a
   * one-entry counter those threads raise (Atomics.add) as they finish rows. The runtime reads
   * no row before bitmaskReady[0] >= bitmaskReadyTarget, so the masks are written while the
   * layers run; a pass whose masks are not counted within 30 s fails.
   */
  bitmaskReady?: Int32Array | null;
  bitmaskReadyTarget?: number;
  /**
   * Speculative decoding (optional; absent or null when no sequence carries proposals). [numSeqs]:
   * the last numDraftTokens[i] = k tokens of sequence i's chunk are proposed continuations, on a
   * sequence flagged SEQ_SAMPLE alone (no SEQ_RETURN_LOGITS or SEQ_PROMPT_LOGPROBS), without a
   * bitmask row. It samples at each of its last k + 1 tokens in turn, the j-th (from 0) exactly as
   * plain decoding samples output index outputIndices[i] + j once the proposals before it are
   * output (same logits, same counter; the penalties count those proposals among the output),
   * accepting a proposal when the sample before it equals it; the first sample that differs, or
   * the one after the last proposal, is the last. The bias (bans included) is the sequence's for
   * every row, so the caller keeps a sequence's rows on one side of its min_tokens.
   */
  numDraftTokens?: Int32Array | null;
}

/** Rows per sequence of the sampled outputs: 1 + the most proposals a sequence of the batch carries. */
export function sampleStrideOf(batch: Pick<ForwardBatch, 'numSeqs' | 'numDraftTokens'>): number {
  let stride = 1;
  const drafts = batch.numDraftTokens;
  if (drafts === undefined || drafts === null) return stride;
  for (let seq = 0; seq < batch.numSeqs; seq++) stride = Math.max(stride, drafts[seq] + 1);
  return stride;
}

/** The ForwardBatch fields a caller that uses none of min-p, penalties, bias or logprobs fills with neutral values. */
export type SamplingExtensions = Pick<
  ForwardBatch,
  | 'minPs'
  | 'presencePenalties'
  | 'frequencyPenalties'
  | 'repetitionPenalties'
  | 'penaltyStarts'
  | 'penaltyTokenIds'
  | 'penaltyOutputCounts'
  | 'penaltyInPrompt'
  | 'biasStarts'
  | 'biasTokenIds'
  | 'biasValues'
  | 'numTopLogprobs'
  | 'numPromptTopLogprobs'
  | 'promptNextTokenIds'
>;

/** SamplingExtensions at their neutral values for up to maxNumSeqs sequences: nothing changes the plain sampling. */
export function neutralSamplingExtensions(maxNumSeqs: number): SamplingExtensions {
  return {
    minPs: new Float32Array(maxNumSeqs),
    presencePenalties: new Float32Array(maxNumSeqs),
    frequencyPenalties: new Float32Array(maxNumSeqs),
    repetitionPenalties: new Float32Array(maxNumSeqs).fill(1),
    penaltyStarts: new Int32Array(maxNumSeqs + 1),
    penaltyTokenIds: new Int32Array(0),
    penaltyOutputCounts: new Int32Array(0),
    penaltyInPrompt: new Uint8Array(0),
    biasStarts: new Int32Array(maxNumSeqs + 1),
    biasTokenIds: new Int32Array(0),
    biasValues: new Float32Array(0),
    numTopLogprobs: new Int32Array(maxNumSeqs),
    numPromptTopLogprobs: new Int32Array(maxNumSeqs),
    promptNextTokenIds: new Int32Array(maxNumSeqs).fill(-1),
  };
}

/**
 * An empty ForwardBatch sized once for steps of up to maxNumSeqs sequences and
 * maxNumBatchedTokens tokens, with blockTableInts ints of block tables; a runner refills it each
 * step. Sampling is greedy and neutral until the runner sets it.
 */
export function emptyForwardBatch(maxNumSeqs: number, maxNumBatchedTokens: number, blockTableInts: number): ForwardBatch {
  return {
    numSeqs: 0,
    numTokens: 0,
    tokenIds: new Int32Array(maxNumBatchedTokens),
    positions: new Int32Array(maxNumBatchedTokens),
    queryStarts: new Int32Array(maxNumSeqs + 1),
    maxBlocksPerSeq: 0,
    blockTables: new Int32Array(blockTableInts),
    seqFlags: new Uint8Array(maxNumSeqs),
    temperatures: new Float32Array(maxNumSeqs),
    topPs: new Float32Array(maxNumSeqs),
    topKs: new Int32Array(maxNumSeqs),
    seeds: new BigUint64Array(maxNumSeqs),
    outputIndices: new Int32Array(maxNumSeqs),
    ...neutralSamplingExtensions(maxNumSeqs),
  };
}

/**
 * The sampled outputs hold sampleStrideOf(batch) rows per sequence (1 without proposals): row
 * seq * stride + j is sequence seq's j-th sample, at output index outputIndices[seq] + j.
 */
export interface ForwardResult {
  /** [numSeqs * stride]; -1 where the sequence did not sample. */
  sampledTokenIds: Int32Array;
  /** [numSeqs * stride] log-probability of the sampled token under the unmodified distribution. */
  sampledLogprobs: Float32Array;
  /** [numLogitSeqs * vocabSize] raw (unprocessed) logits of the sequences flagged SEQ_RETURN_LOGITS, in batch order. */
  logits: Float32Array;
  /**
   * [numSeqs * stride * MAX_TOP_LOGPROBS]: a sampled row starts with its sequence's
   * numTopLogprobs[seq] most likely tokens under the raw logits, descending, ties to the lower id;
   * the rest of every row is -1.
   */
  topTokenIds: Int32Array;
  /** [numSeqs * stride * MAX_TOP_LOGPROBS] the raw log-softmax at topTokenIds; NaN where the id is -1. */
  topLogprobs: Float32Array;
  /**
   * [numSeqs] with numDraftTokens, else empty: the proposals each sequence accepted. Its rows 0 ..
   * that count are sampled (the accepted proposals, then the sample that ended it): the tokens it
   * outputs.
   */
  numAcceptedTokens: Int32Array;
  /**
   * [numTokens] when some sequence is flagged SEQ_PROMPT_LOGPROBS, else empty. At a flagged
   * sequence's token, the raw log-probability of the next known token (the chunk's next token, or
   * promptNextTokenIds after its last); NaN where there is none or the sequence is not flagged.
   */
  promptLogprobs: Float32Array;
  /**
   * [numTokens * MAX_TOP_LOGPROBS] when some flagged sequence asks for numPromptTopLogprobs > 0,
   * else empty. Row t holds the top alternatives at token t wherever promptLogprobs[t] is reported,
   * in the order of topTokenIds; -1 elsewhere.
   */
  promptTopTokenIds: Int32Array;
  /** Shaped like promptTopTokenIds: the raw log-softmax at its ids; NaN where the id is -1. */
  promptTopLogprobs: Float32Array;
  /**
   * Shaped like promptLogprobs: the next token's rank under the raw logits, 1 + the tokens that
   * come before it in topTokenIds' order (a larger logit, or an equal one with a lower id); 0 where
   * promptLogprobs is NaN. vLLM reports it beside each prompt logprob.
   */
  promptRanks: Int32Array;
}

export interface NativeModel {
  readonly info: ModelInfo;
  /**
   * Runs off the event loop on the runtime's own threads; rejects on error. One call at a time.
   * The result and its arrays may be the model's own, written again by its next forward(): copy
   * (slice()) what must outlive that call.
   */
  forward(batch: ForwardBatch): Promise<ForwardResult>;
  /**
   * How many of the pool's threads CPU passes use from now on (0: all), a pass in flight included:
   * the pool reads it at each parallel op. Outputs are bitwise the same whatever the count. It
   * stores into activeThreadsCell, where there is one.
   */
  setActiveThreads(numThreads: number): void;
  /**
   * The cell (over a SharedArrayBuffer) the pool reads its active thread count from: a store
   * there from any thread (a grammar thread whose compile ends) is setActiveThreads. Absent where
   * the count means nothing (a device model, a wrapper).
   */
  readonly activeThreadsCell?: Int32Array;
  /** Unmaps weights and frees the KV cache. */
  close(): void;
}
