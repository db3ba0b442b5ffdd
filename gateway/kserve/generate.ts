// Triton's generate extension for the LLMs (server docs/protocol/extension_generate.md):
// POST /v2/models/{m}[/versions/{v}]/generate answers once with the whole text;
// /generate_stream answers with Server-Sent Events, one `data: {...}` per text delta, and an
// error after the first event as a `data: {"error": "..."}` event inside the 200 response.
// `exclude_input_in_output` as Triton's vLLM backend has it: /generate echoes the prompt before
// the text unless it is true; streaming never echoes, and refuses it set to false.
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import type { SamplingParams } from '../../engine/types.ts';
import { ApiError, toKServeBody } from '../errors.ts';
import { ranges } from '../openai/schemas.ts';
import { startGeneration, type GenerationFinish, type GenerationRequest } from '../generation.ts';
import type { GatewayMetrics } from '../metrics.ts';
import type { LoadedModel, ModelRegistry } from '../served-model.ts';

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

function samplingOf(fields: Fields, maxTokens: number): SamplingParams {
  const sampling: SamplingParams = { maxTokens };
  if (fields.temperature !== undefined) sampling.temperature = fields.temperature;
  if (fields.top_p !== undefined) sampling.topP = fields.top_p;
  if (fields.top_k !== undefined) sampling.topK = Math.max(0, fields.top_k);
  if (fields.seed !== undefined) sampling.seed = BigInt.asUintN(64, BigInt(fields.seed));
  if (fields.ignore_eos !== undefined) sampling.ignoreEos = fields.ignore_eos;
  return sampling;
}

/**
 * A generate request's GenerationRequest, the prompt it echoes and the head of each answer; the
 * LLMs' v2 infer (llm-models.ts) reads its tensors into the same JSON and comes here too.
 */
export function prepareGenerate(model: LoadedModel, json: unknown, streamed: boolean, arrivalMs: number, trace?: GenerationRequest['trace']) {
  const body = parse(json);
  const fields: Fields = { ...body, ...body.parameters };
  if (streamed && fields.exclude_input_in_output === false) {
    throw new ApiError('invalid_request', 'When streaming, `exclude_input_in_output` = False is not allowed.');
  }
  const echoedPrompt = !streamed && fields.exclude_input_in_output !== true ? body.text_input : '';
  const promptTokenIds = model.tokenizer.encode(body.text_input, { addSpecialTokens: true });
  const maxTokens = Math.min(fields.max_tokens ?? model.defaultMaxTokens ?? DEFAULT_MAX_TOKENS, model.maxModelLen - promptTokenIds.length);
  if (maxTokens < 1) {
    throw new ApiError('context_length_exceeded', `the prompt has ${promptTokenIds.length} tokens; the model's context is ${model.maxModelLen}`);
  }
  const head = { ...(body.id === undefined ? {} : { id: body.id }), model_name: model.name, model_version: '1' };
  const stopStrings = fields.stop === undefined ? [] : typeof fields.stop === 'string' ? [fields.stop] : fields.stop;
  const generationRequest = {
    model, promptTokenIds, sampling: samplingOf(fields, maxTokens), stopStrings, wantsLogprobs: false, arrivalMs, trace,
  };
  return { generationRequest, echoedPrompt, head };
}

export interface GenerateRoutesOptions {
  registry: ModelRegistry;
  metrics: GatewayMetrics;
  /** Unsent bytes a generate_stream reader may pile up before its request is cancelled (server.stream_max_buffered_bytes). */
  maxBufferedBytes: number;
  /** The request's JSON object (parsed as every body is), {} for an empty body. */
  jsonBody(request: FastifyRequest): Record<string, unknown>;
  /** Whether the name is a model of the repository (which exists, but takes infer, not generate). */
  isOrdinaryModel(name: string): boolean;
}

/** Registers generate and generate_stream for the LLMs of the registry. */
/** A stream cut for a slow reader ends with its error event; a reader that has not taken it this long after is dropped. */
const SLOW_READER_GRACE_MS = 10_000;

export function registerGenerateRoutes(app: FastifyInstance, { registry, metrics, jsonBody, maxBufferedBytes, isOrdinaryModel }: GenerateRoutesOptions) {
  const handle = async (request: FastifyRequest<{ Params: { model: string; version?: string } }>, reply: FastifyReply, streamed: boolean) => {
    const arrivalMs = performance.now();
    let model: LoadedModel;
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
    const { generationRequest, echoedPrompt, head } = prepareGenerate(model, jsonBody(request), streamed, arrivalMs, request.trace);

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
        const error = new ApiError(
          'client_too_slow',
          `The client read the stream too slowly: ${numUnsentBytes} bytes were waiting to be sent, more than the ` +
            `${maxBufferedBytes}-byte limit, so the request was cancelled.`,
        );
        request.log.warn({ numUnsentBytes }, 'stream cancelled: the client reads too slowly');
        raw.end(`data: ${JSON.stringify(toKServeBody(error))}\n\n`);
        const destroyTimer = setTimeout(() => raw.destroy(), SLOW_READER_GRACE_MS).unref();
        raw.once('close', () => clearTimeout(destroyTimer));
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
