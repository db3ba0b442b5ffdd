// The one bound on a stream's slow reader, for every stream the gateway writes (chat and
// completions SSE, the Responses API over SSE and WebSocket, Triton's generate_stream): once the
// bytes waiting to be sent pass server.stream_max_buffered_bytes, the request is cancelled in its
// worker, the reader gets one last error event, and a reader that does not take even that is
// dropped, so a client that never reads cannot grow the gateway's memory.
import type { ServerResponse } from 'node:http';
import { ApiError } from './errors.ts';

/** How long a cut stream's last events may take to leave before its connection is dropped. */
export const SLOW_READER_DRAIN_MS = 10_000;

/** The catalogue's error for a reader numUnsentBytes behind, past the bound. */
export function slowReaderError(numUnsentBytes: number, maxBufferedBytes: number): ApiError {
  return new ApiError(
    'client_too_slow',
    `The client read the stream too slowly: ${numUnsentBytes} bytes were waiting to be sent, more than the ` +
      `${maxBufferedBytes}-byte limit, so the request was cancelled.`,
  );
}

/** Ends a cut stream with its last bytes; if the reader has not taken them drainMs later, its connection goes. */
export function endSlowStream(raw: ServerResponse, lastBytes = '', drainMs = SLOW_READER_DRAIN_MS): void {
  raw.end(lastBytes);
  const timer = setTimeout(() => raw.destroy(), drainMs).unref();
  raw.once('close', () => clearTimeout(timer));
}
