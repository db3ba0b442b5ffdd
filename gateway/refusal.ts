// Answers a request at the door (not ready, no key, not an admin key, over a limit) with a
// catalogue error: in OpenAI's envelope, or KServe's `{"error": ...}` under /v2. A refused WebSocket upgrade has no HTTP server behind its socket to close
// it after the answer (and the websocket plugin's own hooks may not have run), so it is closed here.
import type { FastifyReply, FastifyRequest } from 'fastify';
import { type ApiError, toKServeBody, toOpenAIBody } from './errors.ts';

export function refuse(request: FastifyRequest, reply: FastifyReply, error: ApiError, headers: Record<string, string> = {}) {
  if (request.raw.headers.upgrade !== undefined) {
    const socket = request.raw.socket;
    reply.raw.once('finish', () => socket.end());
    headers = { ...headers, connection: 'close' };
  }
  const isKServe = request.url.startsWith('/v2/') || request.url === '/v2';
  return reply.code(error.httpStatus).headers(headers).type('application/json').send(isKServe ? toKServeBody(error) : toOpenAIBody(error));
}
