// The native runtime's TypeScript face: the only module that loads the .node addon. It checks
// options and batches, hands C++ plain data, and turns native failures into Errors that carry
// the caller's stack and a stable `code`.
import { createRequire } from 'node:module';
import path from 'node:path';
import { packageRoot } from '../package-root.ts';
import type {
  Device,
  DtypeSetting,
  ForwardBatch,
  ForwardResult,
  KernelPath,
  LoadOptions,
  MatrixFormat,
  ModelInfo,
  NativeModel,
  Quantization,
  TensorParallelOptions,
  WeightDtype,
} from './api.ts';
import { MAX_TOP_LOGPROBS, SEQ_PROMPT_LOGPROBS, SEQ_RETURN_LOGITS, sampleStrideOf } from './api.ts';
import { readCheckpoint, type ModelSpec } from './checkpoint.ts';
import { validateForwardBatch } from './forward-batch.ts';
import { availableMemory, kvHeadsPerRank, loadFootprint, memoryShortfall, ranksOnThisMachine, sumFootprints } from './memory.ts';

type ConcreteKernel = Exclude<KernelPath, 'auto'>;

interface ModelHandle {
  readonly __brand: 'ModelHandle';
}

/** The surface of native/src/binding.cc. */
interface Binding {
  loadModel(
    spec: ModelSpec,
    options: {
      weightDtype: WeightDtype;
      quantization: Quantization;
      kvCacheDtype: WeightDtype;
      numKvBlocks: number;
      blockSizeTokens: number;
      numThreads: number;
      kernel: KernelPath;
      device: Device;
      deviceIndex: number;
      tensorParallel?: TensorParallelOptions & { connectTimeoutMs: number };
    },
  ): Promise<{ handle: ModelHandle; kernel: ConcreteKernel; kvBytesPerBlock: number; numaNode: number }>;
  /** values: the batch's fields, then the outputs, in forwardFieldKeys() order. */
  forward(handle: ModelHandle, batch: ForwardBatch, outputs: ForwardResult, ...values: unknown[]): Promise<void>;
  forwardFieldKeys(): [string[], string[]];
  freeModel(handle: ModelHandle): void;
  serveRank(handle: ModelHandle): Promise<void>;
  collectiveNs(handle: ModelHandle): number;
  matrixFormats(handle: ModelHandle): string;
  setActiveThreads(handle: ModelHandle, cell: Int32Array): void;
  kernelSupported(kernel: KernelPath): boolean;
  cudaDeviceCount(): { count: number; reason: string };
  probeStreamRead(sizeBytes: number, numThreads: number, numRepeats: number): number;
  probePeak(kernel: KernelPath, numThreads: number): number;
  probeThreadHandoff(numThreads: number, numCalls: number): ThreadHandoff;
  probeMatmul(probe: MatmulProbe): number;
  chainBlockHashes(parentHash: Uint8Array, tokenIds: Int32Array, blockSizeTokens: number, numBlocks: number, hashes: Uint8Array): void;
}

/** One parallel matmul [numRows, k] × [n, k]ᵀ of random weights, split as a forward pass splits it. */
export interface MatmulProbe {
  kernel: Exclude<KernelPath, 'auto'>;
  dtype: WeightDtype;
  quantization: Quantization;
  numRows: number;
  k: number;
  n: number;
  numThreads: number;
  numRepeats: number;
}

const binding = createRequire(import.meta.url)(path.join(packageRoot, 'native', 'build', 'Release', 'conduit_native.node')) as Binding;
/**
 * ForwardBatch's and ForwardResult's fields in the order binding.forward() takes their values
 * (native/src/batch_fields.h): positional arguments, not some forty reads by name in C++.
 */
const [FORWARD_BATCH_KEYS, FORWARD_OUTPUT_KEYS] = binding.forwardFieldKeys() as [Array<keyof ForwardBatch>, Array<keyof ForwardResult>];

const DTYPE_SETTINGS: readonly DtypeSetting[] = ['auto', 'fp32', 'bf16', 'fp16'];
const KERNEL_PATHS: readonly KernelPath[] = ['auto', 'amx', 'avx512', 'avx2', 'scalar'];
const QUANTIZATIONS: readonly Quantization[] = ['none', 'int8', 'int4'];
const DEVICES: readonly Device[] = ['cpu', 'cuda'];
const TP_SIZES: readonly number[] = [1, 2, 4, 8];
const DEFAULT_CONNECT_TIMEOUT_MS = 600_000;
const MAX_THREADS = 1024;

