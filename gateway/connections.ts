// What the HTTP server itself enforces on every connection: headers and body must arrive in
// time, idle keep-alive connections close, connections past the cap are refused, and errors the
// server answers before any route (a request that timed out, headers too large, bytes that are
// not HTTP) are written in the catalogue's envelope rather than fastify's own body.
import { STATUS_CODES, type Server } from 'node:http';
import type { Socket } from 'node:net';
import type { FastifyHttpOptions, FastifyInstance } from 'fastify';
import { ApiError, toOpenAIBody } from './errors.ts';
import type { GatewayLimits } from './limits.ts';

/** Node checks the timeouts on an interval: a quarter of the shortest one, at most a second, so a timeout fires at most that late. */
function checkingIntervalMs(limits: GatewayLimits): number {
  return Math.max(10, Math.min(1000, Math.floor(Math.min(limits.headersTimeoutMs, limits.receiveTimeoutMs) / 4)));
}

function errorOf(err: Error & { code?: string }, limits: GatewayLimits): ApiError {
  if (err.code === 'ERR_HTTP_REQUEST_TIMEOUT') {
    return new ApiError(
      'receive_timeout',
      `The request did not arrive in time: headers must arrive within ${limits.headersTimeoutMs} ms and the whole ` +
        `request within ${limits.receiveTimeoutMs} ms.`,
    );
  }
  if (err.code === 'HPE_HEADER_OVERFLOW') return new ApiError('headers_too_large', 'The request headers are too large.');
  return new ApiError('invalid_request', 'The request is not valid HTTP/1.1.');
}

export function connectionOptions(
  limits: GatewayLimits,
): Pick<FastifyHttpOptions<Server>, 'http' | 'requestTimeout' | 'keepAliveTimeout' | 'connectionTimeout' | 'clientErrorHandler'> {
  return {
    http: { headersTimeout: limits.headersTimeoutMs, connectionsCheckingInterval: checkingIntervalMs(limits) },
    requestTimeout: limits.receiveTimeoutMs,
    keepAliveTimeout: limits.keepAliveTimeoutMs,
    // No idle timeout on a socket in use: a non-streamed generation may rightly be silent for minutes.
    connectionTimeout: 0,
    clientErrorHandler(this: FastifyInstance, err: Error & { code?: string }, socket: Socket) {
      // A reset connection has nobody left to answer.
      if (err.code === 'ECONNRESET' || socket.destroyed) return;
      const error = errorOf(err, limits);
      this.log.info({ err }, `connection closed: ${error.code}`);
      if (socket.writable) {
        const body = JSON.stringify(toOpenAIBody(error));
        socket.write(
          `HTTP/1.1 ${error.httpStatus} ${STATUS_CODES[error.httpStatus]}\r\n` +
            `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
        );
      }
      socket.destroy(err);
    },
  };
}

/** After the server exists: the connection cap. Node refuses (closes) each connection past it. */
export function capConnections(app: FastifyInstance, limits: GatewayLimits) {
  app.server.maxConnections = limits.maxConnections;
  app.server.on('drop', () => app.log.warn(`connection refused: ${limits.maxConnections} connections are open`));
}
