// The timestamps a traced request collects on its way through a model (Triton's TIMESTAMPS trace
// level). Plain data: the gateway decides which requests are traced and writes the trace file;
// the served version and the batcher stamp what they see. Times are ns on the process's monotonic
// clock (performance.now()), as Triton's are on steady_clock: only differences mean anything.

export type TraceActivity =
  | 'REQUEST_START' | 'QUEUE_START' | 'COMPUTE_START' | 'COMPUTE_INPUT_END'
  | 'COMPUTE_OUTPUT_START' | 'COMPUTE_END' | 'REQUEST_END';

export interface TraceTimestamp {
  name: TraceActivity;
  ns: number;
}

/** performance.now() milliseconds as trace nanoseconds. */
export function traceNs(ms: number): number {
  return Math.round(ms * 1e6);
}
