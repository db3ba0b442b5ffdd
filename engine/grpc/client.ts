// EngineClient over gRPC: one shared bidirectional stream per worker carries every request,
// and outputs are routed back by request id. If the stream dies, every pending request ends
// at once with a 'engine_unavailable' error (never a hang); the next request opens a new
// stream, and grpc-js reconnects the channel underneath.
import * as grpc from '@grpc/grpc-js';
import type { RoutedWorker } from '../../router/least-loaded.ts';
import { errorOutput } from '../request-output.ts';
import type { EngineClient, GenerateRequest, RequestOutput, WorkerLoad, WorkerModelInfo } from '../types.ts';
import {
  generateToWire,
  loadEngineService,
  outputFromWire,
  type WireClientMessage,
  type WireHealthResponse,
  type WireServerMessage,
} from './wire.ts';

const healthTimeoutMs = 5_000;

type StreamCall = grpc.ClientDuplexStream<WireClientMessage, WireServerMessage>;

interface EngineStub extends grpc.Client {
  Stream(): StreamCall;
  Health(
    request: Record<string, never>,
    options: grpc.CallOptions,
    callback: grpc.requestCallback<WireHealthResponse>,
  ): grpc.ClientUnaryCall;
}

interface PendingRequest {
  onOutput: (output: RequestOutput) => void;
  numPromptTokens: number;
}

export class GrpcEngineClient implements EngineClient, RoutedWorker {
  /** 'HOST:PORT' or 'unix:PATH'. */
  readonly address: string;
  private readonly client: EngineStub;
  private stream: StreamCall | null = null;
  private readonly pending = new Map<string, PendingRequest>();
  private closed = false;

  constructor(address: string) {
    this.address = address;
    const Engine = loadEngineService();
    // Keepalive pings notice a worker whose host vanished without closing the connection.
    this.client = new Engine(address, grpc.credentials.createInsecure(), {
      'grpc.keepalive_time_ms': 20_000,
      'grpc.keepalive_timeout_ms': 10_000,
    }) as unknown as EngineStub;
  }

  get numInFlight(): number {
    return this.pending.size;
  }

  generate(request: GenerateRequest, onOutput: (output: RequestOutput) => void): void {
    const { requestId } = request;
    const numPromptTokens = request.promptTokenIds.length;
    if (this.closed || this.pending.has(requestId)) {
      const error = this.closed
        ? { code: 'engine_unavailable', message: `The client of engine worker ${this.address} is closed` }
        : { code: 'invalid_request', message: `Request ${requestId} is already in flight` };
      queueMicrotask(() => onOutput(errorOutput(requestId, numPromptTokens, error)));
      return;
    }
    this.pending.set(requestId, { onOutput, numPromptTokens });
    this.openStream().write({ generate: generateToWire(request) });
  }

  /** The request ends with its own 'abort' output once the worker has freed it. */
  abort(requestId: string): void {
    if (this.pending.has(requestId)) this.stream?.write({ abort: { requestId } });
  }

  health(): Promise<{ serving: boolean; model: WorkerModelInfo; load: WorkerLoad }> {
    return new Promise((resolve, reject) => {
      this.client.Health({}, { deadline: Date.now() + healthTimeoutMs }, (err, response) => {
        if (err || response === undefined) {
          reject(new Error(`engine worker ${this.address}: ${err?.details || err?.message || 'no health response'}`));
        } else {
          resolve({ serving: response.serving, model: response.model!, load: response.load! });
        }
      });
    });
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.failPending(`The client of engine worker ${this.address} was closed`);
    this.stream?.cancel();
    this.stream = null;
    this.client.close();
  }

  private openStream(): StreamCall {
    if (this.stream !== null) return this.stream;
    const stream = this.client.Stream();
    stream.on('data', (message: WireServerMessage) => {
      if (message.output === null) return;
      const output = outputFromWire(message.output);
      const request = this.pending.get(output.requestId);
      if (request === undefined) return;
      if (output.finishReason !== null) this.pending.delete(output.requestId);
      request.onOutput(output);
    });
    const onDown = (reason: string) => {
      if (this.stream !== stream) return;
      this.stream = null;
      this.failPending(`Lost the stream to engine worker ${this.address}: ${reason}`);
    };
    stream.on('error', (err: grpc.ServiceError) => onDown(err.details || err.message));
    stream.on('end', () => onDown('the worker ended the stream'));
    this.stream = stream;
    return stream;
  }

  private failPending(message: string): void {
    const failed = [...this.pending];
    this.pending.clear();
    for (const [requestId, request] of failed) {
      request.onOutput(errorOutput(requestId, request.numPromptTokens, { code: 'engine_unavailable', message }));
    }
  }
}
