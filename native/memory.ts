// What a load will hold in memory, known from the spec before C++ allocates anything, and what
// the machine can give: a checkpoint that cannot fit is refused with both figures instead of
// meeting the OOM killer halfway through packing.
//
// The weights' memory (native/src/model.cc, weights.cc): every matrix is repacked once into the
// kernels' 64-column panels (bf16/fp16/fp32 as the weight dtype, or int8 blocks: quantization
// int8, and MXFP4 experts), and the file's pages are dropped as each is packed, so the peak is
// the packed size, not twice it. Tensors used as the file stores them are borrowed from the
// mapping rather than copied: the embedding table when its dtype is the weight dtype (a
// gather reads a row per token), and fp32 norm weights and biases. Borrowed bytes are file pages
// the kernel may evict and read back, so they are reported but not counted as needed.
import { readFileSync } from 'node:fs';
import os from 'node:os';
import type { Quantization, WeightDtype } from './api.ts';
import type { ModelSpec, TensorRef } from './checkpoint.ts';
import { isBlockEncoding } from './checkpoint-reader.ts';

const DTYPE_BYTES: Readonly<Record<WeightDtype, number>> = { fp32: 4, bf16: 2, fp16: 2 };
const PANEL_COLUMNS = 64;
const Q8_PANEL_BLOCK_BYTES = PANEL_COLUMNS * 32 + PANEL_COLUMNS * 2;
/** native/src/row_parallel.h: o_proj and a dense down_proj are packed as this many column ranges. */
const REDUCTION_SEGMENTS = 8;
const HUGE_PAGE_BYTES = 2 * 2 ** 20;
const ARENA_SLAB_BYTES = 16 * HUGE_PAGE_BYTES;

/**
 * native/src/huge_pages.h's MatrixArena, allocation by allocation in the loader's order: a matrix
 * of a huge page or more gets a buffer of its own, smaller ones fill 32 MiB slabs one after
 * another, and a slab that cannot take the next matrix is left with its tail unused (on huge
 * pages, resident all the same).
 */
class ArenaModel {
  bytes = 0;
  slabTailBytes = 0;
  private slabBytesLeft = 0;

  allocate(sizeBytes: number): void {
    const rounded = sizeBytes === 0 ? 64 : Math.ceil(sizeBytes / 64) * 64;
    this.bytes += rounded;
    if (rounded >= HUGE_PAGE_BYTES) return;
    if (rounded > this.slabBytesLeft) {
      this.slabTailBytes += this.slabBytesLeft;
      this.slabBytesLeft = ARENA_SLAB_BYTES;
    }
    this.slabBytesLeft -= rounded;
  }
}

export interface LoadFootprint {
  /** Weights copied into the kernels' formats (panels, int8 blocks, fp32 vectors), slab tails included. */
  packedBytes: number;
  /** Of packedBytes, what the matrix arena's full slabs leave unused at their ends. */
  slabTailBytes: number;
  /** Weights used in place from the mapped files. */
  borrowedBytes: number;
  kvCacheBytes: number;
  /** What the load needs resident: packed weights plus the KV cache. */
  neededBytes: number;
}

function panelBytes(numRows: number, k: number, dtype: WeightDtype): number {
  const inputs = dtype === 'bf16' ? Math.ceil(k / 2) * 2 : k;
  return Math.ceil(numRows / PANEL_COLUMNS) * PANEL_COLUMNS * inputs * DTYPE_BYTES[dtype];
}

function q8PanelBytes(numRows: number, k: number): number {
  return Math.ceil(numRows / PANEL_COLUMNS) * Math.ceil(k / 32) * Q8_PANEL_BLOCK_BYTES;
}

/** kQ4Panels: per 64 columns and 32 inputs, 1 KiB of codes and 64 fp32 scales and mins. */
function q4PanelBytes(numRows: number, k: number): number {
  return Math.ceil(numRows / PANEL_COLUMNS) * Math.ceil(k / 32) * (PANEL_COLUMNS * 16 + PANEL_COLUMNS * 8);
}

/** A tensor-parallel rank's place in its group; rank 0 of 1 holds the whole model. */
export interface RankShare {
  rank: number;
  size: number;
}

const WHOLE_MODEL: RankShare = { rank: 0, size: 1 };

/** native/src/model.cc's shard_of: with fewer KV heads than ranks, each rank holds a copy of one. */
export function kvHeadsPerRank(numKvHeads: number, size: number): number {
  return numKvHeads >= size ? numKvHeads / size : 1;
}

/**
 * native/src/model.cc's choices, weight by weight, for one rank: column-parallel rows (q/k/v,
 * gate/up, the LM head's vocabulary slice), the row-parallel matrices' reduction segments
 * (o_proj, down_proj), whole experts of its own, and everything else replicated.
 */
