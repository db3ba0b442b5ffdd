// A worker's tensor-parallel ranks as real `conduit rank` processes: the same logits as one
// process; a rank killed mid-service fails the next step with CD_ERR_RANK_UNAVAILABLE naming it
// and reports the group lost; a group that cannot form names the rank it misses.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import type { LoadOptions } from '../../native/api.ts';
import { loadModel, type LoadedModel } from '../../native/index.ts';
import { buildBatch, consecutiveBlocks, freshSeed, loadOptions, makeTempDir, randomTokens, withModel, writeCheckpoint } from '../../native/test/helpers.ts';
import {
  BLOCKS_PER_GROUP,
  BLOCK_SIZE_TOKENS,
  FIRST_BLOCK_AFTER_COMPANIONS,
  NUM_COMPANIONS,
  TARGET_PROMPT_TOKENS,
  assertBitwiseEqual,
  makeCompanions,
  makeSequence,
  runTarget,
  targetSettings,
} from '../../native/test/invariance-harness.ts';
import { groupName, withGroup } from '../../native/test/tp-group.ts';
import { packageRoot } from '../../package-root.ts';
import { rankArgs, startRanks } from '../tensor-parallel.ts';

const SHAPE = { arch: 'llama', hiddenSize: 64, numLayers: 2, numHeads: 8, numKvHeads: 4, headDim: 16, intermediateSize: 96, vocabSize: 203, dtype: 'bf16' } as const;
const DEADLINE_MS = 60_000;

