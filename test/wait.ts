// Bounds for the waits of tests on sockets, child processes and polling loops: a hang fails the
// test that hangs, naming what it waited for, instead of stalling the run until its timeout.

/** The most any one wait of a test may take. */
export const WAIT_BOUND_MS = 30_000;

/** The promise's value, or a rejection naming what did not happen within boundMs. */
export function within<T>(promise: Promise<T>, what: string, boundMs = WAIT_BOUND_MS): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const bound = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not within ${boundMs} ms`)), boundMs);
  });
  return Promise.race([promise, bound]).finally(() => clearTimeout(timer));
}

/**
 * Between a poll's checks: a timer's turn of the event loop, so that what the check waits for
 * (a socket's data, a timer, a line logged from setImmediate) can happen. A check that resolves
 * at once, awaited alone, drains only microtasks: the poll spun a core to its bound and failed.
 */
const POLL_INTERVAL_MS = 10;

/** Calls check (one round trip to what it observes) until it returns true; rejects after boundMs. */
export async function pollUntil(check: () => Promise<boolean>, what: string, boundMs = WAIT_BOUND_MS): Promise<void> {
  const deadlineMs = Date.now() + boundMs;
  while (!(await check())) {
    if (Date.now() > deadlineMs) throw new Error(`${what}: not within ${boundMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, POLL_INTERVAL_MS));
  }
}
