// A real OpenAI-style SSE server on 127.0.0.1 whose chunks, delays and failures follow a
// script: the reference the tests check metric arithmetic against, and, with zero delays, the
// instantly answering server that bench-self.ts measures the load generator with.
// Its /tokenize and /detokenize treat each whitespace-separated word as one token.

import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { performance } from 'node:perf_hooks';

export interface ScriptedChunk {
  /** Wait before sending this chunk, measured from the previous one (or from the request). */
  delayMs: number;
  text: string;
}

export interface ScriptedResponse {
  /** Answer with this HTTP status and an OpenAI error envelope instead of a stream. */
  status?: number;
  chunks: ScriptedChunk[];
  /** Sent as the final usage chunk; omit to send none. */
  usage?: { promptTokens: number; completionTokens: number; cachedTokens?: number };
  /** After the chunks: `error` sends an error event, `hangup` closes without [DONE]. */
  ending?: 'done' | 'error' | 'hangup';
}

export interface ReceivedRequest {
  path: string;
  body: Record<string, unknown>;
  /** performance.now() when the request arrived, when each text chunk and the end were written. */
  receivedMs: number;
  textWritesMs: number[];
  endMs: number;
}

export interface ScriptedServer {
  baseUrl: string;
  received: ReceivedRequest[];
  close(): Promise<void>;
}

export interface ScriptedServerOptions {
  script: (request: ReceivedRequest, index: number) => ScriptedResponse;
  /**
   * Serve the word tokenizer; without it /tokenize answers 404. 'content': a /tokenize that reads
   * `content` rather than `prompt`, as llama-server's does, so it finds no words in our requests.
   */
  tokenizer?: boolean | 'content';
  /** Keep received requests (tests) or not (benchmarks). */
  recordRequests?: boolean;
}

const BOS_ID = 1;

export async function startScriptedServer(options: ScriptedServerOptions): Promise<ScriptedServer> {
  const received: ReceivedRequest[] = [];
  const idsByWord = new Map<string, number>();
  const wordsById: string[] = ['<pad>', '<s>'];
  const wordId = (word: string): number => {
    let id = idsByWord.get(word);
    if (id === undefined) {
      id = wordsById.length;
      idsByWord.set(word, id);
      wordsById.push(word);
    }
    return id;
  };
  let numGenerations = 0;
  const server = http.createServer((req, res) => {
    const receivedMs = performance.now();
    let rawBody = '';
    req.setEncoding('utf8');
    req.on('data', (text: string) => (rawBody += text));
    req.on('end', () => {
      const request: ReceivedRequest = {
        path: req.url ?? '',
        body: rawBody ? JSON.parse(rawBody) : {},
        receivedMs,
        textWritesMs: [],
        endMs: NaN,
      };
      if (request.path === '/tokenize' || request.path === '/detokenize') {
        if (!options.tokenizer) return sendJson(res, 404, { error: { message: 'Not Found' } });
        if (request.path === '/tokenize') {
          const text = options.tokenizer === 'content' ? request.body.content : request.body.prompt;
          const words = String(text ?? '').split(/\s+/).filter((word) => word !== '');
          const tokens = [BOS_ID, ...words.map(wordId)];
          return sendJson(res, 200, { tokens, count: tokens.length, max_model_len: 1 << 20 });
        }
        const ids = request.body.tokens as number[];
        return sendJson(res, 200, { prompt: ids.map((id) => wordsById[id]).join(' ') });
      }
      if (options.recordRequests !== false) received.push(request);
      const response = options.script(request, numGenerations++);
      if (response.status !== undefined) {
        return sendJson(res, response.status, { error: { message: `scripted failure ${response.status}`, type: 'server_error' } });
      }
      streamResponse(res, request, response);
    });
  });
  server.keepAliveTimeout = 60_000;
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    baseUrl: `http://127.0.0.1:${port}`,
    received,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

function sendJson(res: http.ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

function chunkEvent(isChat: boolean, text: string): string {
  const choice = isChat ? { index: 0, delta: { content: text }, finish_reason: null } : { index: 0, text, finish_reason: null };
  return `data: ${JSON.stringify({ id: 'x', object: isChat ? 'chat.completion.chunk' : 'text_completion', choices: [choice] })}\n\n`;
}

function streamResponse(res: http.ServerResponse, request: ReceivedRequest, response: ScriptedResponse): void {
  const isChat = request.path === '/v1/chat/completions';
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  // A role-only first chunk, as vLLM sends: it carries no text and must not count as the first token.
  if (isChat) res.write(`data: ${JSON.stringify({ choices: [{ index: 0, delta: { role: 'assistant', content: '' } }] })}\n\n`);
  let next = 0;
  const sendDueChunks = (): void => {
    do {
      res.write(chunkEvent(isChat, response.chunks[next].text));
      request.textWritesMs.push(performance.now());
      next++;
    } while (next < response.chunks.length && response.chunks[next].delayMs <= 0);
    if (next < response.chunks.length) setTimeout(sendDueChunks, response.chunks[next].delayMs);
    else finish();
  };
  const finish = (): void => {
    request.endMs = performance.now();
    const ending = response.ending ?? 'done';
    if (ending === 'hangup') return void res.socket?.destroy();
    if (ending === 'error') {
      res.end(`data: ${JSON.stringify({ error: { message: 'scripted mid-stream failure', code: 500 } })}\n\n`);
      return;
    }
    if (response.usage) {
      const { promptTokens, completionTokens, cachedTokens } = response.usage;
      const usage = {
        prompt_tokens: promptTokens,
        completion_tokens: completionTokens,
        total_tokens: promptTokens + completionTokens,
        ...(cachedTokens === undefined ? {} : { prompt_tokens_details: { cached_tokens: cachedTokens } }),
      };
      res.write(`data: ${JSON.stringify({ choices: [], usage })}\n\n`);
    }
    res.end('data: [DONE]\n\n');
  };
  if (response.chunks.length === 0) finish();
  else if (response.chunks[0].delayMs > 0) setTimeout(sendDueChunks, response.chunks[0].delayMs);
  else sendDueChunks();
}
