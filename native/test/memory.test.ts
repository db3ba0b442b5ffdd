// Memory at load: a checkpoint that cannot fit is refused before anything is allocated, with
// what it needs and what there is; the weights the kernels use as stored (the embedding table)
// stay in the file mapping, and the rest is packed once, the file's pages dropped behind it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { writeLlamaGguf } from '../../tools/llama-gguf.ts';
import { readCheckpoint } from '../checkpoint.ts';
import { loadModel } from '../index.ts';
import { availableMemory, kvHeadsPerRank, loadFootprint, ranksOnThisMachine } from '../memory.ts';
import { loadOptions, makeTempDir, writeCheckpoint, type ShapeOptions } from './helpers.ts';

// A 70B-like layer: about 1.6 GiB of bf16 weights.
const BIG_LAYER: ShapeOptions = { arch: 'llama', hiddenSize: 8192, numHeads: 64, numKvHeads: 8, intermediateSize: 28672, vocabSize: 32000, numLayers: 1 };
const BIG_LAYER_BYTES = 2 * (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672);

function rssKiB(field: 'RssAnon' | 'RssFile'): number {
  return Number(new RegExp(`^${field}:\\s+(\\d+) kB$`, 'm').exec(readFileSync('/proc/self/status', 'utf8'))![1]);
}

test('a checkpoint larger than memory is refused at load, saying how much it needs and how much there is', async () => {
  using temp = makeTempDir('memory');
  // Twice this machine's memory, as a sparse file: zeros that cost no disk.
  const numLayers = Math.ceil((2 * os.totalmem()) / BIG_LAYER_BYTES);
  const modelDir = writeCheckpoint(temp.dir, 'huge', { ...BIG_LAYER, numLayers, zeros: true });
  const { spec } = readCheckpoint(modelDir);
  const footprint = loadFootprint(spec, 'bf16', 'none', 64 * 2 * spec.layersPerKvBlock * 8 * 128 * 16 * 2);
  assert.ok(footprint.neededBytes > 2 * os.totalmem());
  await assert.rejects(loadModel(loadOptions(modelDir)), (err: Error & { code?: string }) => {
    assert.equal(err.code, 'CD_ERR_OUT_OF_MEMORY');
    const needs = /loading needs about ([\d.]+) GiB of memory/.exec(err.message);
    assert.ok(needs !== null, err.message);
    assert.ok(Math.abs(Number(needs[1]) - footprint.neededBytes / 2 ** 30) < 0.1, err.message);
    assert.ok(err.message.startsWith(modelDir), err.message);
    assert.match(err.message, /but only [\d.]+ GiB is available \((MemAvailable in \/proc\/meminfo|memory\.max less memory\.current in .*)\)/);
    assert.match(err.message, /Quantize the weights \(int8\)/);
    assert.match(err.stack ?? '', /memory\.test\.ts/);
    return true;
  });
  // int8 blocks hold about half of bf16's bytes (32 values and a 2-byte scale per 34 bytes).
  const int8 = loadFootprint(spec, 'bf16', 'int8', 0);
  assert.ok(Math.abs(int8.packedBytes / (footprint.packedBytes - footprint.kvCacheBytes) - 34 / 64) < 0.01);
});

test('LoadOptions.memoryLimitBytes bounds what a load may take', async () => {
  using temp = makeTempDir('memory');
  const modelDir = writeCheckpoint(temp.dir, 'small', { arch: 'llama', hiddenSize: 64, numLayers: 1, numHeads: 4, numKvHeads: 2, intermediateSize: 96, vocabSize: 64 });
  const { spec } = readCheckpoint(modelDir);
  const needed = loadFootprint(spec, 'bf16', 'none', 64 * 2 * 32 * 16 * 2).neededBytes;
  await assert.rejects(loadModel(loadOptions(modelDir, { memoryLimitBytes: needed - 1 })), { code: 'CD_ERR_OUT_OF_MEMORY' });
  (await loadModel(loadOptions(modelDir, { memoryLimitBytes: needed }))).close();
  await assert.rejects(loadModel(loadOptions(modelDir, { memoryLimitBytes: -1 })), /LoadOptions\.memoryLimitBytes/);
  assert.ok(availableMemory().bytes > 0);
});

