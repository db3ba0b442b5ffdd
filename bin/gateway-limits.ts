// The configuration's `server` bounds, as the gateway takes them.
import type { ServerConfig } from '../configs/schema.ts';
import type { GatewayLimits } from '../gateway/limits.ts';

export function gatewayLimitsOf(server: ServerConfig): GatewayLimits {
  return {
    headersTimeoutMs: server.headers_timeout_s * 1000,
    receiveTimeoutMs: server.receive_timeout_s * 1000,
    keepAliveTimeoutMs: server.keep_alive_timeout_s * 1000,
    maxConnections: server.max_connections,
    sseBufferLimitBytes: server.stream_max_buffered_bytes,
    sseKeepAliveMs: server.sse_keepalive_s * 1000,
    tokenizerThreads: server.tokenizer_threads,
  };
}