/** Bytes of one block hash (engine/kv/block-hash.ts): SHA-256 truncated to 128 bits. */
export const BLOCK_HASH_BYTES = 16;

/**
 * Writes numBlocks chained block hashes into hashes (BLOCK_HASH_BYTES each): block i holds
 * tokenIds[i * blockSizeTokens, (i + 1) * blockSizeTokens) and follows block i - 1, the first
 * parentHash. The layout is engine/kv/block-hash.ts's.
 */
export function chainBlockHashes(
  parentHash: Uint8Array,
  tokenIds: Int32Array,
  blockSizeTokens: number,
  numBlocks: number,
  hashes: Uint8Array,
): void {
  if (
    parentHash.length !== BLOCK_HASH_BYTES ||
    !Number.isInteger(blockSizeTokens) ||
    blockSizeTokens < 1 ||
    !Number.isInteger(numBlocks) ||
    numBlocks < 0 ||
    tokenIds.length < numBlocks * blockSizeTokens ||
    hashes.length < numBlocks * BLOCK_HASH_BYTES
  ) {
    throw new RangeError(`chainBlockHashes: ${numBlocks} blocks of ${blockSizeTokens} tokens do not fit the arrays given`);
  }
  binding.chainBlockHashes(parentHash, tokenIds, blockSizeTokens, numBlocks, hashes);
}

/** Whether this CPU (and build) can run a kernel path; `auto` always can. */
export function kernelSupported(kernel: KernelPath): boolean {
  return binding.kernelSupported(kernel);
}

/**
 * The CUDA devices this build and machine can use, opening the CUDA plugin on first call: their
 * number, or 0 with the reason (no plugin in this build, cudaErrorInsufficientDriver, no device).
 */
export function cudaDevices(): { count: number; reason: string | null } {
  const { count, reason } = binding.cudaDeviceCount();
  return count > 0 ? { count, reason: null } : { count: 0, reason };
}

/** A thread pool's hand-off costs: its wake-up latency measured at start, and one call between polling threads. */
export interface ThreadHandoff {
  wakeLatencyNs: number;
  callNs: number;
}

/**
 * Benchmark probes for tools/bench-native.ts; they block the event loop while they run. They
 * need an x86-64 CPU with AVX2 at least (they throw CD_ERR_UNSUPPORTED_KERNEL otherwise).
 */
export const probes = {
  /** Best streaming-read bandwidth (bytes/s) of numThreads threads over a sizeBytes buffer. */
  streamReadBytesPerSecond: (sizeBytes: number, numThreads: number, numRepeats: number): number =>
    binding.probeStreamRead(sizeBytes, numThreads, numRepeats),
  /** A kernel path's multiply-add ceiling (flops/s) on numThreads threads, each on its own CPU time (neighbours' load does not lower it): the TDPBF16PS peak for amx, the vdpbf16ps peak for avx512, the fp32 FMA peak for avx2. */
  peakFlopsPerSecond: (kernel: 'amx' | 'avx512' | 'avx2', numThreads: number): number => binding.probePeak(kernel, numThreads),
  /** A pool of numThreads threads: its measured wake-up latency and the mean time of one call of numThreads empty tasks. */
  threadHandoff: (numThreads: number, numCalls: number): ThreadHandoff => binding.probeThreadHandoff(numThreads, numCalls),
  /** Best seconds of one matmul call over numRepeats, after a warm-up. */
  matmulSeconds: (probe: MatmulProbe): number => binding.probeMatmul(probe),
};

/** Re-throws a native rejection with the message and code on an Error whose stack is the caller's. */
function rethrowWithStack(err: unknown, callSite: Error): never {
  const native = err as Error & { code?: string };
  const frames = callSite.stack?.slice(callSite.stack.indexOf('\n')) ?? '';
  callSite.message = native.message;
  callSite.stack = `Error: ${native.message}${frames}`;
  throw Object.assign(callSite, { code: native.code });
}

function checkOption(field: string, ok: boolean, expected: string, value: unknown): void {
  if (!ok) throw new RangeError(`LoadOptions.${field}: expected ${expected}, got ${JSON.stringify(value)}`);
}

/** The group of MPI_COMM_WORLD: ranks an MPI launcher (mpiexec) started, on one machine or several. */
export const MPI_GROUP = 'mpi:';

