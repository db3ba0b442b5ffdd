// ONNX Runtime instances: each one a session on a worker thread (onnx-worker.js), so N instances
// run N batches at once and never block the event loop.
import { existsSync } from 'node:fs';
import path from 'node:path';
import { Worker } from 'node:worker_threads';
import type { InstanceSpec, ModelInstance, TensorMap } from './backend.ts';
import { fromConfigDataType, type DataType } from './datatype.ts';
import { ClassicError } from './errors.ts';
import { sequenceInputNames, stateOnlyOutputs } from './sequence-inputs.ts';
import { fileInRepository, shownPath, withShownPaths } from './repository-paths.ts';
import type { Tensor } from './tensor.ts';

const ORT_TYPES: Partial<Record<DataType, string>> = {
  BOOL: 'bool', UINT8: 'uint8', UINT16: 'uint16', UINT32: 'uint32', UINT64: 'uint64',
  INT8: 'int8', INT16: 'int16', INT32: 'int32', INT64: 'int64', FP16: 'float16', FP32: 'float32', FP64: 'float64', BYTES: 'string',
};

interface WorkerOutput { name: string; type: string; data: ArrayLike<unknown>; dims: number[] }
type Pending = { resolve: (outputs: WorkerOutput[]) => void; reject: (err: Error) => void };

/** Triton's reshape: the model sees [batch, ...reshape.shape] where clients send [batch, ...dims]. */
function reshapeFor(batched: boolean, shape: number[], reshape: number[] | undefined): number[] {
  if (reshape === undefined) return shape;
  return batched ? [shape[0], ...reshape] : reshape;
}

class OnnxInstance implements ModelInstance {
  private nextId = 0;
  private readonly pending = new Map<number, Pending>();
  private failure: Error | null = null;
  private readonly outputNames: string[];
  /** Inputs the batchers make (batch_input targets, sequence controls and states): fed as they are. */
  private readonly madeInputNames: string[];
  /** The config's outputs, then the state outputs it does not list. */
  private readonly outputTypes: Array<{ name: string; datatype: DataType; declared?: InstanceSpec['config']['output'][number] }>;

  constructor(private readonly worker: Worker, private readonly spec: InstanceSpec) {
    const { config } = spec;
    this.outputTypes = [
      ...config.output.map((declared) => ({ name: declared.name, datatype: fromConfigDataType(declared.data_type), declared })),
      ...stateOnlyOutputs(config),
    ];
    this.outputNames = this.outputTypes.map((output) => output.name);
    this.madeInputNames = [...config.batch_input.flatMap((batchInput) => batchInput.target_name), ...sequenceInputNames(config)];
    worker.on('message', (message: { type: string; id: number; outputs?: WorkerOutput[]; message?: string }) => {
      const entry = this.pending.get(message.id);
      if (entry === undefined) return;
      this.pending.delete(message.id);
      if (message.type === 'result') entry.resolve(message.outputs!);
      else entry.reject(new ClassicError('INTERNAL', `onnxruntime: ${message.message}`));
    });
    const fail = (err: Error) => {
      this.failure = err;
      for (const entry of this.pending.values()) entry.reject(new ClassicError('INTERNAL', `onnxruntime worker failed: ${err.message}`));
      this.pending.clear();
    };
    worker.on('error', fail);
    worker.on('exit', (code) => fail(new Error(`exited with code ${code}`)));
  }

