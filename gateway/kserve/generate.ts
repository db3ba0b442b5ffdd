// Triton's generate extension for the LLMs (server docs/protocol/extension_generate.md):
// POST /v2/models/{m}[/versions/{v}]/generate answers once with the whole text;
// /generate_stream answers with Server-Sent Events, one `data: {...}` per text delta, and an
// error after the first event as a `data: {"error": "..."}` event inside the 200 response.
// `exclude_input_in_output` as Triton's vLLM backend has it: /generate echoes the prompt before
// the text unless it is true; streaming never echoes, and refuses it set to false.
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { ApiError, toKServeBody } from '../errors.ts';
import { ranges } from '../openai/schemas.ts';
import { jsonBody } from './body.ts';
import { startGeneration, type GenerationFinish } from '../generation.ts';
import { generationRequestOf, originOf, samplingOf, type RequestOrigin } from '../generation-request.ts';
import type { IsWanted, PromptEncoder } from '../prompt-encoder.ts';
import type { GatewayMetrics } from '../metrics.ts';
import { clientIsConnected } from '../openai/respond.ts';
import { endSlowStream, slowReaderError } from '../slow-reader.ts';
import type { RegisteredModel, ModelRegistry } from '../served-model.ts';

/** Fields are read at the top level or under `parameters`, as Triton maps either onto the model's inputs. */
const fieldsSchema = z.object({
  // The OpenAI routes' ranges (openai/schemas.ts), checked before the engine's wire narrows them.
  max_tokens: ranges.maxTokens.optional(),
  temperature: ranges.temperature.optional(),
  top_p: ranges.topP.optional(),
  top_k: ranges.topK.optional(),
  seed: ranges.seed.optional(),
  stop: z.union([z.string(), z.array(z.string()).max(4)]).optional(),
  ignore_eos: z.boolean().optional(),
  stream: z.boolean().optional(),
  exclude_input_in_output: z.boolean().optional(),
});

const requestSchema = fieldsSchema.extend({
  id: z.string().optional(),
  text_input: z.string(),
  parameters: fieldsSchema.optional(),
});

type Fields = z.infer<typeof fieldsSchema>;

/** Without max_tokens, and without a default in the checkpoint, as vLLM's Triton backend. */
const DEFAULT_MAX_TOKENS = 16;

function parse(json: unknown): z.infer<typeof requestSchema> {
  const parsed = requestSchema.safeParse(json);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new ApiError('invalid_request', `${issue.path.join('.') || 'request'}: ${issue.message}`);
  }
  return parsed.data;
}

/**
 * A generate request's GenerationRequest, the prompt it echoes and the head of each answer; the
 * LLMs' v2 infer (llm-models.ts) reads its tensors into the same JSON and comes here too. The
 * prompt is encoded by the gateway's PromptEncoder (a large one off the event loop).
 */
export async function prepareGenerate(
  model: RegisteredModel, json: unknown, streamed: boolean, origin: RequestOrigin, prompts: PromptEncoder, isWanted?: IsWanted,
) {
  const body = parse(json);
  const fields: Fields = { ...body, ...body.parameters };
  if (streamed && fields.exclude_input_in_output === false) {
    throw new ApiError('invalid_request', 'When streaming, `exclude_input_in_output` = False is not allowed.');
  }
  const echoedPrompt = !streamed && fields.exclude_input_in_output !== true ? body.text_input : '';
  const promptTokenIds = await prompts.encodePrompt(model, body.text_input, true, { isWanted });
  const maxTokens = Math.min(fields.max_tokens ?? model.defaultMaxTokens ?? DEFAULT_MAX_TOKENS, model.maxModelLen - promptTokenIds.length);
  if (maxTokens < 1) {
    throw new ApiError('context_length_exceeded', `the prompt has ${promptTokenIds.length} tokens; the model's context is ${model.maxModelLen}`);
  }
  const head = { ...(body.id === undefined ? {} : { id: body.id }), model_name: model.name, model_version: '1' };
  const generationRequest = generationRequestOf(origin, fields, {
    model, promptTokenIds, sampling: samplingOf(model, fields, maxTokens), wantsLogprobs: false,
  });
  return { generationRequest, echoedPrompt, head };
}