/**
 * Before the MPI library starts (MPI_Init_thread, on a loader thread): UCX, which MPICH runs over,
 * otherwise hooks the process's mmap/munmap and malloc to track memory for RDMA registration,
 * patching them while node's threads allocate; its ranks then crashed in V8's allocator (4 of 28
 * loaded runs of the MPI test failed, 1 of 62 with the hooks off). Set here, on the main
 * thread, and only where the user has not chosen: a cluster whose RDMA transport wants the hooks
 * sets them back in the environment.
 */
function leaveNodesMemoryToNode(): void {
  process.env.UCX_MEM_MMAP_HOOK_MODE ??= 'none';
  process.env.UCX_MEM_MALLOC_HOOKS ??= 'no';
}

/** The group of device cuda's ranks: one process drives every GPU, so the name opens no segment. */
export const GPU_GROUP = 'cuda';

function validateLoadOptions(options: LoadOptions): void {
  checkOption('modelDir', typeof options.modelDir === 'string' && options.modelDir !== '', 'a directory path', options.modelDir);
  checkOption('dtype', DTYPE_SETTINGS.includes(options.dtype), DTYPE_SETTINGS.join(' | '), options.dtype);
  checkOption('kvCacheDtype', DTYPE_SETTINGS.includes(options.kvCacheDtype), DTYPE_SETTINGS.join(' | '), options.kvCacheDtype);
  checkOption('kernel', KERNEL_PATHS.includes(options.kernel), KERNEL_PATHS.join(' | '), options.kernel);
  const tp = options.tensorParallel;
  if (tp !== undefined) {
    checkOption('tensorParallel.size', TP_SIZES.includes(tp.size), TP_SIZES.join(' | '), tp.size);
    checkOption('tensorParallel.rank', Number.isSafeInteger(tp.rank) && tp.rank >= 0 && tp.rank < tp.size, `an integer in [0, ${tp.size})`, tp.rank);
    checkOption('tensorParallel.group', typeof tp.group === 'string' && (tp.group === MPI_GROUP || /^[A-Za-z0-9._-]{1,200}$/.test(tp.group)), `a name of [A-Za-z0-9._-], or ${MPI_GROUP}`, tp.group);
    if (tp.rankPids !== undefined) {
      checkOption('tensorParallel.rankPids', tp.rank === 0 && tp.rankPids.length === tp.size - 1 && tp.rankPids.every((pid) => Number.isSafeInteger(pid) && pid > 0), `rank 0's ${tp.size - 1} rank pids`, tp.rankPids);
    }
    if (tp.connectTimeoutMs !== undefined) {
      checkOption('tensorParallel.connectTimeoutMs', Number.isSafeInteger(tp.connectTimeoutMs) && tp.connectTimeoutMs >= 1 && tp.connectTimeoutMs <= 2 ** 31 - 1, 'a positive integer', tp.connectTimeoutMs);
    }
  }
  checkOption('device', DEVICES.includes(options.device ?? 'cpu'), DEVICES.join(' | '), options.device);
  if (options.device === 'cuda') checkGpuDtypes(options);
  if (options.deviceIndex !== undefined) {
    checkOption('deviceIndex', Number.isSafeInteger(options.deviceIndex) && options.deviceIndex >= 0 && options.deviceIndex <= 2 ** 31 - 1, 'a device index', options.deviceIndex);
  }
  const quantization = options.quantization ?? 'none';
  checkOption('quantization', QUANTIZATIONS.includes(quantization), QUANTIZATIONS.join(' | '), options.quantization);
  if (options.maxModelLen !== undefined) {
    checkOption('maxModelLen', Number.isSafeInteger(options.maxModelLen) && options.maxModelLen >= 1, 'a positive integer', options.maxModelLen);
  }
  for (const field of ['numKvBlocks', 'blockSizeTokens', 'numThreads'] as const) {
    const value = options[field];
    checkOption(field, Number.isSafeInteger(value) && value >= 1 && value <= 2 ** 31 - 1, 'a positive integer', value);
  }
  if (options.memoryLimitBytes !== undefined) {
    checkOption('memoryLimitBytes', options.memoryLimitBytes >= 0, 'a number of bytes (Infinity for no limit)', options.memoryLimitBytes);
  }
  checkOption('numThreads', options.numThreads <= MAX_THREADS, `at most ${MAX_THREADS} threads`, options.numThreads);
  // amx is refused by the runtime itself, which says why (no AMX, or the OS's refusal of the tile state).
  if (options.kernel !== 'amx' && !binding.kernelSupported(options.kernel)) {
    const error = new Error(`LoadOptions.kernel: '${options.kernel}' is not supported by this CPU`);
    throw Object.assign(error, { code: 'CD_ERR_UNSUPPORTED_KERNEL' });
  }
}

