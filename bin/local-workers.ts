// Spawns and supervises the engine workers a configuration asks for on this machine: each a
// child process serving engine.proto on a local socket, restarted with backoff if it dies. The
// backoff doubles while a worker keeps dying soon after it starts and starts over once one has
// run well for a while, so a crash hours after the last costs half a second, not the cap. A
// worker that dies before it ever served is not restarted: the server fails to start instead.
// A worker whose engine stream goes silent (no step, no heartbeat) is killed as hung and restarted.
import { spawn, type ChildProcess } from 'node:child_process';
import os from 'node:os';
import path from 'node:path';
import { existsSync, rmSync } from 'node:fs';
import { packageRoot } from '../package-root.ts';
import { FatalError } from './fatal-error.ts';
import type { LifecycleLog } from './lifecycle-log.ts';

const conduitBin = path.join(packageRoot, 'bin', 'conduit.js');
/** Set (to 1) in the environment of the workers a gateway spawns: they stop when it says so, not on a signal. */
export const SUPERVISED_WORKER_ENV = 'CONDUIT_WORKER_SUPERVISED';
const firstRestartDelayMs = 500;
const maxRestartDelayMs = 30_000;
/** A worker up this long before it died was healthy: its restart starts the backoff over. */
const healthyUptimeMs = 60_000;
/** stop() tells the worker to stop (over its IPC channel), then sends SIGKILL after this long. */
const stopGraceMs = 5_000;

/** The delay before each restart of one worker, from how long each run lasted. */
export class RestartBackoff {
  private numQuickRestarts = 0;

  constructor(
    private readonly firstDelayMs = firstRestartDelayMs,
    private readonly maxDelayMs = maxRestartDelayMs,
    private readonly healthyMs = healthyUptimeMs,
  ) {}

  /** The worker exited after uptimeMs; returns how long to wait before starting it again. */
  nextDelayMs(uptimeMs: number): number {
    if (uptimeMs >= this.healthyMs) this.numQuickRestarts = 0;
    return Math.min(this.maxDelayMs, this.firstDelayMs * 2 ** this.numQuickRestarts++);
  }
}

/** What a worker spawned here sends over the IPC channel when it cannot start, before it exits (bin/cli.ts). */
export interface WorkerStartFailure {
  type: 'start_failed';
  message: string;
}

export interface LocalWorkerOptions {
  /** The worker's command line after `conduit`, given the address it is to listen on. */
  args: (listen: string) => string[];
  /** Unique among this gateway's workers: names its socket and its log lines. */
  name: string;
  /** Where its restarts, hangs and kills are told. */
  log: LifecycleLog;
  /** Called at each restart, with why the worker exited: `code N`, a signal's name, or `hung`. */
  onRestart?: (reason: string) => void;
}

/** What the watchdog reads of a worker's engine stream (a GrpcEngineClient). */
export interface EngineStream {
  /** performance.now() of the stream's latest message, on any stream to this address; -Infinity before the first. */
  readonly lastMessageAtMs: number;
  /** Opens the stream now if it is down. */
  connect(): void;
}

export class LocalWorker {
  readonly address: string;
  readonly name: string;
  /**
   * Rejects with a FatalError if the process exits before markServing(): a worker that never
   * served (a checkpoint that does not load, a bad setting) would only fail again, so it is the
   * server's failure, not one to restart.
   */
  readonly startFailure: Promise<never>;
  private rejectStart: (error: FatalError) => void = () => {};
  private hasServed = false;
  private child: ChildProcess | null = null;
  /** performance.now() when the running process was spawned. */
  private spawnedAtMs = 0;
  /** performance.now() when the watchdog first found the running process listening (its model loaded); null before. */
  private listeningAtMs: number | null = null;
  /** Set when this gateway kills the process for a reason its exit status does not tell (a hang). */
  private killReason: string | null = null;
  private stopping = false;
  private readonly backoff = new RestartBackoff();
  private restartTimer: NodeJS.Timeout | null = null;
  private watchdogTimer: NodeJS.Timeout | null = null;

  constructor(private readonly options: LocalWorkerOptions) {
    this.name = options.name;
    const socketPath = path.join(os.tmpdir(), `conduit-${process.pid}-${options.name}.sock`);
    this.address = `unix:${socketPath}`;
    this.startFailure = new Promise<never>((_resolve, reject) => (this.rejectStart = reject));
    // Awaited only while the server starts; later it never settles.
    this.startFailure.catch(() => {});
  }