export interface GenerateRoutesOptions {
  registry: ModelRegistry;
  metrics: GatewayMetrics;
  /** Tokenizes each prompt, a large one off the event loop (the /v1 routes' encoder). */
  prompts: PromptEncoder;
  /** Unsent bytes a generate_stream reader may pile up before its request is cancelled (server.stream_max_buffered_bytes). */
  maxBufferedBytes: number;
  /** Whether the name is a model of the repository (which exists, but takes infer, not generate). */
  isOrdinaryModel(name: string): boolean;
}

/** Registers generate and generate_stream for the LLMs of the registry. */
export function registerGenerateRoutes(app: FastifyInstance, { registry, metrics, prompts, maxBufferedBytes, isOrdinaryModel }: GenerateRoutesOptions) {
  const handle = async (request: FastifyRequest<{ Params: { model: string; version?: string } }>, reply: FastifyReply, streamed: boolean) => {
    const arrivalMs = performance.now();
    let model: RegisteredModel;
    try {
      model = registry.get(request.params.model);
    } catch {
      if (isOrdinaryModel(request.params.model)) {
        throw new ApiError('invalid_request', `model '${request.params.model}' does not support generate: it is not an LLM (send it infer requests)`);
      }
      throw new ApiError('model_not_found', `Request for unknown model: '${request.params.model}' is not found`);
    }
    if (request.params.version !== undefined && request.params.version !== '1') {
      throw new ApiError('model_not_found', `Request for unknown model: '${model.name}' version ${request.params.version} is not found`);
    }
    const { generationRequest, echoedPrompt, head } = await prepareGenerate(
      model, jsonBody(request), streamed, originOf(request, arrivalMs), prompts, clientIsConnected(request),
    );

    if (!streamed) {
      let text = '';
      const finish = await new Promise<GenerationFinish>((resolve, reject) => {
        const generation = startGeneration(generationRequest, { onText: (delta) => { text += delta; }, onFinish: resolve, onError: reject }, metrics);
        // The response closing before it was written means the client left.
        reply.raw.once('close', () => { if (!reply.raw.writableEnded) generation.abort(); });
      });
      return reply.type('application/json').send({ ...head, text_output: echoedPrompt + text, finish_reason: finish.finishReason, usage: finish.usage });
    }

    // Headers wait for the first text, so an error before it is a plain HTTP error.
    return new Promise<void>((resolve, reject) => {
      let started = false;
      const start = () => {
        if (started) return;
        started = true;
        reply.hijack();
        reply.raw.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache' });
      };
      const raw = reply.raw;
      let isCut = false;
      const write = (event: unknown) => raw.write(`data: ${JSON.stringify(event)}\n\n`);
      // As every stream: past the bound of unsent bytes the request is cancelled in its worker and the reader cut.
      const cutIfTooSlow = () => {
        const numUnsentBytes = raw.writableLength;
        if (numUnsentBytes <= maxBufferedBytes) return;
        isCut = true;
        generation.abort();
        request.log.warn({ numUnsentBytes }, 'stream cancelled: the client reads too slowly');
        endSlowStream(raw, `data: ${JSON.stringify(toKServeBody(slowReaderError(numUnsentBytes, maxBufferedBytes)))}\n\n`);
        resolve();
      };
      const generation = startGeneration(generationRequest, {
        onText: (delta) => {
          if (isCut) return;
          start();
          write({ ...head, text_output: delta });
          cutIfTooSlow();
        },
        onFinish: (finish) => {
          if (isCut) return;
          start();
          write({ ...head, text_output: '', finish_reason: finish.finishReason, usage: finish.usage });
          reply.raw.end();
          resolve();
        },
        onError: (error) => {
          if (isCut) return;
          if (!started) { reject(error); return; }
          write(toKServeBody(error));
          reply.raw.end();
          resolve();
        },
      }, metrics);
      reply.raw.once('close', () => {
        if (!reply.raw.writableEnded) generation.abort();
        resolve();
      });
    });
  };
  for (const prefix of ['/models/:model', '/models/:model/versions/:version(^\\d+)']) {
    app.post<{ Params: { model: string; version?: string } }>(`${prefix}/generate`, (request, reply) => handle(request, reply, false));
    app.post<{ Params: { model: string; version?: string } }>(`${prefix}/generate_stream`, (request, reply) => handle(request, reply, true));
  }
}
