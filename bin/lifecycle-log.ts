// The server's lifecycle lines on stderr: listening, serving, worker restarts, fatal errors.
// One line each, all written here, so that a structured logger can take them over in one place.

export interface ListeningAddresses {
  httpAddress: string;
  metricsAddress: string;
  /** KServe v2 gRPC, when a model repository is configured. */
  grpcAddress: string | null;
}

function addressesOf({ httpAddress, metricsAddress, grpcAddress }: ListeningAddresses): string {
  return `${httpAddress} (metrics ${metricsAddress}${grpcAddress === null ? '' : `, KServe gRPC ${grpcAddress}`})`;
}

function write(line: string): void {
  console.error(line);
}

export const lifecycleLog = {
  /** The ports are bound; the models load next (the gateway answers 503 `starting` meanwhile). */
  listening(addresses: ListeningAddresses): void {
    write(`conduit: listening on ${addressesOf(addresses)}; loading models`);
  },
  serving(addresses: ListeningAddresses): void {
    write(`conduit: serving on ${addressesOf(addresses)}`);
  },
  /** reason: `code N`, a signal's name, or `hung`. */
  workerRestarting(workerName: string, reason: string, delayMs: number): void {
    write(`conduit: worker ${workerName} exited (${reason}); restarting in ${delayMs} ms`);
  },
  workerHung(workerName: string, silentMs: number): void {
    write(`conduit: worker ${workerName} sent nothing on its engine stream for ${(silentMs / 1000).toFixed(1)} s; killing it as hung`);
  },
  workerStopKilled(workerName: string, graceMs: number): void {
    write(`conduit: worker ${workerName} still running ${graceMs / 1000} s after SIGTERM; killed`);
  },
  /** The server stops because of it, and exits 1. */
  fatal(message: string): void {
    write(`conduit: ${message}`);
  },
};
