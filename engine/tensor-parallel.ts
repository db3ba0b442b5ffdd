// The ranks > 0 of a worker's tensor-parallel group: `conduit rank` processes on this machine,
// each loading its shard and serving the passes the worker (rank 0) runs, joined through the
// shared-memory segment /dev/shm/<group>. A rank stops when the worker closes its model, and on
// its own when the worker dies; the group lives and dies as one.
import { spawn, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import path from 'node:path';
import type { LoadOptions, Quantization } from '../native/api.ts';
import { packageRoot } from '../package-root.ts';

const conduitBin = path.join(packageRoot, 'bin', 'conduit.js');
/** stop() waits this long for a rank to end after the worker's model closed, then kills it. */
const stopGraceMs = 5_000;

/** What each rank loads: the worker's own load options, with the group's size. */
export interface RankSettings
  extends Pick<LoadOptions, 'modelDir' | 'dtype' | 'kvCacheDtype' | 'numKvBlocks' | 'blockSizeTokens' | 'numThreads' | 'kernel' | 'maxModelLen'> {
  quantization: Quantization;
  tensorParallelSize: number;
}

export interface RankProcesses {
  /** The segment's name, for the worker's own load as rank 0. */
  readonly group: string;
  /** Ranks 1.. by rank. */
  readonly pids: number[];
  /** Rejects... never; resolves with why, the first time a rank exits before stop(). */
  readonly lost: Promise<Error>;
  /** Waits for every rank to end (they do once rank 0's model is closed), killing any that lingers. */
  stop(): Promise<void>;
}

/** The `conduit rank` command line of one rank, as an operator would type it on another terminal. */
export function rankArgs(settings: RankSettings, rank: number, group: string): string[] {
  const args = [
    'rank', '--model', settings.modelDir, '--rank', String(rank), '--tensor-parallel-size', String(settings.tensorParallelSize),
    '--connect', `shm:${group}`, '--dtype', settings.dtype, '--kv-cache-dtype', settings.kvCacheDtype,
    '--kv-cache-blocks', String(settings.numKvBlocks), '--block-size', String(settings.blockSizeTokens),
    '--threads', String(settings.numThreads), '--kernel', settings.kernel, '--quantization', settings.quantization,
  ];
  if (settings.maxModelLen !== undefined) args.push('--max-model-len', String(settings.maxModelLen));
  return args;
}

export function startRanks(settings: RankSettings): RankProcesses {
  const group = `conduit-tp-${process.pid}-${randomUUID().slice(0, 8)}`;
  let stopping = false;
  let reportLost: (error: Error) => void = () => {};
  const lost = new Promise<Error>((resolve) => (reportLost = resolve));
  const children: ChildProcess[] = [];
  const ended: Promise<void>[] = [];
  for (let rank = 1; rank < settings.tensorParallelSize; rank++) {
    // stdin ignored, output shared with the worker's (its logs), no IPC: a rank follows rank 0
    // through the segment, and notices its death there.
    const child = spawn(process.execPath, [conduitBin, ...rankArgs(settings, rank, group)], { stdio: ['ignore', 'inherit', 'inherit'] });
    children.push(child);
    ended.push(
      new Promise<void>((resolve) => {
        child.once('error', (err) => {
          if (!stopping) reportLost(new Error(`tensor-parallel rank ${rank} could not start: ${err.message}`));
          resolve();
        });
        child.once('exit', (code, signal) => {
          if (!stopping) reportLost(new Error(`tensor-parallel rank ${rank} (process ${child.pid}) exited (${signal ?? `code ${code}`})`));
          resolve();
        });
      }),
    );
  }
  return {
    group,
    pids: children.map((child) => child.pid ?? 0),
    lost,
    async stop() {
      stopping = true;
      const timer = setTimeout(() => {
        for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      }, stopGraceMs);
      await Promise.all(ended);
      clearTimeout(timer);
    },
  };
}