function withDeadline<T>(promise: Promise<T>, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer within ${DEADLINE_MS} ms`)), DEADLINE_MS);
  });
  return Promise.race([promise, deadline]).finally(() => clearTimeout(timer));
}

function promptBatch(tokenIds: number[], vocabSize: number = SHAPE.vocabSize) {
  return buildBatch([{ tokenIds, startPosition: 0, blockIds: consecutiveBlocks(0, 64, 16), flags: 3, temperature: 0, seed: 0n }], { vocabSize });
}

test('ranks in their own processes give the logits of one process, and a killed rank fails the group naming it', async () => {
  using temp = makeTempDir('tp-ranks');
  const modelDir = writeCheckpoint(temp.dir, 'model', SHAPE);
  const options = loadOptions(modelDir, { numThreads: 1 });
  const batch = promptBatch(randomTokens(40, SHAPE.vocabSize, 7));
  const single = await loadModel(options);
  const expected = (await single.forward(batch)).logits;
  single.close();

  const ranks = startRanks({ ...options, quantization: 'none', tensorParallelSize: 2 });
  const model = await withDeadline(loadModel({ ...options, tensorParallel: { size: 2, rank: 0, group: ranks.group, rankPids: ranks.pids } }), 'group load');
  try {
    const result = await withDeadline(model.forward(batch), 'forward at TP 2');
    assert.deepEqual(Buffer.from(result.logits.buffer, result.logits.byteOffset, result.logits.byteLength), Buffer.from(expected.buffer, expected.byteOffset, expected.byteLength), 'TP 2 over processes differs from one process');
    // Kill rank 1: the next step fails naming it, and the group reports it lost.
    process.kill(ranks.pids[0], 'SIGKILL');
    const lost = await withDeadline(ranks.lost, 'rank loss');
    assert.match(lost.message, /tensor-parallel rank 1 \(process \d+\) exited \(SIGKILL\)/);
    await assert.rejects(withDeadline(model.forward(batch), 'forward after the kill'), (err: Error & { code?: string }) => {
      assert.equal(err.code, 'CD_ERR_RANK_UNAVAILABLE');
      assert.match(err.message, /tensor-parallel rank 1 of group .* has exited/);
      return true;
    });
  } finally {
    model.close();
    await ranks.stop();
  }
});

test('rank 0 names the rank that never joined; a rank names the group it could not reach', async () => {
  using temp = makeTempDir('tp-ranks');
  const modelDir = writeCheckpoint(temp.dir, 'model', SHAPE);
  const options = loadOptions(modelDir, { numThreads: 1 });
  await assert.rejects(
    loadModel({ ...options, tensorParallel: { size: 4, rank: 0, group: groupName(), connectTimeoutMs: 300 } }),
    (err: Error & { code?: string }) => {
      assert.equal(err.code, 'CD_ERR_RANK_UNAVAILABLE');
      assert.match(err.message, /rank\(s\) 1 \(never connected\), 2 \(never connected\), 3 \(never connected\) did not join within 300 ms/);
      return true;
    },
  );
  // A rank process that dies before it connects fails the load at once, not at the timeout.
  const gone = spawn(process.execPath, ['-e', 'process.exit(3)'], { stdio: 'ignore' });
  await new Promise((resolve) => gone.once('exit', resolve));
  await assert.rejects(
    withDeadline(loadModel({ ...options, tensorParallel: { size: 2, rank: 0, group: groupName(), rankPids: [gone.pid!] } }), 'load with a dead rank'),
    new RegExp(`tensor-parallel rank 1 \\(process ${gone.pid}\\) exited before it was ready`),
  );
  const group = groupName();
  const args = [...rankArgs({ ...options, quantization: 'none', tensorParallelSize: 2 }, 1, group), '--connect-timeout-s', '1'];
  const child = spawn(process.execPath, [path.join(packageRoot, 'bin', 'conduit.js'), ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (chunk) => (stderr += chunk));
  const code = await withDeadline(new Promise<number | null>((resolve) => child.once('exit', resolve)), 'rank without a group');
  assert.equal(code, 1, stderr);
  assert.match(stderr, new RegExp(`tensor-parallel rank 1 could not reach rank 0 of group ${group} \\(/dev/shm/${group}\\) within 1000 ms`));
});

/** Rank 0 of `group` in a process of its own, which prints `ready` once its group has formed. */
function spawnRankZero(options: LoadOptions, size: number, group: string): ChildProcess {
  const script = `
    const { loadModel } = await import(${JSON.stringify(path.join(packageRoot, 'native', 'index.ts'))});
    const options = JSON.parse(process.argv[1]);
    await loadModel(options);
    process.stdout.write('ready\\n');
    setInterval(() => {}, 1000);
  `;
  const tensorParallel = { size, rank: 0, group, connectTimeoutMs: 600_000 };
  return spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script, JSON.stringify({ ...options, tensorParallel })], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
}

async function waitFor(condition: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + DEADLINE_MS;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`${what}: not within ${DEADLINE_MS} ms`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

test('a SIGKILLed rank 0 leaves no shared-memory segment behind: unlinked once its group forms, else reclaimed by the next rank 0', async () => {
  using temp = makeTempDir('tp-ranks');
  const modelDir = writeCheckpoint(temp.dir, 'model', SHAPE);
  const options = loadOptions(modelDir, { numThreads: 1 });
  const segment = (group: string) => `/dev/shm/${group}`;

  // Formed: rank 1 here, rank 0 in a child that is SIGKILLed while its rank serves.
  const formed = groupName();
  const child = spawnRankZero(options, 2, formed);
  const exited = new Promise((resolve) => child.once('exit', resolve));
  let stdout = '';
  child.stdout!.on('data', (chunk) => (stdout += chunk));
  try {
    const rank = await withDeadline(loadModel({ ...options, tensorParallel: { size: 2, rank: 1, group: formed, connectTimeoutMs: DEADLINE_MS } }), 'rank 1 load');
    const served = rank.serveRank();
    await waitFor(() => stdout.includes('ready'), 'rank 0 ready');
    assert.equal(existsSync(segment(formed)), false, `${segment(formed)} still named once every rank mapped it`);
    child.kill('SIGKILL');
    await assert.rejects(withDeadline(served, 'rank 1 noticing rank 0'), /tensor-parallel rank 0 of group .* has exited/);
    rank.close();
  } finally {
    child.kill('SIGKILL');
    await exited;
  }
  assert.equal(existsSync(segment(formed)), false);

  // Never formed: rank 0 killed while it waits for rank 1 leaves the segment named; the next
  // rank 0 on this machine (any group) removes it, as its process is gone.
  const abandoned = groupName();
  const waiting = spawnRankZero(options, 2, abandoned);
  const waitingExited = new Promise((resolve) => waiting.once('exit', resolve));
  try {
    await waitFor(() => existsSync(segment(abandoned)), 'rank 0 creating its segment');
  } finally {
    waiting.kill('SIGKILL');
    await waitingExited;
  }
  assert.equal(existsSync(segment(abandoned)), true, 'a rank 0 killed before its group formed leaves the segment');
  await withGroup(options, 2, async () => {
    assert.equal(existsSync(segment(abandoned)), false, `${segment(abandoned)} of a dead rank 0 not reclaimed`);
  });
});

/** A group of `size` whose ranks > 0 are `conduit rank` processes, as a worker starts them. */
async function withProcessGroup<T>(options: LoadOptions, size: number, fn: (model: LoadedModel, pids: number[]) => Promise<T>): Promise<T> {
  const ranks = startRanks({ ...options, quantization: 'none', tensorParallelSize: size });
  try {
    const model = await withDeadline(loadModel({ ...options, tensorParallel: { size, rank: 0, group: ranks.group, rankPids: ranks.pids } }), `group load at TP ${size}`);
    try {
      return await fn(model, ranks.pids);
    } finally {
      model.close();
    }
  } finally {
    await ranks.stop();
  }
}

// TP = 8 (eight processes on however many cores), with 4 KV heads: every KV head held by two ranks.
test('TP = 8 over rank processes: logits, samples and logprobs bitwise those of TP = 1 (bf16, KV heads replicated)', async (t) => {
  using temp = makeTempDir('tp-ranks');
  const seed = freshSeed(t);
  const shape = { arch: 'llama', hiddenSize: 64, numLayers: 2, numHeads: 8, numKvHeads: 4, headDim: 16, intermediateSize: 136, vocabSize: 301, dtype: 'bf16', seed } as const;
  const modelDir = writeCheckpoint(temp.dir, 'model', shape);
  const options = loadOptions(modelDir, { numThreads: 1, blockSizeTokens: BLOCK_SIZE_TOKENS, numKvBlocks: BLOCKS_PER_GROUP });
  const prompt = randomTokens(TARGET_PROMPT_TOKENS, shape.vocabSize, seed);
  const sampling = targetSettings(seed, prompt)['min-p, penalties, bias and logprobs'];
  const reference = await withModel({ ...options, numThreads: 2 }, (model) => runTarget(model, makeSequence(prompt, TARGET_PROMPT_TOKENS, 0, sampling), [], 0));
  const companions = makeCompanions(seed, shape.vocabSize);
  const split = await withProcessGroup(options, 8, (model) =>
    withDeadline(runTarget(model, makeSequence(prompt, 7, FIRST_BLOCK_AFTER_COMPANIONS, sampling), companions, 7), 'the target at TP 8'),
  );
  assertBitwiseEqual(split, reference, `seed ${seed}, TP 8, chunks of 7 among ${NUM_COMPANIONS} others`);
});

/** Anonymous resident memory of a process (its heap and the weights it packed), in bytes. */
function rssAnonBytes(pid: number): number {
  const match = /^RssAnon:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  assert.ok(match !== null, `/proc/${pid}/status has no RssAnon`);
  return Number(match[1]) * 1024;
}

// A rank packs only its shard: rank 1 of TP 2 holds a quarter of the sharded weights more than a
// rank of TP 4 (the processes are otherwise the same: the same program, the same replicated norms
// and embedding). Sharded: q/k/v/o, gate/up/down, the LM head (the embedding stays mapped from the
// file, not anonymous).
// The weights are large beside the few MiB a Node process's own heap moves from run to run (its
// RssAnon at the same point varies by ~6 MiB), so the share stands out of that noise.
test('each rank holds its 1/TP share of the sharded weights (resident memory of rank processes at TP 2 and 4)', async (t) => {
  using temp = makeTempDir('tp-memory');
  const shape = { arch: 'llama', hiddenSize: 512, numLayers: 12, numHeads: 8, numKvHeads: 4, headDim: 64, intermediateSize: 3072, vocabSize: 1024, dtype: 'bf16' } as const;
  const modelDir = writeCheckpoint(temp.dir, 'model', shape);
  const options = loadOptions(modelDir, { numThreads: 1, numKvBlocks: 16 });
  const perLayer = (shape.numHeads * 2 + shape.numKvHeads * 2) * shape.headDim * shape.hiddenSize + 3 * shape.hiddenSize * shape.intermediateSize;
  const shardedBytes = 2 * (shape.numLayers * perLayer + shape.vocabSize * shape.hiddenSize);
  const batch = promptBatch(randomTokens(16, shape.vocabSize, 3), shape.vocabSize);
  const rankBytes = async (size: number) =>
    withProcessGroup(options, size, async (model, pids) => {
      await withDeadline(model.forward(batch), `forward at TP ${size}`);
      return pids.map(rssAnonBytes);
    });
  const [half] = await rankBytes(2);
  const quarters = await rankBytes(4);
  const mib = (bytes: number) => `${(bytes / 2 ** 20).toFixed(1)} MiB`;
  t.diagnostic(`sharded weights ${mib(shardedBytes)}; rank 1 at TP 2: ${mib(half)}; ranks at TP 4: ${quarters.map(mib).join(', ')}`);
  for (const [i, quarter] of quarters.entries()) {
    const saved = half - quarter;
    const expected = shardedBytes / 4;
    // Allocator slack and the runtime's own heap differ by a few MiB from process to process.
    assert.ok(Math.abs(saved - expected) < 0.35 * expected,
      `rank 1 at TP 2 holds ${(half / 2 ** 20).toFixed(1)} MiB, rank ${i + 1} at TP 4 ${(quarter / 2 ** 20).toFixed(1)} MiB: ` +
      `${(saved / 2 ** 20).toFixed(1)} MiB less, expected a quarter of the ${(shardedBytes / 2 ** 20).toFixed(1)} MiB of sharded weights`);
  }
});