test('the embedding table stays mapped and the matrices are packed once: resident memory is the packed size', async (t) => {
  if (!/^RssAnon:/m.test(readFileSync('/proc/self/status', 'utf8'))) return t.skip('no RssAnon in /proc/self/status');
  using temp = makeTempDir('memory');
  // A 32 MiB bf16 embedding next to 32 MiB of packed lm_head and about 2 MiB of layers.
  const modelDir = writeCheckpoint(temp.dir, 'mapped', { arch: 'llama', hiddenSize: 256, numLayers: 2, numHeads: 4, numKvHeads: 2, intermediateSize: 512, vocabSize: 65536 });
  const options = loadOptions(modelDir, { numKvBlocks: 1, numThreads: 1 });
  const { spec } = readCheckpoint(modelDir);
  const footprint = loadFootprint(spec, 'bf16', 'none', 0);
  assert.equal(footprint.borrowedBytes, 65536 * 256 * 2);
  // Converting to fp32 copies the embedding: nothing of it can be used in place.
  assert.equal(loadFootprint(spec, 'fp32', 'none', 0).borrowedBytes, 0);
  const anonBefore = rssKiB('RssAnon') * 1024;
  const fileBefore = rssKiB('RssFile') * 1024;
  const model = await loadModel(options);
  try {
    const anonGrowth = rssKiB('RssAnon') * 1024 - anonBefore;
    const fileGrowth = rssKiB('RssFile') * 1024 - fileBefore;
    const mib = (bytes: number) => `${(bytes / 2 ** 20).toFixed(1)} MiB`;
    const report = `anonymous memory grew ${mib(anonGrowth)}, file pages ${mib(fileGrowth)}; packed ${mib(footprint.packedBytes)}, mapped ${mib(footprint.borrowedBytes)}`;
    t.diagnostic(report);
    assert.ok(anonGrowth > 0.9 * footprint.packedBytes && anonGrowth < footprint.packedBytes + footprint.borrowedBytes / 2, report);
    // The packed files' pages were dropped as each matrix was packed; the embedding is untouched until a token reads its row.
    assert.ok(fileGrowth < footprint.borrowedBytes / 2, report);
  } finally {
    model.close();
  }
});

// After the resident-memory test: this one's checkpoint writing leaves garbage whose collection
// would shrink that test's measurement.
test("the estimate counts the tails the matrix arena's full slabs leave unused", async () => {
  using temp = makeTempDir('memory');
  // bench:moe's layer: every matrix but q_proj (2 MiB, a buffer of its own) fills the 32 MiB slabs, in the loader's
  // order: k and v (512 KiB each), o_proj's 8 segments (256 KiB each) and the fp32 router (256 KiB), 3.25 MiB in
  // all, then per expert its gate and up as one 1.5 MiB pair and its 768 KiB down. The first slab takes 12 experts
  // and the 13th's pair (31.75 MiB) and leaves 256 KiB; the next three each take the down left over, 13 experts and
  // one more pair, and leave 512 KiB; the last 9 experts go to a fifth slab, whose rest stays free for later matrices.
  const modelDir = writeCheckpoint(temp.dir, 'moe', {
    arch: 'qwen3_moe', hiddenSize: 1024, numLayers: 1, numHeads: 16, numKvHeads: 4, headDim: 64, intermediateSize: 3072,
    moeIntermediateSize: 384, numExperts: 64, numExpertsPerToken: 8, vocabSize: 1024, zeros: true,
  });
  const { spec } = readCheckpoint(modelDir);
  const KiB = 1024;
  const footprint = loadFootprint(spec, 'bf16', 'none', 0);
  assert.equal(footprint.slabTailBytes, 256 * KiB + 3 * 512 * KiB);
  const matrixBytes = 1024 * 1024 * 2 + (2 * 512 + 8 * 256 + 256 + 192 * 768) * KiB + 1024 * 1024 * 2;
  const vectorBytes = footprint.packedBytes - footprint.slabTailBytes - matrixBytes;
  assert.ok(vectorBytes >= 0 && vectorBytes < 64 * KiB, `fp32 vectors: ${vectorBytes} bytes`);
  // int8 experts (408 KiB each) leave other tails: the estimate follows the arena, not a fixed share.
  assert.notEqual(loadFootprint(spec, 'bf16', 'int8', 0).slabTailBytes, footprint.slabTailBytes);
});

// A rank packs its share (native/src/model.cc): q/k/v, gate/up and the LM head's rows split by
// rank, o_proj's and down_proj's reduction segments split by rank, the norms whole on every rank.
// This shape's matrices are multiples of the 64-row panels at every size and fit one 32 MiB slab,
// so the arithmetic is exact.
test('a tensor-parallel rank needs its own share of the weights, and a group counts the ranks loading on this machine', async () => {
  using temp = makeTempDir('memory');
  const shape = { arch: 'llama', hiddenSize: 512, numLayers: 1, numHeads: 8, numKvHeads: 8, headDim: 64, intermediateSize: 2048, vocabSize: 4096, zeros: true } as const;
  const modelDir = writeCheckpoint(temp.dir, 'tp', shape);
  const { spec } = readCheckpoint(modelDir);
  const hidden = shape.hiddenSize;
  const matrixBytes = 2 * hidden * (4 * shape.numHeads * shape.headDim + 3 * shape.intermediateSize + shape.vocabSize);
  const normBytes = 3 * hidden * 4;
  const whole = loadFootprint(spec, 'bf16', 'none', 0);
  assert.equal(whole.packedBytes, matrixBytes + normBytes);
  for (const size of [2, 4, 8]) {
    for (let rank = 0; rank < size; ++rank) {
      const share = loadFootprint(spec, 'bf16', 'none', 0, { rank, size });
      assert.equal(share.packedBytes, matrixBytes / size + normBytes, `rank ${rank} of ${size}`);
      assert.equal(share.borrowedBytes, whole.borrowedBytes, 'the embedding stays mapped whole on every rank');
    }
  }
  // Fewer KV heads than ranks: each rank holds a copy of one.
  assert.deepEqual([kvHeadsPerRank(8, 2), kvHeadsPerRank(2, 8), kvHeadsPerRank(1, 4)], [4, 1, 1]);

  // A shared-memory group's ranks all load here: rank 1 of 2 is refused for what both need.
  const kvBytes = (size: number) => 64 * 2 * spec.layersPerKvBlock * kvHeadsPerRank(shape.numKvHeads, size) * shape.headDim * 16 * 2;
  const bothRanks = [0, 1].reduce((sum, rank) => sum + loadFootprint(spec, 'bf16', 'none', kvBytes(2), { rank, size: 2 }).neededBytes, 0);
  const tensorParallel = { size: 2, rank: 1, group: 'memory-test' };
  await assert.rejects(loadModel(loadOptions(modelDir, { memoryLimitBytes: bothRanks - 1, tensorParallel })), (err: Error & { code?: string }) => {
    assert.equal(err.code, 'CD_ERR_OUT_OF_MEMORY');
    const needs = /loading needs about ([\d.]+) GiB of memory for the 2 tensor-parallel ranks on this machine/.exec(err.message);
    assert.ok(needs !== null, err.message);
    assert.ok(Math.abs(Number(needs[1]) - bothRanks / 2 ** 30) < 1e-3, err.message);
    return true;
  });
});

