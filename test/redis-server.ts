// A real redis-server for tests: the Debian package's binary on a free loopback port, its files
// in a temporary directory, nothing persisted. It can be stopped and started again on the same
// port, empty, as a Redis that restarted.
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { freePort } from '../tools/free-port.ts';

const READY_TIMEOUT_MS = 10_000;

export interface RedisServer {
  readonly url: string;
  readonly port: number;
  /** Stops the server (SIGTERM), resolving once it exited. */
  stop(): Promise<void>;
  /** Starts it again on the same port, empty. */
  start(): Promise<void>;
  /** Stops it and removes its directory. */
  close(): Promise<void>;
}

async function launch(port: number, dir: string): Promise<ChildProcess> {
  const child = spawn('redis-server', [
    '--port', String(port), '--bind', '127.0.0.1', '--dir', dir,
    '--save', '', '--appendonly', 'no', '--protected-mode', 'no', '--daemonize', 'no', '--loglevel', 'warning',
  ], { stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout!.on('data', (data: Buffer) => (output += data.toString()));
  child.stderr!.on('data', (data: Buffer) => (output += data.toString()));
  const failed = new Promise<never>((_, reject) => {
    child.once('error', (err) => reject(new Error(`cannot start redis-server (apt-get install redis-server): ${err.message}`)));
    child.once('exit', (code) => reject(new Error(`redis-server exited with ${code}:\n${output}`)));
  });
  const deadline = Date.now() + READY_TIMEOUT_MS;
  while (Date.now() < deadline) {
    const isUp = await Promise.race([
      new Promise<boolean>((resolve) => {
        const socket = net.connect(port, '127.0.0.1');
        socket.once('connect', () => socket.write('PING\r\n'));
        socket.once('data', (data) => {
          socket.destroy();
          resolve(data.toString().startsWith('+PONG'));
        });
        socket.once('error', () => resolve(false));
      }),
      failed,
    ]);
    if (isUp) return child;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  child.kill('SIGKILL');
  throw new Error(`redis-server not ready on port ${port} after ${READY_TIMEOUT_MS} ms:\n${output}`);
}

export async function startRedisServer(): Promise<RedisServer> {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-redis-'));
  const port = await freePort();
  let child: ChildProcess | null = await launch(port, dir);
  const stop = async () => {
    const running = child;
    child = null;
    if (running === null || running.exitCode !== null) return;
    const exited = once(running, 'exit');
    running.kill('SIGTERM');
    await exited;
  };
  return {
    url: `redis://127.0.0.1:${port}`,
    port,
    stop,
    async start() {
      if (child === null) child = await launch(port, dir);
    },
    async close() {
      await stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