const DTYPE_BYTES: Readonly<Record<WeightDtype, number>> = { fp32: 4, bf16: 2, fp16: 2 };

/**
 * What one KV block will take once the checkpoint loads with these dtypes, and its KV-cache
 * groups, from config.json and the safetensors headers alone: a worker sizes its cache in blocks
 * before it loads. The runtime's layout (native/README.md): a block holds layersPerKvBlock layers
 * of one group, K and V for every KV head a rank holds (kvHeadsPerRank of a tensor-parallel
 * group of tensorParallelSize: each rank, CPU or GPU, caches only its own heads), slot and head dim.
 */
export function describeKvCache(
  modelDir: string,
  dtype: DtypeSetting,
  kvCacheDtype: DtypeSetting,
  blockSizeTokens: number,
  tensorParallelSize = 1,
): { bytesPerBlock: number; groups: ModelInfo['kvCacheGroups'] } {
  const checkpoint = readCheckpoint(modelDir);
  const weightDtype = dtype === 'auto' ? checkpoint.storedDtype : dtype;
  const cacheDtype = kvCacheDtype === 'auto' ? weightDtype : kvCacheDtype;
  const { spec, kvGroups } = checkpoint;
  return {
    bytesPerBlock:
      2 * kvGroups.layersPerBlock * kvHeadsPerRank(spec.numKvHeads, tensorParallelSize) * spec.headDim * blockSizeTokens *
      DTYPE_BYTES[cacheDtype],
    groups: kvGroups.groups.map((group) => ({
      slidingWindowTokens: group.slidingWindowTokens === 0 ? null : group.slidingWindowTokens,
      numLayers: group.layers.length,
    })),
  };
}

/**
 * Loads a Hugging Face checkpoint directory. Rejects, naming the file and field, on an
 * unsupported architecture, a missing or misshapen tensor, a truncated file or a bad index.
 */
export async function loadModel(options: LoadOptions): Promise<LoadedModel> {
  const callSite = new Error();
  validateLoadOptions(options);
  const checkpoint = readCheckpoint(options.modelDir, { maxModelLen: options.maxModelLen });
  if (options.tensorParallel !== undefined) checkTensorParallelShape(options.tensorParallel.size, checkpoint.spec);
  // The CUDA backend runs bf16 (and int8) weights: `auto` means bf16 there.
  const onGpu = options.device === 'cuda';
  const dtype = options.dtype === 'auto' ? (onGpu ? 'bf16' : checkpoint.storedDtype) : options.dtype;
  const kvCacheDtype = options.kvCacheDtype === 'auto' ? dtype : options.kvCacheDtype;
  const quantization = options.quantization ?? 'none';
  // Weights on the GPU are checked by the device's allocations (CD_ERR_OUT_OF_MEMORY naming them).
  if (!onGpu) checkMemory(options, checkpoint.spec, dtype, kvCacheDtype, quantization);
  if (options.tensorParallel?.group === MPI_GROUP) leaveNodesMemoryToNode();
  const loaded = await binding
    .loadModel(checkpoint.spec, {
      weightDtype: dtype,
      quantization,
      kvCacheDtype,
      numKvBlocks: options.numKvBlocks,
      blockSizeTokens: options.blockSizeTokens,
      numThreads: options.numThreads,
      kernel: options.kernel,
      device: options.device ?? 'cpu',
      deviceIndex: options.deviceIndex ?? 0,
      ...(options.tensorParallel === undefined
        ? {}
        : { tensorParallel: { connectTimeoutMs: DEFAULT_CONNECT_TIMEOUT_MS, ...options.tensorParallel } }),
    })
    .catch((err: unknown) => rethrowWithStack(err, callSite));
  const { spec } = checkpoint;
  const info: ModelInfo = {
    architecture: checkpoint.architecture,
    numLayers: spec.numLayers,
    hiddenSize: spec.hiddenSize,
    intermediateSize: spec.intermediateSize,
    numHeads: spec.numHeads,
    numKvHeads: spec.numKvHeads,
    headDim: spec.headDim,
    vocabSize: spec.vocabSize,
    numExperts: spec.numExperts,
    numExpertsPerToken: spec.numExpertsPerToken,
    maxPositionEmbeddings: checkpoint.maxPositionEmbeddings,
    slidingWindowTokens: sharedWindowOf(spec),
    kvCacheGroups: checkpoint.kvGroups.groups.map((group) => ({
      slidingWindowTokens: group.slidingWindowTokens === 0 ? null : group.slidingWindowTokens,
      numLayers: group.layers.length,
    })),
    layersPerKvBlock: checkpoint.kvGroups.layersPerBlock,
    tieWordEmbeddings: checkpoint.tieWordEmbeddings,
    dtype,
    kvCacheDtype,
    kernel: loaded.kernel,
    quantization,
    numKvBlocks: options.numKvBlocks,
    blockSizeTokens: options.blockSizeTokens,
    kvBytesPerBlock: loaded.kvBytesPerBlock,
    numThreads: options.numThreads,
  };
  return new LoadedModel(loaded.handle, Object.freeze(info), loaded.numaNode);
}

