// Spawns and supervises the engine workers a configuration asks for on this machine: each a
// child process serving engine.proto on a local socket, restarted with backoff if it dies. The
// backoff doubles while a worker keeps dying soon after it starts and starts over once one has
// run well for a while, so a crash hours after the last costs half a second, not the cap.
import { spawn, type ChildProcess } from 'node:child_process';
import os from 'node:os';
import path from 'node:path';
import { rmSync } from 'node:fs';
import { packageRoot } from '../package-root.ts';

const conduitBin = path.join(packageRoot, 'bin', 'conduit.js');
const firstRestartDelayMs = 500;
const maxRestartDelayMs = 30_000;
/** A worker up this long before it died was healthy: its restart starts the backoff over. */
const healthyUptimeMs = 60_000;

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

export class LocalWorker {
  readonly address: string;
  private child: ChildProcess | null = null;
  private stopping = false;
  private readonly backoff = new RestartBackoff();
  private restartTimer: NodeJS.Timeout | null = null;

  constructor(
    private readonly args: (listen: string) => string[],
    readonly name: string,
  ) {
    const socketPath = path.join(os.tmpdir(), `conduit-${process.pid}-${name}.sock`);
    this.address = `unix:${socketPath}`;
  }

  start(): void {
    rmSync(this.address.slice('unix:'.length), { force: true });
    const child = spawn(process.execPath, [conduitBin, ...this.args(this.address)], {
      // The IPC channel is only a lifeline: the worker exits when it closes, so a gateway
      // that dies without cleaning up (SIGKILL, a crash) leaves no orphan workers behind.
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    this.child = child;
    const startedAtMs = performance.now();
    child.once('exit', (code, signal) => {
      this.child = null;
      if (this.stopping) return;
      const delayMs = this.backoff.nextDelayMs(performance.now() - startedAtMs);
      console.error(`worker ${this.name} exited (${signal ?? `code ${code}`}); restarting in ${delayMs} ms`);
      this.restartTimer = setTimeout(() => this.start(), delayMs);
    });
  }

  /** Resolves once the process is gone. */
  async stop(): Promise<void> {
    this.stopping = true;
    if (this.restartTimer) clearTimeout(this.restartTimer);
    const child = this.child;
    if (!child) return;
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    child.kill('SIGTERM');
    const killTimer = setTimeout(() => {
      console.error(`worker ${this.name} still running 5 s after SIGTERM; killed`);
      child.kill('SIGKILL');
    }, 5_000);
    await exited;
    clearTimeout(killTimer);
  }
}
