// The gateway's life: starting (listening, workers not serving yet), ready, draining (close()
// began: what is in flight finishes, nothing new starts). The caller drives the first step
// (markReady), close() the second. Outside `ready` every request but /health is answered 503
// with Retry-After in OpenAI's envelope (instead of fastify's own body while it closes), and
// /health says which state it is in.
import type { FastifyInstance } from 'fastify';
import { ApiError } from './errors.ts';
import { refuse } from './refusal.ts';

export type ReadinessState = 'starting' | 'ready' | 'draining';

/** A client turned away should come back this much later: by then a start may be done, or a restarted server up. */
export const NOT_READY_RETRY_AFTER_S = 5;

export class Readiness {
  private current: ReadinessState;

  constructor(initialState: 'starting' | 'ready') {
    this.current = initialState;
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

function isHealthProbe(url: string): boolean {
  return url === '/health' || url.startsWith('/health?');
}

export function notReadyError(state: Exclude<ReadinessState, 'ready'>): ApiError {
  return state === 'starting'
    ? new ApiError('server_starting', 'The server is starting: its models are not serving yet.')
    : new ApiError('server_draining', 'The server is shutting down and takes no new requests.');
}

/**
 * Turns requests away unless ready, and drains on close(): it keeps listening (new requests get
 * 503, /health says draining) while the HTTP requests in flight finish, for up to drainTimeoutMs;
 * then fastify stops listening and closes the WebSockets, and whatever still runs is cut (which
 * aborts its generations in the workers).
 */
export function installReadinessGate(app: FastifyInstance, readiness: Readiness, drainTimeoutMs: number): void {
  let numInFlight = 0;
  let onIdle: (() => void) | null = null;
  const requestEnded = () => {
    numInFlight--;
    if (numInFlight === 0) onIdle?.();
  };

  app.addHook('onRequest', async (request, reply) => {
    const { state } = readiness;
    if (state === 'ready' || isHealthProbe(request.url)) {
      // An upgraded socket is a WebSocket's, not a request that ends: the websocket plugin closes those.
      if (request.raw.headers.upgrade === undefined) {
        numInFlight++;
        reply.raw.once('close', requestEnded);
      }
      return;
    }
    const error = notReadyError(state);
    return refuse(request, reply, error, { 'retry-after': String(NOT_READY_RETRY_AFTER_S) });
  });

  app.addHook('preClose', async () => {
    readiness.drain();
    if (numInFlight === 0) return;
    let drainTimer: NodeJS.Timeout | undefined;
    const isDrained = await new Promise<boolean>((resolve) => {
      onIdle = () => resolve(true);
      drainTimer = setTimeout(() => resolve(false), drainTimeoutMs);
    });
    clearTimeout(drainTimer);
    // fastify's server.close() follows, and would wait for the stragglers' connections forever.
    if (!isDrained) setImmediate(() => app.server.closeAllConnections());
  });
}