/**
 * The CUDA backend computes in bf16 (bf16 activations into tensor-core GEMMs, a bf16 KV cache).
 * An fp16 or fp32 checkpoint loads there with dtype `auto` or `bf16`, converted at load as the
 * CPU's `dtype: bf16` converts it (vLLM's `auto` likewise narrows fp32 checkpoints); an explicit
 * fp16 or fp32 asks for those numerics, which the GPU does not run, so it is refused rather than
 * silently narrowed.
 */
function checkGpuDtypes(options: LoadOptions): void {
  for (const field of ['dtype', 'kvCacheDtype'] as const) {
    const value = options[field];
    if (value === 'fp16' || value === 'fp32') {
      throw new RangeError(
        `LoadOptions.${field}: '${value}' does not run on device cuda, which computes in bf16; use 'auto' or 'bf16' (an ${value} checkpoint is converted to bf16 at load)`,
      );
    }
  }
}

/**
 * A model splits over size ranks only along whole heads and MLP columns, and whole KV heads or,
 * with fewer KV heads than ranks, copies of one KV head per rank (size a multiple of them).
 */
function checkTensorParallelShape(size: number, spec: ModelSpec): void {
  const parts: [string, number][] = [
    ['num_attention_heads', spec.numHeads],
    ['intermediate_size', spec.intermediateSize],
  ];
  for (const [field, value] of parts) {
    if (value % size !== 0) {
      throw new RangeError(`LoadOptions.tensorParallel.size: ${size} does not divide the checkpoint's ${field} (${value})`);
    }
  }
  if (spec.numKvHeads % size !== 0 && size % spec.numKvHeads !== 0) {
    throw new RangeError(
      `LoadOptions.tensorParallel.size: ${size} neither divides nor is a multiple of the checkpoint's num_key_value_heads (${spec.numKvHeads})`,
    );
  }
}

/**
 * Refuses, before C++ allocates anything, a load that needs more memory than it may take: a
 * tensor-parallel rank counts the shares of every rank of its group that loads on this machine.
 */
function checkMemory(options: LoadOptions, spec: ModelSpec, dtype: WeightDtype, kvCacheDtype: WeightDtype, quantization: Quantization): void {
  const tp = options.tensorParallel;
  const size = tp?.size ?? 1;
  const bytesPerBlock =
    2 * spec.layersPerKvBlock * kvHeadsPerRank(spec.numKvHeads, size) * spec.headDim * options.blockSizeTokens * DTYPE_BYTES[kvCacheDtype];
  const ranksHere = tp === undefined ? [0] : ranksOnThisMachine({ rank: tp.rank, size }, tp.group === MPI_GROUP);
  const footprint = sumFootprints(
    ranksHere.map((rank) => loadFootprint(spec, dtype, quantization, bytesPerBlock * options.numKvBlocks, { rank, size })),
  );
  const available =
    options.memoryLimitBytes === undefined ? availableMemory() : { bytes: options.memoryLimitBytes, source: 'LoadOptions.memoryLimitBytes' };
  const message = memoryShortfall(options.modelDir, footprint, available, { dtype, quantization }, ranksHere.length);
  if (message !== null) throw Object.assign(new Error(message), { code: 'CD_ERR_OUT_OF_MEMORY' });
}

