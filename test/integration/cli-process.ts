// The real `conduit` command started as a user starts it, in its own process group, for the
// process-lifecycle tests: its stderr read as it comes, its process group ended after the test,
// and its children found in /proc.
import { spawn, type ChildProcess } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import type { TestContext } from 'node:test';
import { repoRoot, within } from './harness.ts';

/** Ends a test's detached process group, whatever is left of it. */
export function killGroup(groupId: number): void {
  try {
    process.kill(-groupId, 'SIGKILL');
  } catch {
    // The group is gone already.
  }
}

/** Resolves once no process of the group is left (signal 0 finds none). */
export async function groupEmptied(groupId: number): Promise<void> {
  for (;;) {
    try {
      process.kill(-groupId, 0);
    } catch {
      return;
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** The ids of the processes whose parent is parentId, each with its command line. */
export function childProcesses(parentId: number): { pid: number; commandLine: string }[] {
  const children: { pid: number; commandLine: string }[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      // After the command name, which may hold spaces and parentheses: state, then the parent's id.
      const parentIdField = stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1];
      if (Number(parentIdField) !== parentId) continue;
      children.push({ pid: Number(entry), commandLine: readFileSync(`/proc/${entry}/cmdline`, 'utf8').replaceAll('\0', ' ') });
    } catch {
      // The process ended while we looked.
    }
  }
  return children;
}

export interface CliProcess {
  readonly child: ChildProcess;
  readonly pid: number;
  /** Its stderr so far. */
  stderr(): string;
  /** Its exit code (null when a signal ended it). */
  readonly exited: Promise<number | null>;
  /** The first match of pattern in its stderr; rejects if it exits first or after the wait bound. */
  waitFor(pattern: RegExp, what: string): Promise<RegExpExecArray>;
}

/** `conduit ...args` in its own process group, ended (the whole group) after the test; nodeArgs go to node before the script. */
export function startCli(t: TestContext, args: string[], nodeArgs: string[] = []): CliProcess {
  const child = spawn(process.execPath, [...nodeArgs, path.join(repoRoot, 'bin', 'conduit.js'), ...args], {
    stdio: ['ignore', 'ignore', 'pipe'],
    detached: true,
  });
  const pid = child.pid!;
  t.after(() => killGroup(pid));
  let stderr = '';
  const listeners = new Set<() => void>();
  child.stderr!.on('data', (data: Buffer) => {
    stderr += data.toString();
    for (const listener of listeners) listener();
  });
  // 'close', not 'exit': by then all of its stderr has been read.
  const exited = new Promise<number | null>((resolve) => child.once('close', (code) => resolve(code)));
  return {
    child,
    pid,
    stderr: () => stderr,
    exited,
    waitFor(pattern, what) {
      return within(new Promise<RegExpExecArray>((resolve, reject) => {
        const check = () => {
          const match = pattern.exec(stderr);
          if (match === null) return;
          listeners.delete(check);
          resolve(match);
        };
        listeners.add(check);
        check();
        void exited.then(() => {
          check();
          reject(new Error(`conduit exited before ${what}:\n${stderr}`));
        });
      }), what);
    },
  };
}
