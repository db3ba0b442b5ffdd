// A small pool of worker threads for the CPU work a large input brings (parsing its body,
// rendering its chat template, tokenizing it), so the event loop keeps serving every other
// request and stream meanwhile. Threads start on first use, at most numThreads of them; each
// loads a model's tokenizer the first time a job names it. Waiting jobs run cheapest first, so a
// modest prompt never queues behind a huge one; a job whose client has left is dropped unrun.
import { Worker } from 'node:worker_threads';
import { ApiError, publicError } from '../errors.ts';
import { estimatedCostUs, type Job, type JobResults } from './jobs.ts';
import type { JobMessage, ResultMessage } from './thread.ts';

export interface RunOptions {
  /** Checked when a thread frees up: false drops the job (its client is gone). */
  isWanted?: () => boolean;
  /** Buffers in the job that move to the thread instead of being copied. */
  transfer?: ArrayBuffer[];
}

interface Task {
  id: number;
  job: Job;
  costUs: number;
  options: RunOptions;
  resolve(value: unknown): void;
  reject(error: Error): void;
}

interface Thread {
  worker: Worker;
  task: Task | null;
}

/**
 * Compiled (dist/), the thread is thread.js beside this module. Run from the sources (the tests,
 * under tsx) it is TypeScript: a bootstrap registers tsx in the thread first, as Node 20 does not
 * pass loader hooks on to workers.
 */
function startThread(): Worker {
  if (import.meta.url.endsWith('.js')) return new Worker(new URL('./thread.js', import.meta.url));
  const bootstrap = `import(${JSON.stringify(import.meta.resolve('tsx/esm/api'))}).then((tsx) => {
  tsx.register();
  return import(${JSON.stringify(new URL('./thread.ts', import.meta.url).href)});
});`;
  return new Worker(bootstrap, { eval: true });
}

export class OffloadPool {
  private readonly numThreads: number;
  private readonly threads: Thread[] = [];
  private readonly waiting: Task[] = [];
  private nextTaskId = 0;
  private isClosed = false;

  constructor(numThreads: number) {
    this.numThreads = Math.max(1, numThreads);
  }

  run<K extends Job['kind']>(job: Extract<Job, { kind: K }>, options: RunOptions = {}): Promise<JobResults[K]> {
    if (this.isClosed) return Promise.reject(new ApiError('engine_unavailable', 'The server is shutting down.'));
    return new Promise((resolve, reject) => {
      const task = { id: this.nextTaskId++, job, costUs: estimatedCostUs(job), options, resolve, reject } as Task;
      this.waiting.push(task);
      this.dispatch();
    });
  }

  /** Stops every thread; jobs still waiting or running fail. */
  async close(): Promise<void> {
    this.isClosed = true;
    const shuttingDown = new ApiError('engine_unavailable', 'The server is shutting down.');
    for (const task of this.waiting.splice(0)) task.reject(shuttingDown);
    await Promise.all(this.threads.splice(0).map(({ worker, task }) => {
      task?.reject(shuttingDown);
      return worker.terminate();
    }));
  }

  private dispatch() {
    while (this.waiting.length > 0) {
      const thread = this.threads.find((candidate) => candidate.task === null) ?? this.spawn();
      if (thread === null) return;
      const task = this.takeCheapest();
      if (task === null) return;
      thread.task = task;
      thread.worker.postMessage({ id: task.id, job: task.job } satisfies JobMessage, task.options.transfer ?? []);
    }
  }

  /** The cheapest waiting job whose client still wants it; the others it passes are dropped. */
  private takeCheapest(): Task | null {
    for (let index = this.waiting.length - 1; index >= 0; index--) {
      const task = this.waiting[index];
      if (task.options.isWanted?.() === false) {
        this.waiting.splice(index, 1);
        task.reject(new ApiError('invalid_request', 'The client left before its input was processed.'));
      }
    }
    if (this.waiting.length === 0) return null;
    let cheapest = 0;
    for (let index = 1; index < this.waiting.length; index++) {
      if (this.waiting[index].costUs < this.waiting[cheapest].costUs) cheapest = index;
    }
    return this.waiting.splice(cheapest, 1)[0];
  }

  private spawn(): Thread | null {
    if (this.threads.length >= this.numThreads) return null;
    const worker = startThread();
    // The pool must not keep a process alive that is otherwise done.
    worker.unref();
    const thread: Thread = { worker, task: null };
    this.threads.push(thread);
    worker.on('message', (message: ResultMessage) => {
      const task = thread.task;
      if (task === null || task.id !== message.id) return;
      thread.task = null;
      if ('error' in message) {
        const { code, message: text, param, detail } = message.error;
        task.reject(code === 'internal_error' ? publicError(code, detail ?? text) : new ApiError(code, text, param, detail));
      } else {
        task.resolve(message.value);
      }
      this.dispatch();
    });
    // A thread that dies (out of memory, a crash in native code) costs its one job; the next
    // job starts a fresh thread.
    const onDeath = (reason: string) => {
      const index = this.threads.indexOf(thread);
      if (index === -1) return;
      this.threads.splice(index, 1);
      thread.task?.reject(publicError('internal_error', `An offload thread died: ${reason}`));
      thread.task = null;
      if (!this.isClosed) this.dispatch();
    };
    worker.on('error', (err) => onDeath(err.stack ?? err.message));
    worker.on('exit', (code) => onDeath(`exit code ${code}`));
    return thread;
  }
}
