// The gateway's log: JSON lines on stdout through fastify's logger (pino), and one access line
// per request, written when its response is over (a stream's last byte, a WebSocket's close, or
// the client leaving first). Every line about a request carries its request id: the client's
// x-request-id when it is sound, else a new one, echoed on the response and sent to the worker.
// At info no line holds prompt or output text; debug adds the request body and the output.
import { randomUUID } from 'node:crypto';
import os from 'node:os';
import type { IncomingMessage } from 'node:http';
import { LogController, type FastifyInstance, type FastifyReply, type FastifyRequest, type FastifyServerOptions } from 'fastify';
import { pino, type DestinationStream, type LevelWithSilent, type Logger } from 'pino';

export interface LogSettings {
  level: LevelWithSilent;
  /** Where the lines go; stdout when omitted. */
  stream?: DestinationStream;
}

export const REQUEST_ID_HEADER = 'x-request-id';
/** Printable ASCII without spaces, at most 128 characters: safe in a header and a log line. */
const SOUND_REQUEST_ID = /^[\x21-\x7e]{1,128}$/;

/** The client's x-request-id when it is sound (printable ASCII, no spaces, 1-128 characters), else a new UUID. */
export function requestIdOf(header: string | string[] | undefined): string {
  return typeof header === 'string' && SOUND_REQUEST_ID.test(header) ? header : randomUUID();
}

/**
 * The gateway's logger. `conduit serve` makes one and hands it to the gateway and to its own
 * lifecycle lines (bin/lifecycle-log.ts), so that both share the format, the level and stdout.
 */
export function createGatewayLogger(settings: LogSettings): Logger {
  const options = {
    level: settings.level,
    base: { pid: process.pid, hostname: os.hostname(), role: 'gateway' },
    timestamp: () => `,"time":"${new Date().toISOString()}"`,
    formatters: { level: (label: string) => ({ level: label }) },
  };
  return settings.stream === undefined ? pino(options) : pino(options, settings.stream);
}

/** Fastify's options for the log: the logger (one of the caller's, or made from settings), the request ids, and no per-request lines of its own. */
export function loggerOptions(log: LogSettings | Logger): Partial<FastifyServerOptions> {
  return {
    loggerInstance: 'child' in log ? log : createGatewayLogger(log),
    genReqId: (raw) => requestIdOf(raw.headers[REQUEST_ID_HEADER]),
    logController: new LogController({ requestIdLogLabel: 'request_id', disableRequestLogging: true }),
  };
}

export type GenerationEnd = 'stop' | 'length' | 'abort' | 'error';

/** What a request's access line tells of its generations (one per choice); generation.ts fills it in. */
export class RequestTrace {
  modelName: string | null = null;
  /** Each distinct prompt once, however many choices share it. */
  numPromptTokens = 0;
  numCompletionTokens = 0;
  /** From arrival to the first token of any choice. */
  ttftMs: number | null = null;
  readonly finishReasons: GenerationEnd[] = [];
  /** The output text, kept only when the log shows debug lines. */
  completionText: string | null;
  private readonly prompts: (readonly number[])[] = [];

  constructor(
    /** The request's id: the worker logs its generations under it. */
    readonly requestId: string,
    keepsText: boolean,
  ) {
    this.completionText = keepsText ? '' : null;
  }

  onStart(modelName: string, promptTokenIds: readonly number[]): void {
    this.modelName = modelName;
    if (this.prompts.includes(promptTokenIds)) return;
    this.prompts.push(promptTokenIds);
    this.numPromptTokens += promptTokenIds.length;
  }

  onFirstToken(ttftMs: number): void {
    this.ttftMs ??= ttftMs;
  }

  onText(text: string): void {
    if (this.completionText !== null) this.completionText += text;
  }

  onEnd(numOutputTokens: number, end: GenerationEnd): void {
    this.numCompletionTokens += numOutputTokens;
    this.finishReasons.push(end);
  }
}

declare module 'fastify' {
  interface FastifyRequest {
    /** The request's access-line record; generations started for it report into it. */
    trace: RequestTrace;
  }
}

/** The levels at which access lines carry the request body and the output text. */
const TEXT_LEVELS = new Set(['debug', 'trace']);

const roundMs = (ms: number) => Math.round(ms * 10) / 10;

function writeAccessLine(request: FastifyRequest, reply: FastifyReply, trace: RequestTrace, startMs: number) {
  const raw = reply.raw;
  const isUpgrade = raw.statusCode === 101;
  const isClientGone = !isUpgrade && !raw.writableFinished;
  const fields: Record<string, unknown> = {
    method: request.method,
    url: request.url,
    route: request.routeOptions.url ?? null,
    // A client gone before the headers were sent got no status.
    status: isClientGone && !raw.headersSent ? null : raw.statusCode,
    duration_ms: roundMs(performance.now() - startMs),
  };
  if (isClientGone) fields.client_gone = true;
  if (trace.modelName !== null) {
    const { finishReasons } = trace;
    fields.model = trace.modelName;
    fields.prompt_tokens = trace.numPromptTokens;
    fields.completion_tokens = trace.numCompletionTokens;
    fields.ttft_ms = trace.ttftMs === null ? null : roundMs(trace.ttftMs);
    fields.finish_reason = finishReasons.length === 1 ? finishReasons[0] : finishReasons;
  }
  if (trace.completionText !== null) {
    fields.body = request.body;
    if (trace.modelName !== null) fields.completion = trace.completionText;
  }
  request.log.info(fields, isUpgrade ? 'connection closed' : 'request completed');
}

/** Raw upgrade requests and their ids: ws writes the 101 itself, from its 'headers' event. */
const upgradeIds = new WeakMap<IncomingMessage, string>();

/**
 * Every response carries x-request-id (set on the raw response, so errors, hijacked streams and
 * refused upgrades carry it too) and leaves one access line.
 */
export function installAccessLog(app: FastifyInstance): void {
  app.decorateRequest('trace', null as unknown as RequestTrace);
  app.addHook('onRequest', async (request, reply) => {
    const startMs = performance.now();
    reply.raw.setHeader(REQUEST_ID_HEADER, request.id);
    upgradeIds.set(request.raw, request.id);
    const trace = new RequestTrace(request.id, TEXT_LEVELS.has(request.log.level));
    request.trace = trace;
    // After the route's own close listeners, which end the generations of a client that left.
    reply.raw.once('close', () => setImmediate(writeAccessLine, request, reply, trace, startMs));
  });
}

/** After @fastify/websocket is registered: a WebSocket's 101 carries the request id too. */
export function echoRequestIdOnUpgrade(app: FastifyInstance): void {
  app.websocketServer.on('headers', (headers: string[], raw: IncomingMessage) => {
    const requestId = upgradeIds.get(raw);
    if (requestId !== undefined) headers.push(`${REQUEST_ID_HEADER}: ${requestId}`);
  });
}