/** The window every layer shares, or null when some layer sees every position (or windows differ). */
function sharedWindowOf(spec: ModelSpec): number | null {
  const window = spec.layers[0].slidingWindowTokens;
  return window !== 0 && spec.layers.every((layer) => layer.slidingWindowTokens === window) ? window : null;
}

type OutputArray = Int32Array | Float32Array;

const OUTPUT_ARRAY_TYPES: Readonly<Record<keyof ForwardResult, Int32ArrayConstructor | Float32ArrayConstructor>> = {
  sampledTokenIds: Int32Array,
  sampledLogprobs: Float32Array,
  logits: Float32Array,
  topTokenIds: Int32Array,
  topLogprobs: Float32Array,
  numAcceptedTokens: Int32Array,
  promptLogprobs: Float32Array,
  promptTopTokenIds: Int32Array,
  promptTopLogprobs: Float32Array,
  promptRanks: Int32Array,
};

/**
 * A model's outputs, kept from pass to pass: each of the result's arrays is a view of the start of
 * a buffer that only grows, made anew only when its length changes, so a step allocates nothing
 * once the largest batch has been seen and the batch's shape holds. Nothing of the last pass shows
 * through: the runtime writes every element of every output it is handed, each pass (the -1, 0
 * and NaN of rows nothing was reported in included: forward.cc's clear_sequence_outputs and
 * produce_prompt_logprobs, and the CUDA backend's alike).
 */
class ReusedOutputs {
  readonly result = {} as ForwardResult;
  private readonly buffers = {} as Record<keyof ForwardResult, OutputArray>;

  constructor() {
    for (const key of FORWARD_OUTPUT_KEYS) {
      this.buffers[key] = new OUTPUT_ARRAY_TYPES[key](0);
      (this.result as Record<keyof ForwardResult, OutputArray>)[key] = this.buffers[key];
    }
  }

  /** Every output C++ writes, the prompt logprobs' only when some sequence asks for them (see ForwardResult). */
  fit(batch: ForwardBatch, vocabSize: number): ForwardResult {
    const { numSeqs, numTokens } = batch;
    let numLogitSeqs = 0;
    let promptLogprobTokens = 0;
    let promptTopTokens = 0;
    for (let seq = 0; seq < numSeqs; seq++) {
      if (batch.seqFlags[seq] & SEQ_RETURN_LOGITS) numLogitSeqs++;
      if (!(batch.seqFlags[seq] & SEQ_PROMPT_LOGPROBS)) continue;
      promptLogprobTokens = numTokens;
      if (batch.numPromptTopLogprobs[seq] > 0) promptTopTokens = numTokens;
    }
    const numSampleRows = numSeqs * sampleStrideOf(batch);
    const speculates = batch.numDraftTokens !== undefined && batch.numDraftTokens !== null;
    this.resize('sampledTokenIds', numSampleRows);
    this.resize('sampledLogprobs', numSampleRows);
    this.resize('logits', numLogitSeqs * vocabSize);
    this.resize('topTokenIds', numSampleRows * MAX_TOP_LOGPROBS);
    this.resize('topLogprobs', numSampleRows * MAX_TOP_LOGPROBS);
    this.resize('numAcceptedTokens', speculates ? numSeqs : 0);
    this.resize('promptLogprobs', promptLogprobTokens);
    this.resize('promptTopTokenIds', promptTopTokens * MAX_TOP_LOGPROBS);
    this.resize('promptTopLogprobs', promptTopTokens * MAX_TOP_LOGPROBS);
    this.resize('promptRanks', promptLogprobTokens);
    return this.result;
  }

  private resize(key: keyof ForwardResult, length: number): void {
    const result = this.result as Record<keyof ForwardResult, OutputArray>;
    if (result[key].length === length) return;
    let buffer = this.buffers[key];
    if (buffer.length < length) {
      buffer = new OUTPUT_ARRAY_TYPES[key](Math.max(length, 2 * buffer.length));
      this.buffers[key] = buffer;
    }
    result[key] = buffer.subarray(0, length);
  }
}

/**
 * One forward at a time: a second call while one is in flight is rejected rather than queued,
 * since the engine loop never overlaps steps and an overlap means a bug upstream.
 */
