// WebSocket mode, as OpenAI defines it: one persistent socket on GET /v1/responses. Each turn is
// a response.create event whose fields are the POST body (streaming implied), answered with the
// same events as the SSE stream, one JSON text frame each. One response runs at a time per
// connection. The connection keeps its latest response, so previous_response_id continues from it
// without the history being sent again, even with store: false; other ids come from the store.
// Pings drop a peer that stopped answering; at its time limit the connection says so and closes.
import type { FastifyBaseLogger, FastifyInstance } from 'fastify';
import type { RawData, WebSocket } from 'ws';
import type { TurnAdmission, TurnAdmitter } from '../../admission.ts';
import { ApiError, toResponsesErrorEvent } from '../../errors.ts';
import { checkJsonShape } from '../../json-body.ts';
import type { RequestTrace } from '../../logging.ts';
import type { ResponsesContext } from './index.ts';
import type { EventSink } from './objects.ts';
import { prepareTurn, previousNotFound, type PreparedTurn } from './prepare.ts';
import { parseResponseCreate } from './schema.ts';
import type { StoredResponse } from './store.ts';
import { startTurn, type Turn, type TurnOutcome } from './turn.ts';

/** Going away: clients that reconnect on their own (the SDK's reconnect option) open a new connection. */
const CLOSE_TIME_LIMIT = 1001;
/** Policy violation: the reader let more than the buffer bound pile up. */
const CLOSE_TOO_SLOW = 1008;

function isRecord(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}

class ResponsesConnection {
  private readonly socket: WebSocket;
  private readonly context: ResponsesContext;
  private readonly log: FastifyBaseLogger;
  /** The response in flight, if any. */
  private turn: Turn | null = null;
  /** A response.create whose prompt is still being tokenized (off the loop, when large): in flight too. */
  private isPreparing = false;
  /** The connection-local cache: its latest response, stored or not. */
  private latest: StoredResponse | null = null;
  /** Whether the peer answered the last ping. */
  private isAlive = true;
  private readonly pingTimer: NodeJS.Timeout;
  private readonly deadlineTimer: NodeJS.Timeout;
  private readonly sink: EventSink;

  constructor(
    socket: WebSocket,
    context: ResponsesContext,
    log: FastifyBaseLogger,
    private readonly admitTurn: TurnAdmitter | null,
    /** The upgrade request's: every turn's generation reports into the connection's access line. */
    private readonly trace: RequestTrace,
  ) {
    this.socket = socket;
    this.context = context;
    this.log = log;
    this.sink = {
      send: (_type, json, onFlushed) => {
        if (socket.readyState === socket.OPEN) socket.send(json, onFlushed);
        else onFlushed?.(new Error('the WebSocket is closed'));
      },
      numBufferedBytes: () => socket.bufferedAmount,
    };
    const { websocketPingIntervalMs, websocketMaxConnectionMs } = context.settings;
    this.pingTimer = setInterval(() => this.ping(), websocketPingIntervalMs).unref();
    this.deadlineTimer = setTimeout(() => this.expire(), websocketMaxConnectionMs).unref();
    socket.on('message', (data, isBinary) => this.onMessage(data, isBinary));
    socket.on('pong', () => {
      this.isAlive = true;
    });
    socket.once('close', () => this.onClose());
  }

  private onMessage(data: RawData, isBinary: boolean) {
    const arrivalMs = performance.now();
    if (isBinary) {
      this.sendError(new ApiError('invalid_request', 'Events are JSON text frames; this frame was binary.'));
      return;
    }
    let event: unknown;
    try {
      event = JSON.parse(data.toString());
    } catch (err) {
      this.sendError(new ApiError('invalid_json', `The event is not valid JSON: ${(err as Error).message}`));
      return;
    }
    try {
      // The bounds an HTTP body has: nesting deep enough to overflow a recursive walk is refused here.
      checkJsonShape(event);
    } catch (err) {
      this.sendError(err as ApiError);
      return;
    }
    if (!isRecord(event)) {
      this.sendError(new ApiError('invalid_request', 'The event must be a JSON object.'));
      return;
    }
    if (event.type !== 'response.create') {
      const shown = typeof event.type === 'string' ? JSON.stringify(event.type.slice(0, 64)) : `of type ${typeof event.type}`;
      this.sendError(new ApiError('invalid_request', `Unknown event type ${shown}; the client event is response.create.`, 'type'));
      return;
    }
    if (this.turn !== null || this.isPreparing) {
      this.sendError(new ApiError(
        'response_already_in_flight',
        'A response is already in flight on this connection; send the next response.create after its terminal event.',
      ));
      return;
    }
    // Each turn is a request against the caller's limits, and refused unless the gateway is ready (admission.ts).
    const admission = this.admitTurn?.(event, (data as Buffer).byteLength) ?? null;
    if (admission instanceof ApiError) return this.sendError(admission);
    void this.startResponse(event, arrivalMs, admission);
  }

