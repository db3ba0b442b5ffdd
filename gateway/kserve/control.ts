// The server-wide state behind Triton's shared-memory, trace and logging extensions, one object
// shared by the HTTP routes and the gRPC service (a region registered over one is used over the
// other). Whoever creates it closes it, after both servers have closed.
import { LogSettings } from './log-settings.ts';
import { SystemSharedMemory } from './shared-memory.ts';
import { TraceManager } from './trace.ts';

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

  /** Writes buffered traces and closes every region. */
  close(): void {
    this.trace.close();
    this.sharedMemory.close();
  }
}
