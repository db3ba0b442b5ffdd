// Request ids and access lines for the KServe gRPC service, as gateway/logging.ts gives them to
// HTTP requests: the id is the client's `x-request-id` metadata when it is sound (the HTTP
// header's rule), else a new one, sent back in the response's initial metadata; every unary RPC,
// and every request message of a ModelStreamInfer stream, leaves one JSON line through the
// gateway's pino logger. A line names the RPC, the model and version when there is one, the gRPC
// status by name, the duration and the request id; never a tensor.
import * as grpc from '@grpc/grpc-js';
import type { BaseLogger, Bindings } from 'pino';
import { REQUEST_ID_HEADER, requestIdOf } from '../logging.ts';

/** What the service needs of a logger: pino's, and fastify's `app.log` (which is pino). */
export interface GrpcLogger extends Pick<BaseLogger, 'level' | 'info' | 'error'> {
  child(bindings: Bindings): GrpcLogger;
}

/** The model a request names, read from its message: ModelInfer's fields, or the metadata RPCs'. */
export interface ModelRef {
  model: string;
  version: string;
}

/** What one access line tells, beside the call's request id. */
export interface AccessFields {
  /** The RPC's name in `inference.GRPCInferenceService`, e.g. `ModelInfer`. */
  method: string;
  model: ModelRef | null;
  code: grpc.status;
  /** A ModelInferRequest's own `id`, when it set one. */
  inferId?: string;
  /** The client cancelled the call, or its deadline passed, before the answer. */
  clientGone?: boolean;
}

const roundMs = (ms: number) => Math.round(ms * 10) / 10;

/** Names and ids are the client's to choose: a line keeps this much of each. */
const MAX_LOGGED_NAME_CHARS = 128;

/** The first maxChars of a string, never half a surrogate pair (which encodeURI refuses). */
export function clip(text: string, maxChars: number): string {
  if (text.length <= maxChars) return text;
  const end = /[\ud800-\udbff]/.test(text[maxChars - 1]) ? maxChars - 1 : maxChars;
  return text.slice(0, end);
}

/** One call's request id and the logger that stamps it on each line. */
export class CallLog {
  readonly requestId: string;
  readonly log: GrpcLogger;

  /** Reads the id from the call's metadata and sends it back at once, so failing calls carry it too. */
  constructor(call: grpc.ServerUnaryCall<unknown, unknown> | grpc.ServerDuplexStream<unknown, unknown>, logger: GrpcLogger) {
    // Two values are as unsound as two HTTP headers: neither is trusted.
    const values = call.metadata.get(REQUEST_ID_HEADER);
    this.requestId = requestIdOf(values.length === 1 && typeof values[0] === 'string' ? values[0] : undefined);
    const metadata = new grpc.Metadata();
    metadata.set(REQUEST_ID_HEADER, this.requestId);
    call.sendMetadata(metadata);
    this.log = logger.child({ request_id: this.requestId });
  }

  /** The access line of a call (or of one request message on a stream) that began at `startMs`. */
  complete(fields: AccessFields, startMs: number): void {
    const line: Record<string, unknown> = { protocol: 'grpc', method: fields.method };
    if (fields.model !== null && fields.model.model !== '') {
      line.model = clip(fields.model.model, MAX_LOGGED_NAME_CHARS);
      if (fields.model.version !== '') line.model_version = clip(fields.model.version, MAX_LOGGED_NAME_CHARS);
    }
    if (fields.inferId !== undefined && fields.inferId !== '') line.infer_id = clip(fields.inferId, MAX_LOGGED_NAME_CHARS);
    line.grpc_status = grpc.status[fields.code] ?? String(fields.code);
    line.duration_ms = roundMs(performance.now() - startMs);
    if (fields.clientGone === true) line.client_gone = true;
    this.log.info(line, 'request completed');
  }
}

/** The status a call the client left ended with: its deadline's, or a cancel. */
export function goneStatus(call: { getDeadline(): grpc.Deadline }): grpc.status {
  const deadline = call.getDeadline();
  const deadlineMs = deadline instanceof Date ? deadline.getTime() : deadline;
  return Number.isFinite(deadlineMs) && Date.now() >= deadlineMs ? grpc.status.DEADLINE_EXCEEDED : grpc.status.CANCELLED;
}
