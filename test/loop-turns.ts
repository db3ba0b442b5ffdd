// How long the event loop computes at a time, on a clock that load does not stretch.
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';

/**
 * Watches the event loop's longest turn: the CPU time its thread ran between two ticks of a 5 ms
 * timer (Linux: the thread's schedstat, in ns). Wall time between ticks would count the time the
 * thread waited for a core too, which on a machine busy with other work is any length; CPU time
 * is what the process's own code held the loop for. Elsewhere wall time is all there is.
 */
export function watchLoopTurns() {
  const schedstatPath = `/proc/self/task/${process.pid}/schedstat`;
  const hasSchedstat = (() => {
    try {
      return Number.isFinite(Number(readFileSync(schedstatPath, 'utf8').split(' ')[0]));
    } catch {
      return false;
    }
  })();
  const nowMs = hasSchedstat ? () => Number(readFileSync(schedstatPath, 'utf8').split(' ')[0]) / 1e6 : () => performance.now();
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