export function loadFootprint(
  spec: ModelSpec,
  dtype: WeightDtype,
  quantization: Quantization,
  kvCacheBytes: number,
  share: RankShare = WHOLE_MODEL,
): LoadFootprint {
  let packed = 0;
  let borrowed = 0;
  const arena = new ArenaModel();
  const matrix = (ref: TensorRef, numRows: number, k: number) => {
    const ggml4Bit = ref.encoding === 'q4_0' || ref.encoding === 'q4_k';
    if (quantization === 'int4' || (ggml4Bit && dtype !== 'fp32')) {
      arena.allocate(q4PanelBytes(numRows, k));
      return;
    }
    const int8 = quantization === 'int8' || (isBlockEncoding(ref) && dtype !== 'fp32');
    arena.allocate(int8 ? q8PanelBytes(numRows, k) : panelBytes(numRows, k, dtype));
  };
  const { rank, size } = share;
  const segmented = (ref: TensorRef, numRows: number, k: number) => {
    const endSegment = Math.floor(((rank + 1) * REDUCTION_SEGMENTS) / size);
    for (let s = Math.floor((rank * REDUCTION_SEGMENTS) / size); s < endSegment; ++s) {
      const segmentK = Math.floor((k * (s + 1)) / REDUCTION_SEGMENTS) - Math.floor((k * s) / REDUCTION_SEGMENTS);
      if (segmentK > 0) matrix(ref, numRows, segmentK);
    }
  };
  const vector = (ref: TensorRef | null, n: number) => {
    if (ref === null || ref.sizeBytes === 0) return;
    const inPlace = ref.dtype === 'fp32' && !isBlockEncoding(ref) && (ref.rowStride ?? 1) === 1 && ref.rotaryPermutedHeadDim === undefined;
    if (inPlace) borrowed += n * 4;
    else packed += n * 4;
  };
  const { hiddenSize: hidden, headDim, numHeads, numKvHeads, vocabSize } = spec;
  const rankHeads = numHeads / size;
  const qSize = rankHeads * headDim;
  const kvSize = kvHeadsPerRank(numKvHeads, size) * headDim;
  const mlpSize = spec.intermediateSize / size;
  const vocabOf = (r: number) => Math.floor((vocabSize * r) / size);
  const expertOf = (r: number, numExperts: number) => Math.floor((numExperts * r) / size);
  const embeddingBytes = vocabSize * hidden * DTYPE_BYTES[dtype];
  if (spec.embedTokens.dtype === dtype && !isBlockEncoding(spec.embedTokens)) borrowed += embeddingBytes;
  else packed += embeddingBytes;
  matrix(spec.lmHead, vocabOf(rank + 1) - vocabOf(rank), hidden);
  vector(spec.finalNorm, hidden);
  for (const layer of spec.layers) {
    matrix(layer.qProj, qSize, hidden);
    matrix(layer.kProj, kvSize, hidden);
    matrix(layer.vProj, kvSize, hidden);
    segmented(layer.oProj, hidden, numHeads * headDim);
    for (const [ref, n] of [
      [layer.inputNorm, hidden], [layer.qBias, qSize], [layer.kBias, kvSize], [layer.vBias, kvSize], [layer.qNorm, headDim],
      [layer.kNorm, headDim], [layer.sinks, rankHeads], [layer.oBias, hidden], [layer.attentionOutputNorm, hidden],
      [layer.ffnNorm, hidden], [layer.ffnOutputNorm, hidden],
    ] as const) {
      vector(ref, n);
    }
    if (layer.experts === null) {
      matrix(layer.gateProj!, mlpSize, hidden);
      matrix(layer.upProj!, mlpSize, hidden);
      segmented(layer.downProj!, hidden, spec.intermediateSize);
      continue;
    }
    arena.allocate(panelBytes(layer.experts.length, hidden, 'fp32'));
    vector(layer.routerBias, layer.experts.length);
    const width = spec.moeIntermediateSize;
    const firstHeld = expertOf(rank, layer.experts.length);
    const endHeld = expertOf(rank + 1, layer.experts.length);
    for (const [e, expert] of layer.experts.entries()) {
      if (e >= firstHeld && e < endHeld) {
        matrix(expert.gateProj, width, hidden);
        matrix(expert.upProj, width, hidden);
        matrix(expert.downProj, hidden, width);
      }
      vector(expert.gateBias, width);
      vector(expert.upBias, width);
      vector(expert.downBias, hidden);
    }
  }
  packed += arena.bytes + arena.slabTailBytes;
  return { packedBytes: packed, slabTailBytes: arena.slabTailBytes, borrowedBytes: borrowed, kvCacheBytes, neededBytes: packed + kvCacheBytes };
}

