// What the load generator needs from a wire protocol: send one generation request, report
// generated text as it streams and the token usage at the end. OpenAI SSE implements it
// today; WebSocket and KServe v2 generate_stream plug in beside it.

export interface ChatMessage {
  role: 'system' | 'user' | 'assistant';
  content: string;
}

export interface GenerationRequest {
  messages: readonly ChatMessage[];
  /** Generated tokens to produce exactly: sent as max_tokens with ignore_eos. */
  maxTokens: number;
}

export interface TokenUsage {
  promptTokens: number | null;
  completionTokens: number | null;
  cachedPromptTokens: number | null;
}

export interface StreamObserver {
  /** A chunk carrying generated text; atMs is when its bytes were read (performance.now()). */
  onText(text: string, atMs: number): void;
  onUsage(usage: TokenUsage): void;
}

/**
 * Failure categories counted in the report: `connection`, `timeout`, `http_<status>`,
 * `stream_error` (the server sent an error event mid-stream), `stream_incomplete` (the stream
 * ended before its end marker), `bad_chunk` (unparsable event).
 */
export class RequestError extends Error {
  override name = 'RequestError';

  constructor(
    readonly type: string,
    message: string,
  ) {
    super(message);
  }
}

export interface Transport {
  readonly name: string;
  /** Resolves when the stream ends normally; rejects with a RequestError otherwise. */
  stream(request: GenerationRequest, observer: StreamObserver, timeoutMs: number): Promise<void>;
  close(): void;
}
