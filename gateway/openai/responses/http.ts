// POST /v1/responses, answered with the Response object or, with stream: true, its events as
// Server-Sent Events (`event: <type>\ndata: <json>\n\n`, no [DONE]: response.completed ends it);
// GET and DELETE /v1/responses/{id} on the store. A client that goes away aborts its response in
// the worker at once.
import type { FastifyInstance, FastifyReply } from 'fastify';
import type { ServerResponse } from 'node:http';
import { ApiError } from '../../errors.ts';
import { clientIsConnected } from '../respond.ts';
import { SSE_HEADERS, sseNamedEvent } from '../sse.ts';
import type { ResponsesContext } from './index.ts';
import type { EventSink } from './objects.ts';
import { prepareTurn, previousNotFound } from './prepare.ts';
import { parseResponseCreate } from './schema.ts';
import { responseObjectOf } from './store.ts';
import { startTurn } from './turn.ts';

/** How long a cancelled slow stream may take to drain its last events before its connection is dropped. */
const SLOW_STREAM_DRAIN_MS = 30_000;

/** Headers go out with the first event, so an error before any output is still a plain HTTP status. */
function sseSink(reply: FastifyReply): EventSink {
  const raw = reply.raw;
  let isStarted = false;
  return {
    send(type, json, onFlushed) {
      if (!isStarted) {
        isStarted = true;
        reply.hijack();
        raw.writeHead(200, SSE_HEADERS);
      }
      raw.write(sseNamedEvent(type, json), onFlushed);
    },
    numBufferedBytes: () => raw.writableLength,
  };
}

/** The reader may never take what is queued: its connection goes rather than the bytes staying forever. */
function endSlowStream(raw: ServerResponse) {
  raw.end();
  const timer = setTimeout(() => raw.destroy(), SLOW_STREAM_DRAIN_MS).unref();
  raw.once('close', () => clearTimeout(timer));
}

function notFound(id: string): ApiError {
  return new ApiError('response_not_found', `Response with id '${id}' not found.`);
}

export function registerResponsesHttpRoutes(app: FastifyInstance, context: ResponsesContext) {
  const { registry, metrics, store, settings } = context;

  app.post('/v1/responses', async (httpRequest, reply) => {
    const arrivalMs = performance.now();
    const request = parseResponseCreate(httpRequest.body);
    const previousId = request.previous_response_id;
    const previous = previousId == null ? null : store.get(previousId);
    if (previous === undefined) throw previousNotFound(previousId!);
    const prepared = await prepareTurn(registry, context.prompts, request, previous, arrivalMs, clientIsConnected(httpRequest));
    prepared.generation.account = httpRequest.account;
    prepared.generation.trace = httpRequest.trace;
    const sink = request.stream === true ? sseSink(reply) : null;
    const turn = startTurn(prepared, { sink, maxBufferedBytes: settings.maxBufferedBytes, slowReaderGraceMs: settings.slowReaderGraceMs, metrics });

    const raw = reply.raw;
    const onClientGone = () => {
      if (!raw.writableFinished) turn.cancel();
    };
    raw.once('close', onClientGone);
    // The client may have left while the body was parsed, before this listener existed.
    if (raw.socket === null || raw.socket.destroyed) onClientGone();

    const outcome = await turn.outcome;
    if (outcome.kind === 'rejected') throw outcome.error;
    if (outcome.kind === 'cancelled') {
      if (outcome.error !== null) endSlowStream(raw);
      // The client left: there is no one to answer.
      else if (!reply.sent) reply.hijack();
      return undefined;
    }
    if (prepared.echo.store) store.put(outcome.stored);
    if (sink === null) return responseObjectOf(outcome.stored);
    raw.end();
    return undefined;
  });

  app.get('/v1/responses/:id', async (httpRequest) => {
    const { id } = httpRequest.params as { id: string };
    const stored = store.get(id);
    if (stored === undefined) throw notFound(id);
    return responseObjectOf(stored);
  });

  app.delete('/v1/responses/:id', async (httpRequest) => {
    const { id } = httpRequest.params as { id: string };
    if (!store.delete(id)) throw notFound(id);
    return { id, object: 'response', deleted: true };
  });
}
