// The real `conduit` command started as a user starts it, in its own process group, for the
// process-lifecycle tests: its log (JSON lines on stdout) and its stderr read as they come, its
// lifecycle events waited for, its process group ended after the test, and its children found in
// /proc.
import { spawn, type ChildProcess } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { createInterface } from 'node:readline';
import type { TestContext } from 'node:test';
import { repoRoot, within } from './harness.ts';

/** One JSON line of the log. */
export type LogEntry = Record<string, unknown>;

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

/** The addresses a `serving` (or `listening`) line names, with a wildcard host made loopback. */
export interface ServingAddresses {
  /** http://HOST:PORT */
  http: string;
  /** http://HOST:PORT of /metrics. */
  metrics: string;
  /** HOST:PORT of KServe gRPC; null without a model repository. */
  grpc: string | null;
}

export interface CliProcess {
  readonly child: ChildProcess;
  readonly pid: number;
  /** Its stderr so far: what comes before its logger (usage, configuration errors). */
  stderr(): string;
  /** Its stdout so far, line by line. */
  stdoutLines(): string[];
  /** Its log so far: the stdout lines that are JSON objects (`npm start` adds a banner that is not). */
  logEntries(): LogEntry[];
  /** Its log's lifecycle events so far (bin/lifecycle-log.ts), in order. */
  events(): string[];
  /** Its exit code (null when a signal ended it). */
  readonly exited: Promise<number | null>;
  /**
   * The first log line with that lifecycle `event` (or that matches), already written or to come;
   * rejects if the process exits first or after the wait bound.
   */
  waitFor(match: string | ((entry: LogEntry) => boolean), what?: string): Promise<LogEntry>;
  /** The addresses once it is serving. */
  serving(): Promise<ServingAddresses>;
}

export interface StartOptions {
  /** Flags for node before the script. */
  nodeArgs?: string[];
  /** The command instead of `node bin/conduit.js` (e.g. `npm start --`, or an image's entrypoint); args follow it. */
  command?: string[];
  cwd?: string;
  env?: NodeJS.ProcessEnv;
}

function loopback(address: string): string {
  return address.replace('0.0.0.0', '127.0.0.1');
}

/** A log entry's addresses (a `listening` or `serving` line). */
export function addressesOf(entry: LogEntry): ServingAddresses {
  const grpc = entry.grpc_address as string | null;
  return { http: loopback(entry.http_address as string), metrics: loopback(entry.metrics_address as string), grpc: grpc === null ? null : loopback(grpc) };
}

/** `conduit ...args` in its own process group, ended (the whole group) after the test. */
export function startCli(t: TestContext, args: string[], options: StartOptions = {}): CliProcess {
  const command = options.command ?? [process.execPath, ...(options.nodeArgs ?? []), path.join(repoRoot, 'bin', 'conduit.js')];
  const child = spawn(command[0], [...command.slice(1), ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
    cwd: options.cwd ?? repoRoot,
    env: options.env ?? process.env,
  });
  const pid = child.pid!;
  t.after(() => killGroup(pid));
  let stderr = '';
  const lines: string[] = [];
  const listeners = new Set<() => void>();
  const notify = () => {
    for (const listener of listeners) listener();
  };
  child.stderr!.on('data', (data: Buffer) => {
    stderr += data.toString();
    notify();
  });
  const entries: LogEntry[] = [];
  createInterface({ input: child.stdout! }).on('line', (line) => {
    lines.push(line);
    try {
      entries.push(JSON.parse(line));
    } catch {
      // Not a log line; stdoutLines() still has it.
    }
    notify();
  });
  // 'close', not 'exit': by then all of its output has been read.
  const exited = new Promise<number | null>((resolve) => child.once('close', (code) => resolve(code)));
  /** Resolves with find's first non-null answer, looking again at each output; rejects on exit. */
  const waitUntil = <T>(find: () => T | null, what: string) => within(new Promise<T>((resolve, reject) => {
    const check = () => {
      const found = find();
      if (found === null) return;
      listeners.delete(check);
      resolve(found);
    };
    listeners.add(check);
    check();
    void exited.then(() => {
      check();
      reject(new Error(`conduit exited before ${what}:\n${lines.join('\n')}\n${stderr}`));
    });
  }), what);
  const process_: CliProcess = {
    child,
    pid,
    stderr: () => stderr,
    stdoutLines: () => [...lines],
    logEntries: () => [...entries],
    events: () => entries.flatMap((entry) => (typeof entry.event === 'string' ? [entry.event] : [])),
    exited,
    waitFor(match, what) {
      const matches = typeof match === 'string' ? (entry: LogEntry) => entry.event === match : match;
      return waitUntil(() => entries.find(matches) ?? null, what ?? (typeof match === 'string' ? `the ${match} line` : 'a log line'));
    },
    async serving() {
      return addressesOf(await process_.waitFor('serving'));
    },
  };
  return process_;
}
