// Asks a worker how it is, without letting a hung worker hang the caller (a health probe or a
// metrics scrape).
import type { EngineClient } from '../engine/types.ts';

export type WorkerHealth = Awaited<ReturnType<EngineClient['health']>>;

export const WORKER_HEALTH_TIMEOUT_MS = 2000;

/** Null when the worker does not answer in time or answers with an error. */
export async function probeWorker(worker: EngineClient, timeoutMs = WORKER_HEALTH_TIMEOUT_MS): Promise<WorkerHealth | null> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<null>((resolve) => {
    timer = setTimeout(() => resolve(null), timeoutMs);
  });
  try {
    return await Promise.race([worker.health(), timeout]);
  } catch {
    return null;
  } finally {
    clearTimeout(timer);
  }
}
