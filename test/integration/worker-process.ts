// `conduit worker` processes started on their own, as on other machines, for tests that need to
// kill, pause or count them.
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import path from 'node:path';
import { defaultModelDir, repoRoot } from './harness.ts';
import { workerServing } from './worker-serving.ts';

export interface WorkerProcess {
  /** HOST:PORT it listens on. */
  address: string;
  child: ChildProcess;
  /** Everything it wrote so far: its JSON log (stdout) and stderr. */
  log(): string;
  /** SIGTERM (or the signal given), resolving once it exited. */
  stop(signal?: NodeJS.Signals): Promise<void>;
}

/** Starts `conduit worker` on conduit-tiny with one thread on a free loopback port, plus extraArgs. */
export async function startWorkerProcess(extraArgs: string[] = []): Promise<WorkerProcess> {
  const child = spawn(process.execPath, [
    path.join(repoRoot, 'bin', 'conduit.js'), 'worker', '--model', defaultModelDir,
    '--listen', '127.0.0.1:0', '--threads', '1', ...extraArgs,
  ], {
    // The IPC channel is a lifeline, as for a gateway's own workers: a test process that dies
    // (a timeout, a crash) takes its workers with it instead of leaving them serving.
    stdio: ['ignore', 'pipe', 'pipe', 'ipc'],
  });
  // The lifeline must not keep a finished test process alive by itself.
  child.channel?.unref();
  const serving = workerServing(child);
  return {
    address: await serving.address,
    child,
    log: serving.output,
    async stop(signal = 'SIGTERM') {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = once(child, 'exit');
      child.kill(signal);
      await exited;
    },
  };
}
