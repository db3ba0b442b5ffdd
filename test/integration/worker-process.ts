// `conduit worker` processes started on their own, as on other machines, for tests that need to
// kill, pause or count them.
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import path from 'node:path';
import { defaultModelDir, repoRoot } from './harness.ts';

export interface WorkerProcess {
  /** HOST:PORT it listens on. */
  address: string;
  child: ChildProcess;
  /** Everything it wrote to stderr so far. */
  log(): string;
  /** SIGTERM (or the signal given), resolving once it exited. */
  stop(signal?: NodeJS.Signals): Promise<void>;
}

/** Starts `conduit worker` on conduit-tiny with one thread on a free loopback port, plus extraArgs. */
export async function startWorkerProcess(extraArgs: string[] = []): Promise<WorkerProcess> {
  const child = spawn(process.execPath, [
    path.join(repoRoot, 'bin', 'conduit.js'), 'worker', '--model', defaultModelDir,
    '--listen', '127.0.0.1:0', '--threads', '1', ...extraArgs,
  ], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr!.on('data', (data: Buffer) => (stderr += data.toString()));
  const address = await new Promise<string>((resolve, reject) => {
    const onData = () => {
      const match = / on (127\.0\.0\.1:\d+)/.exec(stderr);
      if (match) {
        child.stderr!.off('data', onData);
        resolve(match[1]);
      }
    };
    child.stderr!.on('data', onData);
    child.once('exit', () => reject(new Error(`worker exited before listening:\n${stderr}`)));
  });
  return {
    address,
    child,
    log: () => stderr,
    async stop(signal = 'SIGTERM') {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = once(child, 'exit');
      child.kill(signal);
      await exited;
    },
  };
}
