// A worker thread of the offload pool: runs each job it is sent and posts back the value, or the
// error as plain data (an ApiError's fields; anything else as an internal error's detail).
import { parentPort } from 'node:worker_threads';
import { ApiError } from '../errors.ts';
import { runJob, type Job } from './jobs.ts';

export interface JobMessage {
  id: number;
  job: Job;
}

export type ResultMessage =
  | { id: number; value: unknown }
  | { id: number; error: { code: ApiError['code']; message: string; param: string | null; detail: string | null } };

// The thread runs at the process's own priority. A pooled prompt's tokenization is on its
// request's TTFT path: at nice 10 beside a worker's busy compute threads it took 2-5x as long
// (p50 87-205 ms against 39-41 ms for 1,681 tokens, 2 busy nice-0 threads, AMD EPYC 2 vCPUs,
// load average 26) and the event loop's delay p99 was no better (76-235 ms against 59 ms).

const port = parentPort!;

port.on('message', ({ id, job }: JobMessage) => {
  try {
    const { value, transfer } = runJob(job);
    port.postMessage({ id, value } satisfies ResultMessage, transfer);
  } catch (err) {
    const error =
      err instanceof ApiError
        ? { code: err.code, message: err.message, param: err.param, detail: err.detail }
        : { code: 'internal_error' as const, message: 'internal_error', param: null, detail: (err as Error).stack ?? String(err) };
    port.postMessage({ id, error } satisfies ResultMessage);
  }
});
