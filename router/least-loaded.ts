// The routing policy until the KV-aware router lands: the worker with the fewest requests in
// flight from this gateway, ties to the lowest index so that order is stable.

export interface RoutedWorker {
  readonly numInFlight: number;
}

export function pickLeastLoaded<W extends RoutedWorker>(workers: readonly W[]): W {
  if (workers.length === 0) throw new Error('no workers to route to');
  let best = workers[0];
  for (const worker of workers) if (worker.numInFlight < best.numInFlight) best = worker;
  return best;
}
