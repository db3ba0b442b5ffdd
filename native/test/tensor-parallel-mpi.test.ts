// The MPI transport: two rank processes started by MPICH's mpiexec, forced onto the library's TCP
// transport (MPIR_CVAR_NOLOCAL: no shared memory between them; UCX over TCP), give bitwise the
// trace of the same group over shared memory, and of TP = 1.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { deserialize } from 'node:v8';
import { findOnPath } from '../../test/system-tools.ts';
import { freshSeed, loadOptions, makeTempDir, withModel, writeCheckpoint } from './helpers.ts';
import { BLOCKS_PER_GROUP, BLOCK_SIZE_TOKENS, assertBitwiseEqual, type Trace } from './invariance-harness.ts';
import { withGroup } from './tp-group.ts';
import { runChunkedTarget } from './tp-scenario.ts';

const SHAPE = { arch: 'llama', hiddenSize: 64, numLayers: 2, numHeads: 8, numKvHeads: 4, headDim: 16, intermediateSize: 136, vocabSize: 301, dtype: 'bf16' } as const;
const DEADLINE_MS = 180_000;
const mpiexec = findOnPath('mpiexec.mpich');

test('TP = 2 over MPI (mpiexec, TCP): the trace of shared memory and of TP = 1, bitwise', { skip: mpiexec === null && 'MPICH is not installed (apt-get install mpich): the MPI transport is not tested here' }, async (t) => {
  using temp = makeTempDir('tensor-parallel-mpi');
  const seed = freshSeed(t);
  const modelDir = writeCheckpoint(temp.dir, 'model', { ...SHAPE, seed });
  const options = loadOptions(modelDir, { blockSizeTokens: BLOCK_SIZE_TOKENS, numKvBlocks: BLOCKS_PER_GROUP });
  const reference = await withModel({ ...options, numThreads: 2 }, (model) => runChunkedTarget(model, seed));
  const shm = await withGroup(options, 2, ({ model }) => runChunkedTarget(model, seed));
  assertBitwiseEqual(shm, reference, `seed ${seed}, shared memory at TP 2`);

  const outFile = path.join(temp.dir, 'trace.bin');
  const script = path.join(import.meta.dirname, 'mpi-rank.ts');
  const runJob = async (): Promise<{ code: number | null; output: string }> => {
    const child = spawn(mpiexec!, [
      '-n', '2', '-env', 'MPIR_CVAR_NOLOCAL', '1', '-env', 'UCX_TLS', 'tcp,self', '-env', 'UCX_NET_DEVICES', 'lo',
      process.execPath, '--import', 'tsx', script, modelDir, String(seed), outFile,
    ], { stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (chunk) => (output += chunk));
    child.stderr.on('data', (chunk) => (output += chunk));
    let timer: NodeJS.Timeout | undefined;
    const code = await Promise.race([
      new Promise<number | null>((resolve) => child.once('exit', resolve)),
      new Promise<never>((_, reject) => (timer = setTimeout(() => {
        child.kill('SIGKILL');
        reject(new Error(`mpiexec: no exit within ${DEADLINE_MS} ms:\n${output}`));
      }, DEADLINE_MS))),
    ]).finally(() => clearTimeout(timer));
    return { code, output };
  };
  // About one job in ten on a loaded 2-core machine (and once in a CI run) ends with a rank killed
  // by signal 9 and no message from either rank, while the same seed passes alone; its cause is
  // not found (the ranks exit without MPI_Finalize, but finalizing at close hung 3 jobs in 30).
  // Such a job runs once more, said in the test's output; a second such end fails.
  let { code, output } = await runJob();
  if (code !== 0 && output.includes('Killed (signal 9)')) {
    t.diagnostic(`mpiexec exited with ${code}, a rank killed by signal 9; running the job once more:\n${output}`);
    ({ code, output } = await runJob());
  }
  assert.equal(code, 0, `mpiexec exited with ${code}:\n${output}`);
  const overMpi = deserialize(readFileSync(outFile)) as Trace;
  assertBitwiseEqual(overMpi, reference, `seed ${seed}, MPI over TCP at TP 2`);
});
