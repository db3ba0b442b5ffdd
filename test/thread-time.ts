// The test thread's own CPU time, which load does not stretch (Linux: its schedstat, in ns). On
// a 2-core machine shared with other work, wall time between two events of one thread is any
// length; CPU time is how much of it was the thread's own work.
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';

/** This (the main) thread's schedstat: ns on a CPU, then ns waiting on a run queue. */
const SCHEDSTAT_PATH = `/proc/self/task/${process.pid}/schedstat`;

/** ns this thread has run on a CPU, or null where the system does not say. */
function readThreadCpuNs(): number | null {
  try {
    const runNs = Number(readFileSync(SCHEDSTAT_PATH, 'utf8').split(' ')[0]);
    return Number.isFinite(runNs) ? runNs : null;
  } catch {
    return null;
  }
}

const hasSchedstat = readThreadCpuNs() !== null;

/**
 * Watches the event loop's longest turn: the CPU time its thread ran between two ticks of a 5 ms
 * timer. Wall time between ticks would count the time the thread waited for a core too; CPU time
 * is what the process's own code held the loop for. Elsewhere wall time is all there is.
 */
export function watchLoopTurns() {
  const nowMs = hasSchedstat ? () => readThreadCpuNs()! / 1e6 : () => performance.now();
  let lastMs = nowMs();
  let longestMs = 0;
  const timer = setInterval(() => {
    const tickMs = nowMs();
    longestMs = Math.max(longestMs, tickMs - lastMs);
    lastMs = tickMs;
  }, 5);
  return {
    clock: hasSchedstat ? 'CPU' : 'wall',
    /** Stops watching; the longest turn seen, in ms. */
    stop(): number {
      clearInterval(timer);
      return Math.max(longestMs, nowMs() - lastMs);
    },
  };
}
