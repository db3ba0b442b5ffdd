// EngineClient over gRPC: one shared bidirectional stream per worker carries every request out
// and one message per engine step back, whose outputs are routed to their requests by id and
// whose report (KV events, load, statistics) goes to the report listeners. The stream opens with
// the client and reopens after it drops (backing off while the worker is away); a drop ends
// every pending request at once with an 'engine_unavailable' error, never a hang.
import * as grpc from '@grpc/grpc-js';
import { errorOutput } from '../request-output.ts';
import type { EngineClient, GenerateRequest, ReportListener, RequestOutput, WorkerLoad, WorkerModelInfo } from '../types.ts';
import {
  generateToWire,
  healthFromWire,
  loadEngineService,
  stepFromWire,
  type ClientMessage,
  type HealthResponse__Output,
  type StepOutput__Output,
} from './wire.ts';

const healthTimeoutMs = 5_000;
const firstRetryMs = 100;
const maxRetryMs = 5_000;
const maxReconnectBackoffMs = 1_000;

type StreamCall = grpc.ClientDuplexStream<ClientMessage, StepOutput__Output>;

interface EngineStub extends grpc.Client {
  Stream(): StreamCall;
  Health(
    request: Record<string, never>,
    options: grpc.CallOptions,
    callback: grpc.requestCallback<HealthResponse__Output>,
  ): grpc.ClientUnaryCall;
}

interface PendingRequest {
  onOutput: (output: RequestOutput) => void;
  numPromptTokens: number;
}


export interface EngineClientOptions {
  /**
   * A stream silent this long (no step, no heartbeat: since its latest message, or since it
   * opened when none came on it) is given up as for a lost worker: its requests end with
   * 'engine_unavailable', the load is forgotten (so no request is routed here), and the stream
   * reopens, to be used again once the worker answers. Unwatched when omitted (a supervisor
   * watches the workers it spawns).
   */
  silenceTimeoutMs?: number;
  /** A serving worker's stream was given up after silentMs. */
  onSilent?: (silentMs: number) => void;
  /** The worker answered again after onSilent. */
  onAnswered?: () => void;
}

export class GrpcEngineClient implements EngineClient {
  /** 'HOST:PORT' or 'unix:PATH'. */
  readonly address: string;
  private readonly client: EngineStub;
  private stream: StreamCall | null = null;
  private readonly pending = new Map<string, PendingRequest>();
  private readonly reportListeners = new Set<ReportListener>();
  private latestLoad: WorkerLoad | null = null;
  private latestMessageAtMs = -Infinity;
  /** performance.now() when the stream now open was opened. */
  private streamOpenedAtMs = -Infinity;
  /** Set when a serving worker went silent past the timeout; cleared by its next message. */
  private isSilenced = false;
  private silenceTimer: NodeJS.Timeout | null = null;
  private retryMs = firstRetryMs;
  private retryTimer: NodeJS.Timeout | null = null;
  private closed = false;

  constructor(address: string, private readonly options: EngineClientOptions = {}) {
    this.address = address;
    const Engine = loadEngineService();
    // Keepalive pings notice a worker whose host vanished without closing the connection. The
    // reconnect backoff is capped at a second (grpc's default grows to two minutes): a worker
    // back after a restart is reached within a second of listening, not half its absence later,
    // since the channel fails every call at once until it reconnects.
    this.client = new Engine(address, grpc.credentials.createInsecure(), {
      'grpc.keepalive_time_ms': 20_000,
      'grpc.keepalive_timeout_ms': 10_000,
      'grpc.initial_reconnect_backoff_ms': 100,
      'grpc.max_reconnect_backoff_ms': maxReconnectBackoffMs,
    }) as unknown as EngineStub;
    this.openStream();
    if (options.silenceTimeoutMs !== undefined) this.watchSilence(options.silenceTimeoutMs);
  }

  get numInFlight(): number {
    return this.pending.size;
  }

  /** The load the worker last reported; null while no stream is up. */
  get load(): WorkerLoad | null {
    return this.latestLoad;
  }

  /**
   * performance.now() when the worker's latest message arrived, on this stream or an earlier one;
   * -Infinity before the first. An idle worker sends a heartbeat every second: a supervisor
   * reads a long silence as a hang.
   */
  get lastMessageAtMs(): number {
    return this.latestMessageAtMs;
  }

  /** Calls listener with every report; each new stream begins with the whole prefix cache. */
  onReport(listener: ReportListener): () => void {
    this.reportListeners.add(listener);
    return () => this.reportListeners.delete(listener);
  }

