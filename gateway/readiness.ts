// The gateway's life: starting (listening, workers not serving yet), ready, draining (close()
// began: what is in flight finishes, nothing new starts). The caller drives the first step
// (markReady), close() the second. Outside `ready` every request but the probes is answered 503
// with Retry-After in OpenAI's envelope (KServe's `{"error"}` body under /v2; instead of
// fastify's own body while it closes); /health says which state it is in, /v2/health/ready is
// 400 (Triton's not ready) and /v2/health/live 200.
import type { FastifyInstance } from 'fastify';
import { ApiError, toKServeBody } from './errors.ts';
import { refuse } from './refusal.ts';

export type ReadinessState = 'starting' | 'ready' | 'draining';

/** A client turned away should come back this much later: by then a start may be done, or a restarted server up. */
export const NOT_READY_RETRY_AFTER_S = 5;

export class Readiness {
  private current: ReadinessState;
  /** HTTP requests and WebSocket turns in flight, which a drain lets finish. */
  private numInFlight = 0;
  private onIdle: (() => void) | null = null;

  constructor(initialState: 'starting' | 'ready') {
    this.current = initialState;
  }

  /** A request or a WebSocket turn begins; it ends when the returned function is first called. */
  begin(): () => void {
    this.numInFlight++;
    let hasEnded = false;
    return () => {
      if (hasEnded) return;
      hasEnded = true;
      this.numInFlight--;
      if (this.numInFlight === 0) this.onIdle?.();
    };
  }

  /** Resolves true once nothing is in flight, or false after timeoutMs. */
  async whenIdle(timeoutMs: number): Promise<boolean> {
    if (this.numInFlight === 0) return true;
    let timer: NodeJS.Timeout | undefined;
    const isIdle = await new Promise<boolean>((resolve) => {
      this.onIdle = () => resolve(true);
      timer = setTimeout(() => resolve(false), timeoutMs);
    });
    clearTimeout(timer);
    this.onIdle = null;
    return isIdle;
  }

  get state(): ReadinessState {
    return this.current;
  }

  /** The workers are serving. A draining gateway stays draining. */
  markReady(): void {
    if (this.current === 'starting') this.current = 'ready';
  }

  drain(): void {
    this.current = 'draining';
  }
}

function pathOf(url: string): string {
  const queryAt = url.indexOf('?');
  return queryAt === -1 ? url : url.slice(0, queryAt);
}

export function notReadyError(state: Exclude<ReadinessState, 'ready'>): ApiError {
  return state === 'starting'
    ? new ApiError('server_starting', 'The server is starting: its models are not serving yet.')
    : new ApiError('server_draining', 'The server is shutting down and takes no new requests.');
}

/**
 * Turns requests away unless ready, and drains on close(): it keeps listening (new requests get
 * 503, /health says draining) while the HTTP requests and WebSocket turns in flight finish, for
 * up to drainTimeoutMs; then fastify stops listening and closes the WebSockets, and whatever
 * still runs is cut (which aborts its generations in the workers).
 */
export function installReadinessGate(app: FastifyInstance, readiness: Readiness, drainTimeoutMs: number): void {
  app.addHook('onRequest', async (request, reply) => {
    const { state } = readiness;
    const path = pathOf(request.url);
    // /health reports the state itself; a process that is starting or draining is alive (a
    // failed liveness probe would restart a pod that is only loading its models).
    if (state === 'ready' || path === '/health' || path === '/v2/health/live') {
      // An upgraded socket never ends as a request: its turns are counted instead (admission.ts).
      if (request.raw.headers.upgrade === undefined) reply.raw.once('close', readiness.begin());
      return;
    }
    // Triton's answer to a server that is not ready: 400, empty.
    if (path === '/v2/health/ready') return reply.code(400).send();
    const error = notReadyError(state);
    const retryAfter = { 'retry-after': String(NOT_READY_RETRY_AFTER_S) };
    if (path.startsWith('/v2/')) return reply.code(error.httpStatus).headers(retryAfter).type('application/json').send(toKServeBody(error));
    return refuse(request, reply, error, retryAfter);
  });

  app.addHook('preClose', async () => {
    readiness.drain();
    if (!(await readiness.whenIdle(drainTimeoutMs))) app.log.warn(`drain: requests still running after ${drainTimeoutMs} ms are cut`);
    // fastify's server.close() follows, and would wait forever for the stragglers' connections,
    // and for a connection whose client abandoned a stream without closing it (fetch's abort
    // leaves it open): Node counts that one as mid-request, so it is never closed as idle. Once
    // drained, no response is in progress on any connection, so closing them all loses nothing.
    setImmediate(() => app.server.closeAllConnections());
  });
}
