// Kills a worker mid-stream again and again (tools/worker-chaos.ts has the round): every client
// of the killed worker must get a clean OpenAI error event, every stream on the other workers
// all its tokens, and a new request right after the kill must succeed.
//
//   npm run chaos:workers [-- --kills 100 --workers 2 --streams-per-worker 2 --tokens 300]
import os from 'node:os';
import { parseArgs } from 'node:util';
import { ChaosCluster } from './worker-chaos.ts';

const { values } = parseArgs({
  options: {
    kills: { type: 'string', default: '100' },
    workers: { type: 'string', default: '2' },
    'streams-per-worker': { type: 'string', default: '2' },
    tokens: { type: 'string', default: '300' },
  },
});

async function main(): Promise<number> {
  const numKills = Number(values.kills);
  const settings = { numWorkers: Number(values.workers), streamsPerWorker: Number(values['streams-per-worker']), numTokens: Number(values.tokens) };
  console.log(`CPU: ${os.cpus()[0]?.model.trim()}, ${os.availableParallelism()} CPUs; ${new Date().toISOString()}`);
  console.log(`chaos:workers: ${numKills} kills; conduit serve over ${settings.numWorkers} remote workers, ` +
    `${settings.numWorkers * settings.streamsPerWorker} streams of ${settings.numTokens} tokens per round`);
  const cluster = await ChaosCluster.start(settings);
  const totals = { cleanErrors: 0, completed: 0, balancedRounds: 0, failedRounds: 0 };
  const startMs = performance.now();
  try {
    for (let round = 0; round < numKills; round++) {
      const result = await cluster.round(round);
      totals.cleanErrors += result.numCleanErrors;
      totals.completed += result.numCompleted;
      if (result.balanced) totals.balancedRounds++;
      if (result.problems.length > 0) {
        totals.failedRounds++;
        console.log(`round ${round + 1}: FAIL\n  ${result.problems.join('\n  ')}`);
      }
      if ((round + 1) % 10 === 0 || round + 1 === numKills) {
        console.log(`${round + 1} kills: ${totals.cleanErrors} clean errors on killed workers, ${totals.completed} streams completed untouched ` +
          `on the others, ${totals.balancedRounds} rounds with streams on every worker, ${totals.failedRounds} failed rounds ` +
          `(${((performance.now() - startMs) / 1000).toFixed(0)} s)`);
      }
    }
  } finally {
    await cluster.close();
  }
  console.log(`chaos:workers: ${totals.failedRounds === 0 ? 'pass' : 'FAIL'}`);
  return totals.failedRounds === 0 ? 0 : 1;
}

process.exitCode = await main();
