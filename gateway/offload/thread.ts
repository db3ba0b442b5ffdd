// A worker thread of the offload pool: runs each job it is sent and posts back the value, or the
// error as plain data (an ApiError's fields; anything else as an internal error's detail).
import { setPriority } from 'node:os';
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

/** Nice 10: a tenth of the event loop's share of a core when the two contend. */
const BACKGROUND_NICE = 10;

// Tokenizing a large prompt is throughput work; the event loop's is latency work (every other
// request, stream and probe). On a machine with as many busy threads as cores the scheduler
// would split a core evenly between them and double every pause of the loop. Linux keeps a nice
// value per thread, and pid 0 is the calling thread; elsewhere it is the whole process, so this
// is left alone there. A sandbox that forbids even lowering it costs latency, not answers.
if (process.platform === 'linux') {
  try {
    setPriority(0, BACKGROUND_NICE);
  } catch {}
}

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