/** What several ranks loading on one machine hold together. */
export function sumFootprints(footprints: readonly LoadFootprint[]): LoadFootprint {
  const sum = (field: keyof LoadFootprint) => footprints.reduce((total, footprint) => total + footprint[field], 0);
  return {
    packedBytes: sum('packedBytes'),
    slabTailBytes: sum('slabTailBytes'),
    borrowedBytes: sum('borrowedBytes'),
    kvCacheBytes: sum('kvCacheBytes'),
    neededBytes: sum('neededBytes'),
  };
}

/**
 * The ranks of a tensor-parallel group that load on this machine, all at once and each seeing the
 * same free memory. A shared-memory group's ranks are all here. An MPI job's may span machines:
 * Open MPI (OMPI_COMM_WORLD_LOCAL_*) and MPICH's Hydra (MPI_LOCAL*) tell each rank how many share
 * its node and its place among them, and both launchers place consecutive ranks on a node by
 * default; without them every rank is counted, as if the job ran on one machine.
 */
export function ranksOnThisMachine(share: RankShare, mpi: boolean, env: NodeJS.ProcessEnv = process.env): number[] {
  const all = Array.from({ length: share.size }, (_, rank) => rank);
  if (!mpi) return all;
  const localSize = Number(env.OMPI_COMM_WORLD_LOCAL_SIZE ?? env.MPI_LOCALNRANKS);
  const localRank = Number(env.OMPI_COMM_WORLD_LOCAL_RANK ?? env.MPI_LOCALRANKID);
  const first = share.rank - localRank;
  if (!Number.isSafeInteger(localSize) || !Number.isSafeInteger(localRank) || first < 0 || first + localSize > share.size) return all;
  return all.slice(first, first + localSize);
}

export interface AvailableMemory {
  bytes: number;
  /** Where the figure comes from, for the message. */
  source: string;
}

function readNumber(file: string, pattern: RegExp): number | null {
  try {
    const match = pattern.exec(readFileSync(file, 'utf8'));
    return match === null ? null : Number(match[1]);
  } catch {
    return null;
  }
}

/** The path of this process's cgroup v2 directory, or null. */
function cgroupDir(): string | null {
  try {
    const line = readFileSync('/proc/self/cgroup', 'utf8').split('\n').find((entry) => entry.startsWith('0::'));
    return line === undefined ? null : `/sys/fs/cgroup${line.slice(3)}`;
  } catch {
    return null;
  }
}

/**
 * What a load may take now: MemAvailable (free memory plus the page cache the kernel can
 * reclaim), or, when this process's cgroup sets memory.max, that limit less the cgroup's usage,
 * whichever is smaller. os.freemem() where /proc is absent.
 */
export function availableMemory(): AvailableMemory {
  const meminfoKiB = readNumber('/proc/meminfo', /^MemAvailable:\s+(\d+) kB$/m);
  let best: AvailableMemory =
    meminfoKiB === null ? { bytes: os.freemem(), source: 'os.freemem()' } : { bytes: meminfoKiB * 1024, source: 'MemAvailable in /proc/meminfo' };
  const dir = cgroupDir();
  if (dir !== null) {
    const limit = readNumber(`${dir}/memory.max`, /^(\d+)$/m);
    const usage = readNumber(`${dir}/memory.current`, /^(\d+)$/m);
    if (limit !== null && usage !== null && limit - usage < best.bytes) {
      best = { bytes: Math.max(0, limit - usage), source: `memory.max less memory.current in ${dir}` };
    }
  }
  return best;
}

function gib(bytes: number): string {
  return `${(bytes / 2 ** 30).toFixed(bytes < 2 ** 30 ? 3 : 1)} GiB`;
}

/** A message that says how much the load needs and how much there is, or null when it fits. */
export function memoryShortfall(
  modelDir: string,
  footprint: LoadFootprint,
  available: AvailableMemory,
  formats: { dtype: WeightDtype; quantization: Quantization },
  numRanksHere = 1,
): string | null {
  if (footprint.neededBytes <= available.bytes) return null;
  const weights = formats.quantization === 'none' ? `${formats.dtype} panels` : `${formats.quantization} blocks`;
  const ranks = numRanksHere === 1 ? '' : `for the ${numRanksHere} tensor-parallel ranks on this machine `;
  return (
    `${modelDir}: loading needs about ${gib(footprint.neededBytes)} of memory ${ranks}` +
    `(weights ${gib(footprint.packedBytes)} as ${weights}, KV cache ${gib(footprint.kvCacheBytes)}; ` +
    `another ${gib(footprint.borrowedBytes)} is read from the mapped files as needed), ` +
    `but only ${gib(available.bytes)} is available (${available.source}). ` +
    'Quantize the weights (int8), shrink the KV cache, or use a machine with more memory.'
  );
}
