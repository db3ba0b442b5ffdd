// The server's lifecycle lines: listening, serving, worker restarts and hangs, draining, stopped,
// fatal errors. They go through the gateway's logger (JSON on stdout, at server.log_level), each
// with a readable `msg` and an `event` naming it, so that a supervisor or a test waits for an
// event rather than for a sentence. Usage and configuration errors, found before any logger
// exists, are not here: bin/cli.ts writes them as one plain line on stderr.
import type { Logger } from 'pino';

export interface ListeningAddresses {
  httpAddress: string;
  metricsAddress: string;
  /** KServe v2 gRPC, when a model repository is configured. */
  grpcAddress: string | null;
}

/** What each lifecycle line's `event` field says. */
export type LifecycleEvent =
  | 'listening' | 'serving' | 'worker_restarting' | 'worker_not_ready' | 'worker_hung' | 'worker_stop_killed'
  | 'worker_unresponsive' | 'worker_answered' | 'draining' | 'stopped' | 'fatal';

function addressesOf({ httpAddress, metricsAddress, grpcAddress }: ListeningAddresses): string {
  return `${httpAddress} (metrics ${metricsAddress}${grpcAddress === null ? '' : `, KServe gRPC ${grpcAddress}`})`;
}

function addressFields({ httpAddress, metricsAddress, grpcAddress }: ListeningAddresses) {
  return { http_address: httpAddress, metrics_address: metricsAddress, grpc_address: grpcAddress };
}

export type LifecycleLog = ReturnType<typeof createLifecycleLog>;

export function createLifecycleLog(log: Logger) {
  const write = (level: 'info' | 'warn' | 'fatal', event: LifecycleEvent, fields: Record<string, unknown>, msg: string) =>
    log[level]({ event, ...fields }, msg);
  return {
    /** The ports are bound; the models load next (the gateway answers 503 `starting` meanwhile). */
    listening(addresses: ListeningAddresses): void {
      write('info', 'listening', addressFields(addresses), `listening on ${addressesOf(addresses)}; loading models`);
    },
    serving(addresses: ListeningAddresses): void {
      write('info', 'serving', addressFields(addresses), `serving on ${addressesOf(addresses)}`);
    },
    /** reason: `code N`, a signal's name, or `hung`. */
    workerRestarting(workerName: string, reason: string, delayMs: number): void {
      write('warn', 'worker_restarting', { worker: workerName, reason, delay_ms: delayMs },
        `worker ${workerName} exited (${reason}); restarting in ${delayMs} ms`);
    },
    workerNotReady(workerName: string, loadingMs: number): void {
      const loadingS = (loadingMs / 1000).toFixed(1);
      write('warn', 'worker_not_ready', { worker: workerName, loading_ms: Math.round(loadingMs) },
        `worker ${workerName} not listening ${loadingS} s after its restart (server.worker_ready_timeout_s); killing it`);
    },
    workerHung(workerName: string, silentMs: number): void {
      const silentS = (silentMs / 1000).toFixed(1);
      write('warn', 'worker_hung', { worker: workerName, silent_ms: Math.round(silentMs) },
        `worker ${workerName} sent nothing on its engine stream for ${silentS} s; killing it as hung`);
    },
    /** A remote worker (no process here to kill) is out of routing until it answers again. */
    workerUnresponsive(address: string, silentMs: number): void {
      const silentS = (silentMs / 1000).toFixed(1);
      write('warn', 'worker_unresponsive', { worker: address, silent_ms: Math.round(silentMs) },
        `worker ${address} sent nothing on its engine stream for ${silentS} s; its requests failed, none is routed to it until it answers`);
    },
    workerAnswered(address: string): void {
      write('info', 'worker_answered', { worker: address }, `worker ${address} answers again; requests are routed to it`);
    },
    workerStopKilled(workerName: string, graceMs: number): void {
      write('warn', 'worker_stop_killed', { worker: workerName, grace_ms: graceMs },
        `worker ${workerName} still running ${graceMs / 1000} s after SIGTERM; killed`);
    },
    /** A signal (or a fatal error) ended serving: new requests get 503 while those in flight finish. */
    draining(cause: string, drainTimeoutS: number): void {
      write('info', 'draining', { cause, drain_timeout_s: drainTimeoutS },
        `${cause}: draining (in-flight requests have ${drainTimeoutS} s to finish)`);
    },
    /** Drained and every worker exited; the process exits with exitCode next. */
    stopped(exitCode: number): void {
      write('info', 'stopped', { exit_code: exitCode }, `stopped; exit code ${exitCode}`);
    },
    /** The server stops because of it, and exits with exitCode; err adds its stack for an unexpected error. */
    fatal(message: string, exitCode: number, err?: Error): void {
      write('fatal', 'fatal', err === undefined ? { exit_code: exitCode } : { exit_code: exitCode, err }, message);
    },
  };
}