  async execute(inputs: TensorMap): Promise<TensorMap> {
    if (this.failure !== null) throw new ClassicError('INTERNAL', `onnxruntime worker failed: ${this.failure.message}`);
    const { config } = this.spec;
    const batched = config.max_batch_size > 0;
    const decoder = new TextDecoder();
    const feed = (name: string, tensor: Tensor, dims: number[]) => {
      const type = ORT_TYPES[tensor.datatype];
      if (type === undefined) throw new ClassicError('UNSUPPORTED', `onnxruntime does not take ${tensor.datatype} input '${name}'`);
      const data = tensor.datatype === 'BYTES' ? (tensor.data as Uint8Array[]).map((element) => decoder.decode(element)) : tensor.data;
      return { name, type, data, dims };
    };
    const feeds = config.input.filter((input) => inputs[input.name] !== undefined)
      .map((input) => feed(input.name, inputs[input.name], reshapeFor(batched, inputs[input.name].shape, input.reshape?.shape)));
    // What the batcher made for this batch (batch inputs, sequence controls and states), as it is.
    for (const name of this.madeInputNames) feeds.push(feed(name, inputs[name], inputs[name].shape));
    const id = this.nextId++;
    const outputs = await new Promise<WorkerOutput[]>((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.worker.postMessage({ type: 'run', id, feeds, outputNames: this.outputNames });
    });
    const encoder = new TextEncoder();
    const result: TensorMap = {};
    outputs.forEach((output, i) => {
      const { name, datatype, declared } = this.outputTypes[i];
      const data = output.type === 'string' ? (output.data as string[]).map((s) => encoder.encode(s)) : output.data;
      // Clients see the config's dims; the model may produce the reshape's.
      const shape = declared?.reshape === undefined ? output.dims : batched ? [output.dims[0], ...declared.dims] : declared.dims;
      result[name] = { datatype, shape, data } as Tensor;
    });
    return result;
  }

  async close(): Promise<void> {
    this.worker.postMessage({ type: 'close' });
    await new Promise((resolve) => this.worker.once('exit', resolve));
  }
}

/**
 * What the config says that the model does not (Triton's ONNX backend checks the same): an input
 * or output it does not have, or an input it needs that neither the requests nor the batcher
 * (batch_input) give. Null when they agree.
 */
function configMismatch(config: InstanceSpec['config'], inputNames: readonly string[], outputNames: readonly string[]): string | null {
  const given = new Set([...config.input.map((input) => input.name), ...config.batch_input.flatMap((spec) => spec.target_name), ...sequenceInputNames(config)]);
  for (const name of given) if (!inputNames.includes(name)) return `the configuration has input '${name}', which the model does not (it has ${inputNames.join(', ')})`;
  for (const name of inputNames) if (!given.has(name)) return `the model needs input '${name}', which the configuration does not give`;
  for (const name of [...config.output.map((output) => output.name), ...stateOnlyOutputs(config).map((output) => output.name)]) {
    if (!outputNames.includes(name)) return `the configuration has output '${name}', which the model does not (it has ${outputNames.join(', ')})`;
  }
  return null;
}

export async function createOnnxInstance(spec: InstanceSpec): Promise<ModelInstance> {
  const parts = [String(spec.version), spec.config.default_model_filename ?? 'model.onnx'];
  const file = fileInRepository(spec.modelDir, ...parts);
  const shownFile = shownPath(spec.modelDir, ...parts);
  if (!existsSync(file)) throw new ClassicError('NOT_FOUND', `${shownFile}: no such model file`);
  const numThreads = Number(spec.config.parameters.intra_op_thread_count?.string_value ?? 1);
  const worker = new Worker(new URL('./onnx-worker.js', import.meta.url), { workerData: { file, numThreads }, execArgv: [] });
  const names = await new Promise<{ inputNames: string[]; outputNames: string[] }>((resolve, reject) => {
    const onError = (err: Error) => reject(new ClassicError('INTERNAL', `${shownFile}: cannot load: ${withShownPaths(err.message, path.dirname(spec.modelDir))}`));
    worker.once('error', onError);
    worker.once('message', (message: { type: string; inputNames: string[]; outputNames: string[] }) => {
      worker.off('error', onError);
      if (message.type === 'ready') resolve(message);
    });
  });
  const mismatch = configMismatch(spec.config, names.inputNames, names.outputNames);
  if (mismatch !== null) {
    await new OnnxInstance(worker, spec).close();
    throw new ClassicError('INVALID_ARG', `unable to load model '${spec.config.name}': ${mismatch}`);
  }
  return new OnnxInstance(worker, spec);
}
