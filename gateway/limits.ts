// The bounds that keep one client from holding the gateway or its memory: how long a request may
// take to arrive, how long an idle connection stays, how many connections are taken, how far a
// stream's reader may fall behind, how many threads take large inputs off the event loop.
// configs/schema.ts `server` sets each; these defaults are the same values, for callers without
// a configuration (tests, embedding).

export interface GatewayLimits {
  /** A request's headers must arrive within this (a client dripping headers, slowloris). */
  headersTimeoutMs: number;
  /** The whole request, headers and body, must arrive within this (a dripped body). */
  receiveTimeoutMs: number;
  /** An idle keep-alive connection is closed after this. */
  keepAliveTimeoutMs: number;
  /** Connections past this many are refused. */
  maxConnections: number;
  /** A stream whose unsent bytes pass this is cancelled: a slow reader never grows memory without bound. */
  sseBufferLimitBytes: number;
  /** A stream still without output after this gets its headers and an SSE comment, and one more each time again. */
  sseKeepAliveMs: number;
  /** Worker threads that parse, render and tokenize large inputs off the event loop. */
  tokenizerThreads: number;
}

export const DEFAULT_GATEWAY_LIMITS: GatewayLimits = {
  // Real clients send their headers in one packet; 10 s is generous even over a slow link.
  headersTimeoutMs: 10_000,
  // An 8 MiB body (the default body limit) arrives within 60 s from 140 KB/s up.
  receiveTimeoutMs: 60_000,
  // Longer than the 60 s idle timeout of common load balancers (fastify's default, 72 s), so the
  // gateway never closes a connection that a balancer is about to reuse.
  keepAliveTimeoutMs: 72_000,
  // Room for the 1,000 SSE plus 1,000 WebSocket clients of the gateway benchmark, twice over.
  maxConnections: 4096,
  // configs `stream_max_buffered_bytes`, shared with the Responses API's streams: about 20,000
  // chunks behind, beyond what the kernel's socket buffers already hold.
  sseBufferLimitBytes: 4 * 1024 * 1024,
  // Long enough that nearly every early error (a full queue, a prompt the KV cache cannot hold)
  // still gets its HTTP status; short enough for proxies that drop a response silent for 10 s+.
  sseKeepAliveMs: 5_000,
  // The engine workers own the cores; two threads keep one huge prompt from delaying the next.
  tokenizerThreads: 2,
};

/** Streams take these from the limits. */
export type StreamLimits = Pick<GatewayLimits, 'sseBufferLimitBytes' | 'sseKeepAliveMs'>;