test("an MPI job's ranks on this machine come from its launcher's local rank and size", () => {
  const share = { rank: 5, size: 8 };
  assert.deepEqual(ranksOnThisMachine(share, true, { OMPI_COMM_WORLD_LOCAL_SIZE: '2', OMPI_COMM_WORLD_LOCAL_RANK: '1' }), [4, 5]);
  assert.deepEqual(ranksOnThisMachine(share, true, { MPI_LOCALNRANKS: '4', MPI_LOCALRANKID: '1' }), [4, 5, 6, 7]);
  assert.deepEqual(ranksOnThisMachine(share, true, { MPI_LOCALNRANKS: '1', MPI_LOCALRANKID: '0' }), [5]);
  const all = [0, 1, 2, 3, 4, 5, 6, 7];
  // No launcher variables, or ones that do not fit the group: count every rank, as on one machine.
  assert.deepEqual(ranksOnThisMachine(share, true, {}), all);
  assert.deepEqual(ranksOnThisMachine(share, true, { OMPI_COMM_WORLD_LOCAL_SIZE: '4', OMPI_COMM_WORLD_LOCAL_RANK: '0' }), all);
  assert.deepEqual(ranksOnThisMachine(share, true, { OMPI_COMM_WORLD_LOCAL_SIZE: 'x', OMPI_COMM_WORLD_LOCAL_RANK: '1' }), all);
  // A shared-memory group is one machine whatever the environment says.
  assert.deepEqual(ranksOnThisMachine(share, false, { OMPI_COMM_WORLD_LOCAL_SIZE: '2', OMPI_COMM_WORLD_LOCAL_RANK: '1' }), all);
});

// The Q4_K weights of a model whose every matrix is under a huge page (the 125 M bench model's
// layers): packed into the arena's huge-page slabs like every other format's, not into buffers of
// their own, which the kernel gave 4 KiB pages (a page walk per 4 KiB of every weight stream).
test('GGUF Q4_K matrices smaller than a huge page are packed onto huge pages', async (t) => {
  const thpSetting = (() => {
    try {
      return readFileSync('/sys/kernel/mm/transparent_hugepage/enabled', 'utf8');
    } catch {
      return '';
    }
  })();
  if (!/\[(always|madvise)\]/.test(thpSetting)) return t.skip('no transparent huge pages on this machine');
  const anonHugeBytes = () => Number(/^AnonHugePages:\s+(\d+) kB$/m.exec(readFileSync('/proc/self/smaps_rollup', 'utf8'))?.[1] ?? 0) * 1024;
  using temp = makeTempDir('memory-q4k');
  // Each layer's matrices are 36-144 KiB as Q4_K; the eight layers hold about 4.5 MiB.
  const modelDir = writeCheckpoint(temp.dir, 'small-matrices', { arch: 'llama', hiddenSize: 256, numLayers: 8, numHeads: 4, numKvHeads: 4, intermediateSize: 1024, vocabSize: 256 });
  const gguf = path.join(temp.dir, 'model.gguf');
  writeLlamaGguf(modelDir, gguf, { matrixType: 'Q4_K' });
  const q4kBytes = 8 * (4 * 256 * 256 + 3 * 256 * 1024) * (144 / 256);
  const before = anonHugeBytes();
  const model = await loadModel(loadOptions(gguf, { numKvBlocks: 1, numThreads: 1 }));
  try {
    const grown = anonHugeBytes() - before;
    // All of it but the huge page the last matrices may end inside.
    assert.ok(grown >= q4kBytes - 2 ** 21, `huge pages grew ${(grown / 2 ** 20).toFixed(1)} MiB for ${(q4kBytes / 2 ** 20).toFixed(1)} MiB of Q4_K matrices`);
  } finally {
    model.close();
  }
});
