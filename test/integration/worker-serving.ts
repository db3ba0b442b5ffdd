// When a `conduit worker` started on its own serves, for the tests and tools that start one: its
// address, from its log.
import type { ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';

/**
 * The address a `conduit worker` spawned with piped stdout and stderr listens on, from its
 * `worker serving` log line; rejects if it exits first. Its output goes on being read (a full
 * pipe would block the worker's log), into output().
 */
export function workerServing(child: ChildProcess): { address: Promise<string>; output: () => string } {
  let output = '';
  child.stderr!.on('data', (data: Buffer) => (output += data.toString()));
  const address = new Promise<string>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on('line', (line) => {
      output += `${line}\n`;
      const entry = parseLogLine(line);
      if (entry?.msg === 'worker serving' && typeof entry.address === 'string') resolve(entry.address);
    });
    child.once('exit', (code, signal) => reject(new Error(`worker exited (${signal ?? code}) before serving:\n${output}`)));
  });
  return { address, output: () => output };
}

function parseLogLine(line: string): Record<string, unknown> | null {
  try {
    return JSON.parse(line) as Record<string, unknown>;
  } catch {
    return null;
  }
}