export class LoadedModel implements NativeModel {
  readonly activeThreadsCell = new Int32Array(new SharedArrayBuffer(4));
  private readonly outputs = new ReusedOutputs();
  /** binding.forward()'s field arguments, refilled every pass. */
  private readonly values: unknown[] = Array.from({ length: FORWARD_BATCH_KEYS.length + FORWARD_OUTPUT_KEYS.length }, () => null);
  private inFlight: Promise<unknown> | null = null;
  private closed = false;

  constructor(
    private readonly handle: ModelHandle,
    readonly info: ModelInfo,
    private readonly loadedNumaNode = -1,
  ) {
    binding.setActiveThreads(handle, this.activeThreadsCell);
  }

  /**
   * The result and its arrays are this model's, written again by its next forward(): a caller
   * copies what it keeps past that (NativeModel.forward).
   */
  async forward(batch: ForwardBatch): Promise<ForwardResult> {
    if (this.closed) throw new Error('forward() after close()');
    if (this.inFlight !== null) throw new Error('forward() while another forward() is in flight; one call at a time per model');
    validateForwardBatch(batch, this.info);
    const outputs = this.outputs.fit(batch, this.info.vocabSize);
    // No call-site Error per step: capturing its stack costs ~20 µs on the cache a pass leaves
    // behind (3 µs warm). A failure's stack is taken where it is caught, and V8's async stack
    // traces carry the callers that await this call.
    const { values } = this;
    let index = 0;
    for (const key of FORWARD_BATCH_KEYS) values[index++] = batch[key];
    for (const key of FORWARD_OUTPUT_KEYS) values[index++] = outputs[key];
    await this.runExclusive(binding.forward(this.handle, batch, outputs, ...values));
    return outputs;
  }

  /** A tensor-parallel rank > 0: runs rank 0's passes until rank 0 closes (resolves) or the group fails (rejects). */
  async serveRank(): Promise<void> {
    const callSite = new Error();
    if (this.closed) throw new Error('serveRank() after close()');
    if (this.inFlight !== null) throw new Error('serveRank() while another call is in flight');
    await this.runExclusive(binding.serveRank(this.handle), callSite);
  }

  /**
   * Awaits the one native call in flight; a close() that came meanwhile frees the model once it ends.
   * A rejection carries callSite's stack, or without one the stack where it is caught.
   */
  private async runExclusive(call: Promise<unknown>, callSite?: Error): Promise<void> {
    this.inFlight = call;
    try {
      await call;
    } catch (err) {
      rethrowWithStack(err, callSite ?? new Error());
    } finally {
      this.inFlight = null;
      if (this.closed) binding.freeModel(this.handle);
    }
  }

  /** The NUMA node this tensor-parallel rank's threads are pinned to; null when not pinned (one node). */
  get numaNode(): number | null {
    return this.loadedNumaNode < 0 ? null : this.loadedNumaNode;
  }

  /** Seconds this rank has spent in collectives since it loaded (waiting for peers included). */
  collectiveSeconds(): number {
    return this.closed ? 0 : binding.collectiveNs(this.handle) / 1e9;
  }

  /**
   * The format each weight matrix is held in, by name (lm_head, layers.3.q_proj, a row-parallel
   * matrix's segments as layers.3.o_proj.0 .. .7, experts as layers.3.experts.5.down_proj): what
   * the load chose for this file, these options and this rank. Empty on a GPU and after close().
   */
  matrixFormats(): Map<string, MatrixFormat> {
    const formats = new Map<string, MatrixFormat>();
    if (this.closed) return formats;
    for (const line of binding.matrixFormats(this.handle).split('\n')) {
      if (line === '') continue;
      const [name, format] = line.split(' ');
      formats.set(name!, format as MatrixFormat);
    }
    return formats;
  }

  /**
   * The CPU compute threads parallel calls use from now on (1 .. info.numThreads; anything else:
   * all), also while a forward is in flight: its next op (parallel call) follows the new count.
   * The outputs are bitwise the same whatever the count; only the speed changes.
   */
  setActiveThreads(numThreads: number): void {
    Atomics.store(this.activeThreadsCell, 0, numThreads);
  }

  /**
   * Frees at once, or as soon as the forward in flight settles. A rank of an MPI group that ended in
   * order (rank 0, or a rank whose serveRank() resolved) also ends its part of the job here: it
   * returns once every rank has closed (tensorParallel.connectTimeoutMs).
   */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    if (this.inFlight === null) binding.freeModel(this.handle);
  }
}