  generate(request: GenerateRequest, onOutput: (output: RequestOutput) => void): void {
    const { requestId } = request;
    const numPromptTokens = request.promptTokenIds.length;
    if (this.closed || this.pending.has(requestId)) {
      const error = this.closed
        ? ({ code: 'engine_unavailable', message: `The client of engine worker ${this.address} is closed` } as const)
        : ({ code: 'invalid_request', message: `Request ${requestId} is already in flight` } as const);
      queueMicrotask(() => onOutput(errorOutput(requestId, numPromptTokens, error)));
      return;
    }
    this.pending.set(requestId, { onOutput, numPromptTokens });
    this.openStream().write({ generate: generateToWire(request) });
  }

  /**
   * Opens the stream now if it is down, instead of when its backoff ends, and retries from the
   * shortest pause if that fails: the worker just answered, or just began to listen.
   */
  connect(): void {
    if (this.closed) return;
    this.retryMs = firstRetryMs;
    this.openStream();
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
          return;
        }
        try {
          resolve(healthFromWire(response));
        } catch (malformed) {
          reject(new Error(`engine worker ${this.address}: ${(malformed as Error).message}`));
        }
      });
    });
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    if (this.retryTimer !== null) clearTimeout(this.retryTimer);
    if (this.silenceTimer !== null) clearInterval(this.silenceTimer);
    this.failPending(`The client of engine worker ${this.address} was closed`);
    this.stream?.cancel();
    this.stream = null;
    this.latestLoad = null;
    this.client.close();
  }

  private openStream(): StreamCall {
    if (this.stream !== null) return this.stream;
    if (this.retryTimer !== null) {
      clearTimeout(this.retryTimer);
      this.retryTimer = null;
    }
    const stream = this.client.Stream();
    this.streamOpenedAtMs = performance.now();
    stream.on('data', (message: StepOutput__Output) => {
      let step;
      try {
        step = stepFromWire(message);
      } catch (err) {
        stream.cancel();
        onDown(`a malformed message: ${(err as Error).message}`);
        return;
      }
      this.retryMs = firstRetryMs;
      this.latestMessageAtMs = performance.now();
      if (this.isSilenced) {
        this.isSilenced = false;
        this.options.onAnswered?.();
      }
      for (const output of step.outputs) {
        const request = this.pending.get(output.requestId);
        if (request === undefined) continue;
        if (output.finishReason !== null) this.pending.delete(output.requestId);
        request.onOutput(output);
      }
      this.latestLoad = step.report.load;
      for (const listener of this.reportListeners) listener(step.report);
    });
    const onDown = (reason: string) => this.dropStream(stream, reason);
    stream.on('error', (err: grpc.ServiceError) => onDown(err.details || err.message));
    stream.on('end', () => onDown('the worker ended the stream'));
    this.stream = stream;
    return stream;
  }

  /** The stream is lost: its requests fail, the load is forgotten, and it reopens after a pause. */
  private dropStream(stream: StreamCall, reason: string): void {
    if (this.stream !== stream) return;
    this.stream = null;
    this.latestLoad = null;
    this.failPending(`Lost the stream to engine worker ${this.address}: ${reason}`);
    this.scheduleReopen();
  }

  /** Gives up the stream once it is silent for timeoutMs (EngineClientOptions.silenceTimeoutMs). */
  private watchSilence(timeoutMs: number): void {
    const checkIntervalMs = Math.min(1_000, timeoutMs / 4);
    let lastCheckAtMs = performance.now();
    this.silenceTimer = setInterval(() => {
      const nowMs = performance.now();
      // This event loop stalled: what the worker sent meanwhile may still be unread. Look next time.
      const isLate = nowMs - lastCheckAtMs > 2 * checkIntervalMs;
      lastCheckAtMs = nowMs;
      const stream = this.stream;
      if (isLate || stream === null) return;
      const silentMs = nowMs - Math.max(this.latestMessageAtMs, this.streamOpenedAtMs);
      if (silentMs <= timeoutMs) return;
      // Told once per outage: the streams reopened to a worker still silent are given up quietly.
      const wasServing = this.latestLoad !== null;
      this.dropStream(stream, `nothing on it for ${(silentMs / 1000).toFixed(1)} s`);
      stream.cancel();
      if (wasServing && !this.isSilenced) {
        this.isSilenced = true;
        this.options.onSilent?.(silentMs);
      }
    }, checkIntervalMs);
    this.silenceTimer.unref();
  }

  /** Reopens the stream after a pause that doubles while the worker stays away. */
  private scheduleReopen(): void {
    if (this.closed || this.retryTimer !== null) return;
    this.retryTimer = setTimeout(() => {
      this.retryTimer = null;
      if (!this.closed) this.openStream();
    }, this.retryMs);
    this.retryTimer.unref();
    this.retryMs = Math.min(maxRetryMs, 2 * this.retryMs);
  }

  private failPending(message: string): void {
    const failed = [...this.pending];
    this.pending.clear();
    for (const [requestId, request] of failed) {
      request.onOutput(errorOutput(requestId, request.numPromptTokens, { code: 'engine_unavailable', message }));
    }
  }
}
