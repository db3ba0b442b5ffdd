// The server-wide state behind Triton's shared-memory, trace and logging extensions, one object
// shared by the HTTP routes and the gRPC service (a region registered over one is used over the
// other). Whoever creates it closes it, after both servers have closed.
import { classify, type InferRequest, type ServedVersion, type TensorMap } from '../../triton/index.ts';
import { LogSettings } from './log-settings.ts';
import { adminRefusal, type ApiKeySpec } from '../auth.ts';
import { refusedSharedMemory, SystemSharedMemory, writeSharedMemoryOutput, type SharedMemoryAccess, type SharedMemoryLease } from './shared-memory.ts';
import { TraceManager } from './trace.ts';

/** A requested output, and the region it goes into when the request named one. */
export interface OutputTarget {
  readonly name: string;
  readonly sharedMemory: SharedMemoryLease | null;
  /** The classification extension: the top this many classes as BYTES; 0 or absent: the tensor itself. */
  readonly classification?: number;
}

/** How refusals name the administrative surfaces, over HTTP and gRPC. */
export const SHARED_MEMORY_SURFACE = 'system shared memory';
export const CUDA_SHARED_MEMORY_SURFACE = 'CUDA shared memory';
export const REPOSITORY_SURFACE = 'the model repository API (load and unload)';
export const TRACE_SURFACE = 'the trace settings';
export const LOGGING_SURFACE = 'the log settings';

export interface KServeControlOptions {
  /** The trace file (a start-up setting, as Triton's `--trace-config triton,file=`); null for none. */
  traceFile?: string | null;
}

export class KServeControl {
  readonly sharedMemory = new SystemSharedMemory();
  readonly trace: TraceManager;
  readonly logging = new LogSettings();

  constructor(options: KServeControlOptions = {}) {
    this.trace = new TraceManager({ traceFile: options.traceFile ?? null });
  }

  /**
   * The regions a caller's infer requests may read and write: all of them for an admin key (or
   * on a server without keys), none for another key, since a region can be any /dev/shm object.
   */
  sharedMemoryFor(apiKey: ApiKeySpec | null): SharedMemoryAccess {
    const refusal = adminRefusal(apiKey, SHARED_MEMORY_SURFACE);
    return refusal === null ? this.sharedMemory : refusedSharedMemory(refusal);
  }

  /**
   * Runs a decoded request as HTTP and gRPC both do: traced when the trace settings sample it,
   * outputs that name a region written there. The regions the outputs hold are released at the
   * end, whatever happens.
   */
  async infer(served: ServedVersion, request: Omit<InferRequest, 'timestamps'>, requestId: string, targets: readonly OutputTarget[]): Promise<TensorMap> {
    const trace = this.trace.sample(served.config.name);
    try {
      if (trace !== null) this.trace.recordTensors(trace, 'TENSOR_QUEUE_INPUT', request.inputs);
      // A copy: the classification replaces tensors, and a cached result is shared.
      const outputs = { ...await served.infer({ ...request, timestamps: trace?.timestamps }) };
      if (trace !== null) this.trace.recordTensors(trace, 'TENSOR_BACKEND_OUTPUT', outputs);
      for (const { name, classification } of targets) {
        if (classification !== undefined && classification > 0) {
          outputs[name] = classify(outputs[name], name, classification, served.config.max_batch_size > 0, served.labels.get(name));
        }
      }
      for (const { name, sharedMemory } of targets) if (sharedMemory !== null) writeSharedMemoryOutput(sharedMemory, outputs[name], name);
      return outputs;
    } finally {
      for (const target of targets) target.sharedMemory?.release();
      if (trace !== null) this.trace.finish(trace, served.version, requestId);
    }
  }

  /** Writes buffered traces and closes every region. */
  close(): void {
    this.trace.close();
    this.sharedMemory.close();
  }
}
