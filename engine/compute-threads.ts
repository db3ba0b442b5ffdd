// How many compute threads a step runs with while grammar threads are busy: compiling, or filling
// the masks of a step's few constrained rows.
//
// A new grammar compiles on its grammar thread for tens of milliseconds of CPU (xgrammar's
// per-state token masks over the whole vocabulary), started at admission and so overlapping the
// request's prefill. The forward pass splits every parallel call among its compute threads, and a
// call ends only when its last chunk does: where the compute threads already take every core, the
// one that shares its core with the compile holds up every call, and the whole pass (every
// sequence's step) runs up to twice as long. Measured on 2 cores: a 32-token prefill beside a
// compile took 1.8x that of a cached schema's; with one compute thread, 1.14x, as a short prefill
// on one thread costs about what it costs on two.
//
// So while compiles run, the pass leaves them their cores: compute threads + busy grammar threads
// <= the cores the process may use, and never fewer than one compute thread. The moment no
// grammar thread is busy, the configured threads rejoin, inside the pass running then. The count
// lives in the model's cell (NativeModel.activeThreadsCell), which the native pool reads at each
// parallel call (each op); whichever thread starts or ends a busy job stores the new count there
// itself: the engine as it posts a compile, a grammar thread the moment its compile (or a new
// grammar's byte phase) ends, not when the event loop hears of it (on a loaded 2-core machine a
// 'prefix' reply reached the event loop a median 1.2-1.7 ms, and a p90 22-35 ms, after the byte
// phase ended, inside the prompt's pass). Fixed per step, a 512-token prefill (~176 ms) that
// began beside a 25-70 ms compile ran all on one thread. A grammar thread runs one job at a time,
// so it is busy threads that count, not jobs queued. A mask fill of a step's few rows (no more
// than the grammar threads) is a busy job too, for the tenths of a millisecond it runs: the pass
// waits for its rows to sample, and a compute thread sharing the filling thread's core holds up
// every op meanwhile. A fill of many rows (a big constrained batch) runs for much of the pass,
// which keeps every compute thread.
// The outputs do not depend on the thread count (native/index.ts,
// NativeModel.setActiveThreads), only the step's speed does.
import os from 'node:os';

/** The cores this process may use: its CPU affinity where the platform has one. */
export function availableCores(): number {
  return os.availableParallelism();
}

/**
 * The compute threads for a step: numComputeThreads with no grammar thread busy, else at most the
 * cores the busy grammar threads leave, and at least one.
 */
export function activeComputeThreads(numComputeThreads: number, numCores: number, numBusyGrammarThreads: number): number {
  if (numBusyGrammarThreads <= 0) return numComputeThreads;
  return Math.max(1, Math.min(numComputeThreads, numCores - numBusyGrammarThreads));
}

/** What every thread that starts or ends a busy job shares (over SharedArrayBuffers). */
export interface SharedComputeThreads {
  /** The model's active thread count (NativeModel.activeThreadsCell). */
  cell: Int32Array;
  /**
   * Per grammar thread, its busy jobs: compiles posted and not yet ended, and the fill of a step's
   * few rows while it runs.
   */
  numBusyJobs: Int32Array;
  numComputeThreads: number;
  numCores: number;
}

/** Grammar threads with a busy job (a compile posted and not yet ended, or a few rows' fill). */
export function numBusyGrammarThreads(numBusyJobs: Int32Array): number {
  let numBusy = 0;
  for (let thread = 0; thread < numBusyJobs.length; thread++) if (Atomics.load(numBusyJobs, thread) > 0) numBusy++;
  return numBusy;
}

/**
 * Adds delta to a grammar thread's busy jobs and stores the count that calls for, from any
 * thread. Stored again until the busy threads it read are still those after the store: of two
 * threads changing them at once, the one storing last stores what holds after both.
 */
export function changeBusyJobs(shared: SharedComputeThreads, thread: number, delta: number): void {
  Atomics.add(shared.numBusyJobs, thread, delta);
  for (;;) {
    const numBusy = numBusyGrammarThreads(shared.numBusyJobs);
    Atomics.store(shared.cell, 0, activeComputeThreads(shared.numComputeThreads, shared.numCores, numBusy));
    if (numBusyGrammarThreads(shared.numBusyJobs) === numBusy) return;
  }
}
