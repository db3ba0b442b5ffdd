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
