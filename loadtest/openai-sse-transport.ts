// OpenAI streaming over Server-Sent Events, on node:http with a keep-alive agent sized to the
// load (measured faster than fetch for many concurrent streams; see README.md).

import http from 'node:http';
import https from 'node:https';
import { performance } from 'node:perf_hooks';
import { SseParser } from './sse-parser.ts';
import { type GenerationRequest, RequestError, type StreamObserver, type Transport } from './transport.ts';

export type OpenAiEndpoint = 'chat' | 'completions';

export interface OpenAiSseOptions {
  baseUrl: string;
  model: string;
  endpoint: OpenAiEndpoint;
  maxSockets: number;
  /** Server-specific fields added to every request's body; the fields the transport sets win. */
  requestFields?: Readonly<Record<string, unknown>>;
}

interface StreamChunk {
  error?: { message?: string } | string;
  choices?: { delta?: { content?: string | null; reasoning_content?: string | null }; text?: string }[];
  usage?: {
    prompt_tokens?: number;
    completion_tokens?: number;
    prompt_tokens_details?: { cached_tokens?: number } | null;
  } | null;
}

export class OpenAiSseTransport implements Transport {
  readonly name = 'openai-sse';
  private readonly agent: http.Agent;
  private readonly requestModule: typeof http | typeof https;
  private readonly url: URL;

  constructor(private readonly options: OpenAiSseOptions) {
    const base = new URL(options.baseUrl);
    this.requestModule = base.protocol === 'https:' ? https : http;
    const agentOptions = { keepAlive: true, maxSockets: options.maxSockets, maxFreeSockets: options.maxSockets };
    this.agent = base.protocol === 'https:' ? new https.Agent(agentOptions) : new http.Agent(agentOptions);
    const path = options.endpoint === 'chat' ? '/v1/chat/completions' : '/v1/completions';
    this.url = new URL(path, base);
  }

  close(): void {
    this.agent.destroy();
  }

  async stream(request: GenerationRequest, observer: StreamObserver, timeoutMs: number): Promise<void> {
    const body = JSON.stringify(this.requestBody(request));
    try {
      await this.attempt(body, observer, timeoutMs);
    } catch (err) {
      // A server may close a kept-alive connection as the next request goes out on it (cpp-httplib's
      // llama-server does after a streamed response): the request never reached it, and Node's
      // documented answer is to send it again on a new connection, once. Not through the pool:
      // it may hold other connections the server has closed just as this one (one per client).
      if (!(err instanceof StaleSocketError)) throw err;
      await this.attempt(body, observer, timeoutMs, false);
    }
  }

  /**
   * One try; a reset of a reused connection before any response is a StaleSocketError when
   * mayRetry. The retry (mayRetry false) goes on a connection of its own, closed after it.
   */
  private attempt(body: string, observer: StreamObserver, timeoutMs: number, mayRetry = true): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      let settled = false;
      let sawDone = false;
      let chunkAtMs = 0;
      const finish = (err?: RequestError): void => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        if (err) {
          outgoing.destroy();
          reject(err);
        } else {
          resolve();
        }
      };
      const timer = setTimeout(
        () => finish(new RequestError('timeout', `no complete response within ${timeoutMs} ms`)),
        timeoutMs,
      );
      const parser = new SseParser((eventName, data) => {
        if (settled) return;
        if (data === '[DONE]') {
          sawDone = true;
          return;
        }
        if (eventName === 'error') return finish(new RequestError('stream_error', data));
        let chunk: StreamChunk;
        try {
          chunk = JSON.parse(data) as StreamChunk;
        } catch {
          return finish(new RequestError('bad_chunk', `unparsable stream event: ${data.slice(0, 200)}`));
        }
        const err = applyChunk(chunk, observer, chunkAtMs);
        if (err) finish(err);
      });
      const outgoing = this.requestModule.request(
        this.url,
        {
          method: 'POST',
          agent: mayRetry ? this.agent : false,
          headers: {
            'content-type': 'application/json',
            'content-length': Buffer.byteLength(body),
            accept: 'text/event-stream',
          },
        },
        (response) => {
          response.setEncoding('utf8');
          if (response.statusCode !== 200) {
            let errorBody = '';
            response.on('data', (text: string) => (errorBody += text));
            response.on('end', () =>
              finish(new RequestError(`http_${response.statusCode}`, describeErrorBody(errorBody))),
            );
            return;
          }
          response.on('data', (text: string) => {
            chunkAtMs = performance.now();
            parser.push(text);
          });
          response.on('end', () => {
            if (sawDone) finish();
            else finish(new RequestError('stream_incomplete', 'the stream ended before data: [DONE]'));
          });
          response.on('error', (err) => finish(new RequestError('stream_incomplete', err.message)));
          response.on('close', () => finish(new RequestError('stream_incomplete', 'the connection closed mid-stream')));
        },
      );
      let hasResponse = false;
      outgoing.once('response', () => (hasResponse = true));
      outgoing.on('error', (err: NodeJS.ErrnoException) => {
        if (mayRetry && !hasResponse && outgoing.reusedSocket && err.code === 'ECONNRESET' && !settled) {
          settled = true;
          clearTimeout(timer);
          outgoing.destroy();
          return reject(new StaleSocketError());
        }
        finish(new RequestError(isConnectError(err) ? 'connection' : 'stream_incomplete', err.code ?? err.message));
      });
      outgoing.end(body);
    });
  }

  private requestBody(request: GenerationRequest): Record<string, unknown> {
    const common = {
      ...this.options.requestFields,
      model: this.options.model,
      max_tokens: request.maxTokens,
      ignore_eos: true,
      stream: true,
      stream_options: { include_usage: true },
    };
    if (this.options.endpoint === 'chat') return { ...common, messages: request.messages };
    // The completions endpoint takes the conversation as one text, turns separated by blank lines.
    return { ...common, prompt: request.messages.map((message) => message.content).join('\n\n') };
  }
}

/** Reports the chunk's text and usage; returns the error a chunk carries instead, if any. */
function applyChunk(chunk: StreamChunk, observer: StreamObserver, atMs: number): RequestError | null {
  if (chunk.error !== undefined) {
    const message = typeof chunk.error === 'string' ? chunk.error : (chunk.error.message ?? JSON.stringify(chunk.error));
    return new RequestError('stream_error', message);
  }
  const choice = chunk.choices?.[0];
  if (choice) {
    const text = choice.delta ? (choice.delta.content ?? '') + (choice.delta.reasoning_content ?? '') : (choice.text ?? '');
    if (text !== '') observer.onText(text, atMs);
  }
  if (chunk.usage) {
    observer.onUsage({
      promptTokens: chunk.usage.prompt_tokens ?? null,
      completionTokens: chunk.usage.completion_tokens ?? null,
      cachedPromptTokens: chunk.usage.prompt_tokens_details?.cached_tokens ?? null,
    });
  }
  return null;
}

function describeErrorBody(body: string): string {
  try {
    const parsed = JSON.parse(body) as { error?: { message?: string } | string; message?: string };
    if (typeof parsed.error === 'string') return parsed.error;
    return parsed.error?.message ?? parsed.message ?? body.slice(0, 200);
  } catch {
    return body.slice(0, 200);
  }
}

/** A kept-alive connection that the server had closed: the request never reached it. */
class StaleSocketError extends Error {}

const CONNECT_ERROR_CODES = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EHOSTUNREACH', 'ENETUNREACH', 'EAI_AGAIN']);

function isConnectError(err: NodeJS.ErrnoException): boolean {
  return err.code !== undefined && CONNECT_ERROR_CODES.has(err.code);
}
