// One rank of an MPI tensor-parallel group, as mpiexec starts it (tensor-parallel-mpi.test.ts):
// rank 0 runs the target among its companions and writes the trace (node:v8's serialization) to
// the file named; the other ranks serve rank 0's passes, then wait CLOSE_DELAY_MS (default 0)
// before closing. Each rank writes OUT_FILE.closed.<rank> once its close() has returned, which is
// its end of the MPI job: a rank the launcher killed at the job's end leaves none.
// Arguments: MODEL_DIR SEED OUT_FILE [CLOSE_DELAY_MS].
import { writeFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { serialize } from 'node:v8';
import { MPI_GROUP, loadModel } from '../index.ts';
import { loadOptions } from './helpers.ts';
import { BLOCKS_PER_GROUP, BLOCK_SIZE_TOKENS } from './invariance-harness.ts';
import { runChunkedTarget } from './tp-scenario.ts';

const [modelDir, seedText, outFile, closeDelayText = '0'] = process.argv.slice(2);
const rank = Number(process.env.PMI_RANK);
const size = Number(process.env.PMI_SIZE);
const model = await loadModel({
  ...loadOptions(modelDir, { numThreads: 1, blockSizeTokens: BLOCK_SIZE_TOKENS, numKvBlocks: BLOCKS_PER_GROUP }),
  tensorParallel: { size, rank, group: MPI_GROUP, connectTimeoutMs: 120_000 },
});
if (rank === 0) {
  writeFileSync(outFile, serialize(await runChunkedTarget(model, Number(seedText))));
} else {
  await model.serveRank();
  await sleep(Number(closeDelayText));
}
model.close();
writeFileSync(`${outFile}.closed.${rank}`, '');
