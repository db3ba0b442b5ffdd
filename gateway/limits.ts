// The bounds that keep one client from holding the gateway or its memory: how long a request may
// take to arrive, how long an idle connection stays, how many connections are taken, how far a
// stream's reader may fall behind, how many threads take large inputs off the event loop.
// configs/schema.ts `server` sets each; its defaults are these defaults (for callers without a
// configuration: tests, embedding), read from the schema so there is one spelling of each.
import { serverSchema, type ServerConfig } from '../configs/schema.ts';

export interface GatewayLimits {
  /** A request's headers must arrive within this (a client dripping headers, slowloris). */
  headersTimeoutMs: number;
  /** The whole request, headers and body, must arrive within this (a dripped body). */
  receiveTimeoutMs: number;
  /** An idle keep-alive connection is closed after this. */
  keepAliveTimeoutMs: number;
  /** Connections past this many are refused. */
  maxConnections: number;
  /**
   * A stream whose unsent bytes pass this is cancelled (slow-reader.ts): a slow reader never
   * grows memory without bound. Every stream: SSE, the Responses API's WebSocket, generate_stream.
   */
  streamMaxBufferedBytes: number;
  /** A stream still without output after this gets its headers and an SSE comment, and one more each time again. */
  sseKeepAliveMs: number;
  /** Worker threads that parse, render and tokenize large inputs off the event loop. */
  tokenizerThreads: number;
}

/** The configuration's `server` bounds in the gateway's units. */
export function gatewayLimitsOf(server: ServerConfig): GatewayLimits {
  return {
    headersTimeoutMs: server.headers_timeout_s * 1000,
    receiveTimeoutMs: server.receive_timeout_s * 1000,
    keepAliveTimeoutMs: server.keep_alive_timeout_s * 1000,
    maxConnections: server.max_connections,
    streamMaxBufferedBytes: server.stream_max_buffered_bytes,
    sseKeepAliveMs: server.sse_keepalive_s * 1000,
    tokenizerThreads: server.tokenizer_threads,
  };
}

export const DEFAULT_GATEWAY_LIMITS: Readonly<GatewayLimits> = gatewayLimitsOf(serverSchema.parse({}));

/** Streams take these from the limits. */
export type StreamLimits = Pick<GatewayLimits, 'streamMaxBufferedBytes' | 'sseKeepAliveMs'>;