  private async startResponse(event: Record<string, unknown>, arrivalMs: number, admission: TurnAdmission | null) {
    let prepared: PreparedTurn;
    this.isPreparing = true;
    try {
      const { type: _type, ...body } = event;
      const request = parseResponseCreate(body);
      const { registry, prompts } = this.context;
      const isOpen = () => this.socket.readyState === this.socket.OPEN;
      prepared = await prepareTurn(registry, prompts, request, this.previousOf(request.previous_response_id), arrivalMs, isOpen);
    } catch (err) {
      admission?.end();
      this.sendError(this.asApiError(err));
      return;
    } finally {
      this.isPreparing = false;
    }
    // Closed, or past its time limit, while the prompt was tokenized: nothing to answer.
    if (this.socket.readyState !== this.socket.OPEN) {
      admission?.end();
      return;
    }
    prepared.generation.account = admission?.account;
    prepared.generation.trace = this.trace;
    const { settings, metrics } = this.context;
    const turn = startTurn(prepared, { sink: this.sink, maxBufferedBytes: settings.maxBufferedBytes, slowReaderGraceMs: settings.slowReaderGraceMs, metrics });
    this.turn = turn;
    void turn.outcome.then((outcome) => {
      admission?.end();
      this.onTurnEnd(prepared, outcome);
    });
  }

  private previousOf(previousResponseId: string | null | undefined): StoredResponse | null {
    if (previousResponseId === null || previousResponseId === undefined) return null;
    if (this.latest?.response.id === previousResponseId) return this.latest;
    const stored = this.context.store.get(previousResponseId);
    if (stored === undefined) throw previousNotFound(previousResponseId);
    return stored;
  }

  private onTurnEnd(prepared: PreparedTurn, outcome: TurnOutcome) {
    this.turn = null;
    if (outcome.kind === 'rejected') {
      this.sendError(outcome.error);
    } else if (outcome.kind === 'done') {
      this.latest = outcome.stored;
      if (prepared.echo.store) this.context.store.put(outcome.stored);
    } else if (outcome.error !== null) {
      // Too slow: its error event is queued; the close frame follows it, and ws drops the socket if the peer never answers.
      this.socket.close(CLOSE_TOO_SLOW, 'client too slow: response cancelled');
    }
  }

  private ping() {
    if (!this.isAlive) {
      this.socket.terminate();
      return;
    }
    this.isAlive = false;
    this.socket.ping();
  }

  private expire() {
    this.turn?.cancel();
    const minutes = Math.round(this.context.settings.websocketMaxConnectionMs / 60_000);
    this.sendError(new ApiError(
      'websocket_connection_limit_reached',
      `Responses websocket connection limit reached (${minutes} minutes). Create a new websocket connection to continue.`,
    ));
    this.socket.close(CLOSE_TIME_LIMIT, 'connection time limit reached');
  }

  private onClose() {
    clearInterval(this.pingTimer);
    clearTimeout(this.deadlineTimer);
    // The client went away: its response stops in the worker now.
    this.turn?.cancel();
  }

  private sendError(error: ApiError) {
    if (this.socket.readyState === this.socket.OPEN) this.socket.send(toResponsesErrorEvent(error, null));
  }

  /** A bug costs one event, and its text stays in the log. */
  private asApiError(err: unknown): ApiError {
    if (err instanceof ApiError) return err;
    this.log.error({ err }, 'response.create failed');
    return new ApiError('internal_error', 'The server failed to handle the event.');
  }
}

export function registerResponsesWebSocketRoute(app: FastifyInstance, context: ResponsesContext) {
  app.route({
    method: 'GET',
    url: '/v1/responses',
    // ws writes the 101 itself; the request counter reads this status when the connection closes.
    preHandler: async (request, reply) => {
      if (request.ws) reply.raw.statusCode = 101;
    },
    handler: async () => {
      throw new ApiError(
        'route_not_found',
        'GET /v1/responses opens a WebSocket (send Upgrade: websocket); create a response with POST /v1/responses.',
      );
    },
    wsHandler: (socket, request) => {
      new ResponsesConnection(socket, context, request.log, request.admitTurn, request.trace);
    },
  });
}
