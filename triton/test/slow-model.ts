// A real script-backend model for scheduler tests: it sleeps for the largest DELAY_MS of its
// batch and reports what it saw (batch rows, instance, start and end time), so tests observe
// the batcher through a model, not a mock.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { within } from '../../test/wait.ts';
import { ModelRepository } from '../repository.ts';
import type { Tensor } from '../tensor.ts';

const SLOW_MODEL_TS = `
let instanceIndex = -1;
export function initialize(args) { instanceIndex = args.instanceIndex; }
export async function execute(inputs) {
  const delays = inputs.DELAY_MS.data;
  const rows = inputs.DELAY_MS.shape[0];
  const startMs = performance.now();
  await new Promise((resolve) => setTimeout(resolve, Math.max(...delays)));
  const endMs = performance.now();
  const column = (datatype, value) => ({ datatype, shape: [rows, 1], data: datatype === 'INT32' ? new Int32Array(rows).fill(value) : new Float64Array(rows).fill(value) });
  return { BATCH_ROWS: column('INT32', rows), INSTANCE: column('INT32', instanceIndex), START_MS: column('FP64', startMs), END_MS: column('FP64', endMs) };
}
`;

/**
 * The longest one request may take, queue and run: every delay these tests configure is under a
 * second, so a batcher that holds a request (ignoring its queue delay, losing a wake-up) fails the
 * test that sent it, by name, instead of stalling the file until the runner's timeout.
 */
export const INFER_BOUND_MS = 10_000;

export interface SlowRepo {
  repo: ModelRepository;
  /** One request of `rows` rows; X has `width` elements per row. */
  infer(model: string, options?: { delayMs?: number; rows?: number; width?: number; priority?: number; timeoutUs?: number }): Promise<SlowResult>;
  close(): Promise<void>;
}

export interface SlowResult { batchRows: number; instance: number; startMs: number; endMs: number }

/**
 * A repository of slow models, one per config body (the part after the common header). Names
 * starting with `ragged` declare X with allow_ragged_batch.
 */
export async function startSlowRepo(models: Record<string, string>): Promise<SlowRepo> {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-slow-'));
  for (const [name, body] of Object.entries(models)) {
    mkdirSync(path.join(dir, name, '1'), { recursive: true });
    writeFileSync(path.join(dir, name, '1', 'model.ts'), SLOW_MODEL_TS);
    const ragged = name.startsWith('ragged') ? ' allow_ragged_batch: true' : '';
    writeFileSync(path.join(dir, name, 'config.pbtxt'), `backend: "script"
input [ { name: "DELAY_MS" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "X" data_type: TYPE_FP32 dims: [ -1 ] optional: true${ragged} } ]
output [
  { name: "BATCH_ROWS" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "INSTANCE" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "START_MS" data_type: TYPE_FP64 dims: [ 1 ] }, { name: "END_MS" data_type: TYPE_FP64 dims: [ 1 ] }
]
${body}`);
  }
  const repo = new ModelRepository({ repoDir: dir, mode: 'none', pollIntervalMs: 1000, startupModels: [] });
  await within(repo.start(), 'the slow models did not load');
  return {
    repo,
    async infer(model, { delayMs = 0, rows = 1, width, priority = 0, timeoutUs = 0 } = {}) {
      const inputs: Record<string, Tensor> = { DELAY_MS: { datatype: 'INT32', shape: [rows, 1], data: new Int32Array(rows).fill(delayMs) } };
      if (width !== undefined) inputs.X = { datatype: 'FP32', shape: [rows, width], data: new Float32Array(rows * width) };
      const outputs = await within(
        repo.infer(model, null, { inputs, requestedOutputs: null, priority, timeoutUs }),
        `a request to '${model}' (${rows} rows, priority ${priority}, timeout ${timeoutUs} µs) was not answered`, INFER_BOUND_MS,
      );
      const first = (name: string) => Number((outputs[name].data as Int32Array | Float64Array)[0]);
      return { batchRows: first('BATCH_ROWS'), instance: first('INSTANCE'), startMs: first('START_MS'), endMs: first('END_MS') };
    },
    async close() {
      await within(repo.close(), 'the slow models did not unload');
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Lets the event loop turn, so queued requests reach the batcher in order. */
export const tick = () => new Promise((resolve) => setImmediate(resolve));
