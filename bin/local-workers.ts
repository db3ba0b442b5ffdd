// Spawns and supervises the engine workers a configuration asks for on this machine: each a
// child process serving engine.proto on a local socket, restarted with backoff if it dies.
import { spawn, type ChildProcess } from 'node:child_process';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { rmSync } from 'node:fs';

const conduitBin = path.join(path.dirname(fileURLToPath(import.meta.url)), 'conduit.js');
const maxRestartDelayMs = 30_000;

export class LocalWorker {
  readonly address: string;
  private child: ChildProcess | null = null;
  private stopping = false;
  private numRestarts = 0;
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
    child.once('exit', (code, signal) => {
      this.child = null;
      if (this.stopping) return;
      const delayMs = Math.min(maxRestartDelayMs, 500 * 2 ** this.numRestarts++);
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