  start(): void {
    rmSync(this.address.slice('unix:'.length), { force: true });
    const child = spawn(process.execPath, [conduitBin, ...this.options.args(this.address)], {
      // The IPC channel carries the stop and is the lifeline: the worker exits when it closes, so
      // a gateway that dies without cleaning up (SIGKILL, a crash) leaves no orphan workers
      // behind. The worker ignores SIGTERM and SIGINT, which a process group's signal (Ctrl-C, a
      // process manager's stop) sends it beside the gateway: the gateway drains first, then stops it.
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
      env: { ...process.env, [SUPERVISED_WORKER_ENV]: '1' },
    });
    this.child = child;
    this.spawnedAtMs = performance.now();
    this.listeningAtMs = null;
    const spawnedAtMs = this.spawnedAtMs;
    // Why it could not start, when it says so (bin/cli.ts, runWorker) before it exits.
    let startFailure: string | null = null;
    child.on('message', (message: Partial<WorkerStartFailure>) => {
      if (message.type === 'start_failed' && typeof message.message === 'string') startFailure = message.message;
    });
    child.once('exit', (code, signal) => {
      this.child = null;
      const reason = this.killReason ?? signal ?? `code ${code}`;
      this.killReason = null;
      if (this.stopping) return;
      if (!this.hasServed) {
        // The channel's last message may be read after the exit is seen: wait for it to close.
        const fail = () => this.rejectStart(new FatalError(startFailure === null
          ? `worker ${this.name} exited (${reason}) before it served; its output is above`
          : `worker ${this.name} cannot start: ${startFailure}`));
        if (child.connected) child.once('disconnect', fail);
        else fail();
        return;
      }
      const delayMs = this.backoff.nextDelayMs(performance.now() - spawnedAtMs);
      this.options.log.workerRestarting(this.name, reason, delayMs);
      this.options.onRestart?.(reason);
      this.restartTimer = setTimeout(() => this.start(), delayMs);
    });
  }

  /** The worker answered serving: from now on an exit is restarted, not fatal. */
  markServing(): void {
    this.hasServed = true;
  }

  /**
   * Kills the worker as hung once the running process stays silent on its engine stream for
   * timeoutMs (a worker sends a message as a stream opens, and a heartbeat every second when
   * idle), counting from its latest message or, before its first, from when it was found
   * listening: a worker that hangs right after it loaded, before it said anything, is caught too.
   * A restarted process not listening within readyTimeoutMs (its load hung) is killed likewise;
   * the first start has the server's own ready timeout.
   */
  watchHeartbeats(stream: EngineStream, timeoutMs: number, readyTimeoutMs: number): void {
    const checkIntervalMs = Math.min(1_000, timeoutMs / 4);
    const socketPath = this.address.slice('unix:'.length);
    let lastCheckAtMs = performance.now();
    this.watchdogTimer = setInterval(() => {
      const nowMs = performance.now();
      // This event loop stalled: what the worker sent meanwhile may still be unread. Look next time.
      const isLate = nowMs - lastCheckAtMs > 2 * checkIntervalMs;
      lastCheckAtMs = nowMs;
      if (isLate || this.child === null || this.killReason !== null) return;
      const heardAtMs = stream.lastMessageAtMs;
      if (heardAtMs < this.spawnedAtMs) {
        // Not heard from this process yet. It listens once its model has loaded (start() removed
        // the socket of the one before); until then it is loading, bounded by the ready timeout.
        if (this.listeningAtMs === null) {
          if (!existsSync(socketPath)) {
            const loadingMs = nowMs - this.spawnedAtMs;
            if (loadingMs > readyTimeoutMs) {
              this.options.log.workerNotReady(this.name, loadingMs);
              this.kill('not ready');
            }
            return;
          }
          this.listeningAtMs = nowMs;
        }
        // The stream reopens now, not when its backoff ends: a live worker answers at once.
        stream.connect();
      }
      const silentMs = nowMs - Math.max(heardAtMs, this.listeningAtMs ?? -Infinity);
      if (silentMs <= timeoutMs) return;
      this.options.log.workerHung(this.name, silentMs);
      this.kill('hung');
    }, checkIntervalMs);
    this.watchdogTimer.unref();
  }

  /** Kills the running process for a reason its exit status will not tell; it restarts with backoff. */
  private kill(reason: string): void {
    this.killReason = reason;
    // SIGKILL: a stopped or spinning process would not act on SIGTERM.
    this.child?.kill('SIGKILL');
  }

  /** Resolves once the process is gone. */
  async stop(): Promise<void> {
    this.stopping = true;
    if (this.restartTimer) clearTimeout(this.restartTimer);
    if (this.watchdogTimer) clearInterval(this.watchdogTimer);
    const child = this.child;
    if (!child) return;
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    // A worker that lost its channel already exits on its own. SIGTERM too, for a worker still
    // starting (not yet listening for the message), which it ends; a running one ignores it.
    if (child.connected) child.send({ type: 'stop' }, () => {});
    child.kill('SIGTERM');
    const killTimer = setTimeout(() => {
      this.options.log.workerStopKilled(this.name, stopGraceMs);
      child.kill('SIGKILL');
    }, stopGraceMs);
    await exited;
    clearTimeout(killTimer);
  }
}
