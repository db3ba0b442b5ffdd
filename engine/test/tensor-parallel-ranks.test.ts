// A worker's tensor-parallel ranks as real `conduit rank` processes: the same logits as one
// process; a rank killed mid-service fails the next step with CD_ERR_RANK_UNAVAILABLE naming it
// and reports the group lost; a group that cannot form names the rank it misses.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { loadModel } from '../../native/index.ts';
import { buildBatch, consecutiveBlocks, loadOptions, makeTempDir, randomTokens, writeCheckpoint } from '../../native/test/helpers.ts';
import { groupName } from '../../native/test/tp-group.ts';
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

function promptBatch(tokenIds: number[]) {
  return buildBatch([{ tokenIds, startPosition: 0, blockIds: consecutiveBlocks(0, 64, 16), flags: 3, temperature: 0, seed: 0n }], { vocabSize: SHAPE.vocabSize });
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
    assert.deepEqual(Buffer.from(result.logits.buffer), Buffer.from(expected.buffer), 'TP 2 over processes differs from one process');
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
