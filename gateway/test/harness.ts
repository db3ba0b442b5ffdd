// Starts a real gateway on 127.0.0.1:0 over a scripted engine and a gpt2-tokenized model dir.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { FastifyInstance } from 'fastify';
import { HASH_SCHEME } from '../../engine/kv/block-hash.ts';
import type { GenerateRequest } from '../../engine/types.ts';
import type { GatewayLimits } from '../limits.ts';
import { createGateway, createMetricsServer, GatewayMetrics, type GatewayOptions, type ResponsesSettings, type ServedModel } from '../server.ts';
import { loadTokenizer } from '../tokenizer/load.ts';
import type { Tokenizer } from '../tokenizer/tokenizer.ts';
import { ScriptedEngine, type Script } from './scripted-engine.ts';

export const MODEL_NAME = 'tiny';
export const MAX_MODEL_LEN = 64;
export const BODY_LIMIT_BYTES = 4096;
const CHAT_TEMPLATE =
  "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";

export interface TestGateway {
  baseUrl: string;
  metricsUrl: string;
  engine: ScriptedEngine;
  /** Every worker of both models: engine, then any more that numWorkers asked for. */
  engines: ScriptedEngine[];
  tokenizer: Tokenizer;
  /** Token ids of text, as the model would generate them. */
  tokens(text: string): number[];
  post(route: string, body: unknown): Promise<Response>;
  close(): Promise<void>;
}

export interface TestGatewayOptions {
  /** The chat template of the `tiny` model (default: CHAT_TEMPLATE). */
  chatTemplate?: string;
  responses?: Partial<ResponsesSettings>;
  /** More createGateway options: keys and limits, readiness, a logger. */
  gatewayOptions?: Partial<GatewayOptions>;
  /** Registers more plugins or routes before the gateway listens. */
  beforeListen?: (app: FastifyInstance) => Promise<void>;
  limits?: Partial<GatewayLimits>;
  bodyLimitBytes?: number;
  /** Also serve LONG_MODEL_NAME (the same tokenizer and template) with this context length. */
  longModelLen?: number;
  /** Scripted workers behind both models (default 1), routed by their router. */
  numWorkers?: number;
  /** The `tiny` checkpoint's generation_config.json (default: none). */
  generationConfig?: Record<string, unknown>;
  /** The `tiny` checkpoint's tokenizer.json, in place of gpt2's tiktoken encoding. */
  tokenizerJson?: Record<string, unknown>;
  /** Special tokens the `tiny` checkpoint adds after gpt2's (ids from 50257 on), e.g. Mistral's [TOOL_CALLS]. */
  addedSpecialTokens?: readonly string[];
}

function writeModelDir(dir: string, chatTemplate: string | null, addedSpecialTokens: readonly string[] = []) {
  mkdirSync(dir);
  writeFileSync(
    path.join(dir, 'tokenizer_config.json'),
    JSON.stringify({
      tiktoken_encoding: 'gpt2',
      bos_token: '<|endoftext|>',
      eos_token: '<|endoftext|>',
      added_tokens_decoder: Object.fromEntries([
        ['50256', { content: '<|endoftext|>', special: true }],
        ...addedSpecialTokens.map((content, i) => [String(50257 + i), { content, special: true }]),
      ]),
      ...(chatTemplate === null ? {} : { chat_template: chatTemplate }),
    }),
  );
}

export const LONG_MODEL_NAME = 'long';

export async function startTestGateway(
  scriptFor: (request: GenerateRequest) => Script,
  options: TestGatewayOptions = {},
): Promise<TestGateway> {
  const tmpDir = mkdtempSync(path.join(os.tmpdir(), 'conduit-gateway-'));
  const modelDir = path.join(tmpDir, MODEL_NAME);
  const plainModelDir = path.join(tmpDir, 'plain');
  writeModelDir(modelDir, options.chatTemplate ?? CHAT_TEMPLATE, options.addedSpecialTokens);
  writeModelDir(plainModelDir, null);
  if (options.generationConfig !== undefined) writeFileSync(path.join(modelDir, 'generation_config.json'), JSON.stringify(options.generationConfig));
  if (options.tokenizerJson !== undefined) writeFileSync(path.join(modelDir, 'tokenizer.json'), JSON.stringify(options.tokenizerJson));
  const { tokenizer } = loadTokenizer(modelDir);
  const modelInfo = {
    modelName: MODEL_NAME, maxModelLen: MAX_MODEL_LEN, vocabSize: 50257, blockSizeTokens: 16, eosTokenIds: [50256], blockHashScheme: HASH_SCHEME,
  };
  const engines = Array.from({ length: options.numWorkers ?? 1 }, (_, i) => new ScriptedEngine(modelInfo, scriptFor, `scripted:${i}`));
  const engine = engines[0];
  const models: ServedModel[] = [
    { name: MODEL_NAME, modelDir, maxModelLen: MAX_MODEL_LEN, workers: [...engines] },
    { name: 'plain', modelDir: plainModelDir, maxModelLen: MAX_MODEL_LEN, workers: [...engines] },
    ...(options.longModelLen === undefined ? [] : [{ name: LONG_MODEL_NAME, modelDir, maxModelLen: options.longModelLen, workers: [...engines] }]),
  ];
  const metrics = new GatewayMetrics(models);
  const gateway: FastifyInstance = await createGateway({
    models,
    bodyLimitBytes: options.bodyLimitBytes ?? BODY_LIMIT_BYTES,
    metrics,
    limits: options.limits,
    responses: options.responses,
    ...options.gatewayOptions,
  });
  await options.beforeListen?.(gateway);
  const metricsServer = await createMetricsServer({ metrics });
  const baseUrl = await gateway.listen({ host: '127.0.0.1', port: 0 });
  const metricsUrl = await metricsServer.listen({ host: '127.0.0.1', port: 0 });
  return {
    baseUrl,
    metricsUrl,
    engine,
    engines,
    tokenizer,
    tokens: (text) => tokenizer.encode(text, { addSpecialTokens: false }),
    post: (route, body) =>
      fetch(`${baseUrl}${route}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: typeof body === 'string' || body instanceof Buffer ? body : JSON.stringify(body),
      }),
    async close() {
      await gateway.close();
      await metricsServer.close();
      rmSync(tmpDir, { recursive: true, force: true });
    },
  };
}

/** One token per step, so every token boundary is a chunk boundary. */
export function oneTokenPerStep(tokenIds: readonly number[]): number[][] {
  return tokenIds.map((id) => [id]);
}

/** The JSON payloads of an SSE body, with [DONE] as the string. */
export function sseEvents(body: string): unknown[] {
  if (!body.endsWith('\n\n')) throw new Error(`SSE body does not end with a blank line: ${JSON.stringify(body.slice(-40))}`);
  return body
    .slice(0, -2)
    .split('\n\n')
    .map((event) => {
      if (!event.startsWith('data: ')) throw new Error(`not an SSE data event: ${JSON.stringify(event)}`);
      const data = event.slice('data: '.length);
      if (data === '[DONE]') return data;
      const parsed = JSON.parse(data);
      if (JSON.stringify(parsed) !== data) throw new Error(`not compact JSON: ${data}`);
      return parsed;
    });
}
