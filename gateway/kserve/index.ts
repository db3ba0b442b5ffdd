// The KServe v2 / Triton HTTP surface (`/v2/...`) for the models of the model repository:
// health, server and model metadata, readiness, config, infer (JSON and binary), statistics and
// the repository extension; shared memory, trace and logging settings (control-routes.ts). Errors
// are Triton's `{"error": "..."}` with Triton's status codes.
import type { FastifyError, FastifyPluginAsync, FastifyRequest } from 'fastify';
import { ClassicError, fromConfigDataType, type ModelRepository, type ServedVersion } from '../../triton/index.ts';
import { fromFastifyError, toKServeBody } from '../errors.ts';
import type { OffloadPool } from '../offload/pool.ts';
import type { PromptEncoder } from '../prompt-encoder.ts';
import type { GatewayMetrics } from '../metrics.ts';
import type { ModelRegistry } from '../served-model.ts';
import { adminOnly } from '../auth.ts';
import { KServeControl, REPOSITORY_SURFACE } from './control.ts';
import { registerControlRoutes } from './control-routes.ts';
import { isKServeError, toKServeError } from './errors.ts';
import { originOf } from '../generation-request.ts';
import { registerGenerateRoutes } from './generate.ts';
import { decodeInferRequest, encodeInferResponse } from './infer-codec.ts';
import { bodyOf, jsonBody, parseKServeBody, send } from './body.ts';
import { isLlmReady, isServerReady } from './readiness.ts';
import { KServeLlms } from './llm-models.ts';
import { EXTENSIONS, SERVER_NAME } from './server-metadata.ts';

export interface KServePluginOptions {
  /** The ordinary models; null when the server has no model repository. */
  repository: ModelRepository | null;
  /** The LLMs, for the generate extension. */
  registry: ModelRegistry;
  metrics: GatewayMetrics;
  version: string;
  /** Shared memory, trace and log settings, shared with the gRPC service; the plugin's own (closed with it) when omitted. */
  control?: KServeControl;
  /** Where a large body's JSON is parsed, off the event loop (the /v1 bodies' pool). */
  pool: OffloadPool;
  /** generate's prompts to token ids, a large one in the pool (the /v1 routes' encoder). */
  prompts: PromptEncoder;
  /** generate_stream's bound on unsent bytes for a slow reader. */
  maxBufferedBytes: number;
  /** The LLMs as v2 models, shared with the gRPC service; the plugin's own when omitted. */
  llms?: KServeLlms;
}

type ModelParams = { model: string; version?: string };

function versionOf(params: ModelParams): number | null {
  return params.version === undefined ? null : Number(params.version);
}

function metadataOf(repository: ModelRepository, served: ServedVersion) {
  const { config } = served;
  const batched = config.max_batch_size > 0;
  const tensors = (list: ReadonlyArray<{ name: string; data_type: Parameters<typeof fromConfigDataType>[0]; dims: number[] }>) =>
    list.map((t) => ({ name: t.name, datatype: fromConfigDataType(t.data_type), shape: batched ? [-1, ...t.dims] : t.dims }));
  const versions = repository.index(true).filter((entry) => entry.name === config.name).map((entry) => entry.version);
  return {
    name: config.name,
    versions,
    platform: config.platform ?? config.backend,
    inputs: tensors(config.input),
    outputs: tensors(config.output),
  };
}

/** The config as Triton's /config returns it: ModelConfig's fields, snake_case. */
function configJson(served: ServedVersion) {
  const { config } = served;
  return { ...config, platform: config.platform ?? '', backend: config.backend === 'ensemble' ? '' : config.backend };
}

/** Stands in when no repository is configured: every model is unknown, nothing to load. */
const NO_REPOSITORY = {
  isReady: () => true,
  index: () => [],
  loadedVersions: () => [],
  get(name: string): never {
    throw new ClassicError('NOT_FOUND', `Request for unknown model: '${name}' is not found`);
  },
  async load(): Promise<never> {
    throw new ClassicError('UNAVAILABLE', 'no model repository is configured (server model_repository)');
  },
  async unload(): Promise<never> {
    throw new ClassicError('UNAVAILABLE', 'no model repository is configured (server model_repository)');
  },
} as unknown as ModelRepository;

export const kservePlugin: FastifyPluginAsync<KServePluginOptions> = async (app, options) => {
  const repository = options.repository ?? NO_REPOSITORY;
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', { parseAs: 'buffer' }, async (request: FastifyRequest, body: Buffer) => parseKServeBody(request, body, options.pool));
  app.setErrorHandler((error: FastifyError, request, reply) => {
    const apiError = isKServeError(error) ? toKServeError(error) : fromFastifyError(error, app.initialConfig.bodyLimit!) ?? toKServeError(error);
    if (apiError.httpStatus >= 500 && apiError.code === 'internal_error') request.log.error({ err: error }, 'kserve request failed');
    return reply.code(apiError.httpStatus).type('application/json').send(toKServeBody(apiError));
  });
  app.setNotFoundHandler((_request, reply) => reply.code(404).type('application/json').send({ error: 'Not Found' }));

  // Health: Triton answers 400 when not live or ready, with an empty body.
  app.get('/health/live', async (_request, reply) => reply.code(200).send());
  app.get('/health/ready', async (_request, reply) => reply.code(isServerReady(repository, options.registry.models) ? 200 : 400).send());

  const llms = options.llms ?? new KServeLlms(options.registry, options.metrics, options.prompts);
  const isOrdinaryModel = (name: string) => repository.index(false).some((entry) => entry.name === name);
  registerGenerateRoutes(app, { registry: options.registry, metrics: options.metrics, prompts: options.prompts, maxBufferedBytes: options.maxBufferedBytes, isOrdinaryModel });

  const control = options.control ?? new KServeControl();
  if (options.control === undefined) app.addHook('onClose', async () => control.close());
  control.logging.attach(app.log);
  registerControlRoutes(app, control, repository);

  app.get('', async (request, reply) => send(request, reply, JSON.stringify({ name: SERVER_NAME, version: options.version, extensions: EXTENSIONS }), 'application/json'));

  const versioned = (suffix: string) => [`/models/:model${suffix}`, `/models/:model/versions/:version(^\\d+)${suffix}`];

  /** An LLM of the registry (version 1 only), for metadata and readiness; null when the name is not one. */
  const llmOf = (params: ModelParams) =>
    options.registry.models.find((model) => model.name === params.model && (params.version === undefined || params.version === '1')) ?? null;

  for (const url of versioned('')) {
    app.get<{ Params: ModelParams }>(url, async (request, reply) => {
      const llm = llmOf(request.params);
      const metadata = llm === null ? metadataOf(repository, repository.get(request.params.model, versionOf(request.params))) : llms.metadata(llm);
      return send(request, reply, JSON.stringify(metadata), 'application/json');
    });
  }

  for (const url of versioned('/ready')) {
    app.get<{ Params: ModelParams }>(url, async (request, reply) => {
      const llm = llmOf(request.params);
      let ready = llm !== null && isLlmReady(llm);
      if (llm === null) {
        try {
          repository.get(request.params.model, versionOf(request.params));
          ready = true;
        } catch {
          ready = false;
        }
      }
      if (!ready) return reply.code(400).type('application/json').send({ error: 'Model version not ready' });
      return reply.code(200).send();
    });
  }

  for (const url of versioned('/config')) {
    app.get<{ Params: ModelParams }>(url, async (request, reply) => {
      const llm = llmOf(request.params);
      const config = llm === null ? configJson(repository.get(request.params.model, versionOf(request.params))) : llms.configJson(llm);
      return send(request, reply, JSON.stringify(config), 'application/json');
    });
  }

  for (const url of versioned('/infer')) {
    // As Triton: the route exists, for POST only.
    app.get(url, async (_request, reply) => reply.code(405).header('allow', 'POST').type('application/json').send({ error: 'Method Not Allowed' }));
    app.post<{ Params: ModelParams }>(url, async (request, reply) => {
      const llm = llmOf(request.params);
      const served = llm === null ? repository.get(request.params.model, versionOf(request.params)) : { config: llms.config(llm), version: 1 };
      const headerValue = request.headers['inference-header-content-length'];
      let headerLength: number | null = null;
      if (headerValue !== undefined) {
        headerLength = Number(headerValue);
        if (!/^\d+$/.test(String(headerValue))) throw new ClassicError('INVALID_ARG', `Inference-Header-Content-Length '${String(headerValue)}' is not a byte count`);
      }
      const body = bodyOf(request);
      const decoded = decodeInferRequest(body.bytes, headerLength, body.json, served.config, control.sharedMemoryFor(request.apiKey));
      const order = decoded.outputs ?? served.config.output.map((output) => ({ name: output.name, binary: decoded.binaryByDefault, sharedMemory: null }));
      if (llm !== null) {
        const aborted = new AbortController();
        reply.raw.once('close', () => { if (!reply.raw.writableEnded) aborted.abort(); });
        // The client may have left while its body was read, before the listener existed.
        if (reply.raw.socket === null || reply.raw.socket.destroyed) aborted.abort();
        const parameters = (jsonBody(request).parameters ?? {}) as Record<string, unknown>;
        const llmOutputs = await llms.infer(
          llm, { id: decoded.id, inputs: decoded.inputs, parameters, requestedOutputs: order.map((o) => o.name) }, {}, aborted.signal,
          originOf(request, performance.now()),
        );
        const encodedLlm = encodeInferResponse(llm.name, 1, decoded.id, llmOutputs, order);
        if (encodedLlm.jsonLength === null) return send(request, reply, encodedLlm.body, 'application/json');
        reply.header('inference-header-content-length', String(encodedLlm.jsonLength));
        return send(request, reply, encodedLlm.body, 'application/octet-stream');
      }
      const outputs = await control.infer(served as ServedVersion, {
        inputs: decoded.inputs,
        requestedOutputs: order.map((output) => output.name),
        priority: decoded.priority,
        timeoutUs: decoded.timeoutUs,
        sequence: decoded.sequence,
      }, decoded.id, order);
      const encoded = encodeInferResponse(served.config.name, served.version, decoded.id, outputs, order);
      if (encoded.jsonLength === null) return send(request, reply, encoded.body, 'application/json');
      reply.header('inference-header-content-length', String(encoded.jsonLength));
      return send(request, reply, encoded.body, 'application/octet-stream');
    });
  }

  app.get('/models/stats', async (request, reply) => {
    const modelStats = [...repository.loadedVersions().map((served) => served.stats.stats), ...llms.stats(null)];
    return send(request, reply, JSON.stringify({ model_stats: modelStats }), 'application/json');
  });
  for (const url of versioned('/stats')) {
    app.get<{ Params: ModelParams }>(url, async (request, reply) => {
      const version = versionOf(request.params);
      const llm = llmOf(request.params);
      if (llm !== null) return send(request, reply, JSON.stringify({ model_stats: llms.stats(llm.name) }), 'application/json');
      repository.get(request.params.model, version);
      const modelStats = repository.loadedVersions()
        .filter((served) => served.config.name === request.params.model && (version === null || served.version === version))
        .map((served) => served.stats.stats);
      return send(request, reply, JSON.stringify({ model_stats: modelStats }), 'application/json');
    });
  }

  for (const url of ['/repository/index', '/repository/:repository/index']) {
    app.post(url, async (request, reply) => {
      const ready = jsonBody(request).ready;
      if (ready !== undefined && typeof ready !== 'boolean') throw new ClassicError('INVALID_ARG', "'ready' must be a boolean");
      return send(request, reply, JSON.stringify([...repository.index(ready === true), ...llms.index(ready === true)]), 'application/json');
    });
  }

  const parametersOf = (request: FastifyRequest): Record<string, unknown> => {
    const parameters = jsonBody(request).parameters ?? {};
    if (typeof parameters !== 'object' || parameters === null || Array.isArray(parameters)) throw new ClassicError('INVALID_ARG', "'parameters' must be an object");
    return parameters as Record<string, unknown>;
  };

  const repositoryAdmin = { onRequest: adminOnly(REPOSITORY_SURFACE) };
  app.post<{ Params: { model: string } }>('/repository/models/:model/load', repositoryAdmin, async (request, reply) => {
    const parameters = parametersOf(request);
    if (Object.keys(parameters).some((key) => key.startsWith('file:'))) {
      throw new ClassicError('UNSUPPORTED', "loading model files through 'file:' parameters is not supported; put them in the repository");
    }
    const config = parameters.config;
    if (config !== undefined && typeof config !== 'string') throw new ClassicError('INVALID_ARG', "'config' must be a string holding the model config JSON");
    await repository.load(request.params.model, config ?? null);
    return reply.code(200).send();
  });

  app.post<{ Params: { model: string } }>('/repository/models/:model/unload', repositoryAdmin, async (request, reply) => {
    const unloadDependents = parametersOf(request).unload_dependents;
    if (unloadDependents !== undefined && typeof unloadDependents !== 'boolean') throw new ClassicError('INVALID_ARG', "'unload_dependents' must be a boolean");
    await repository.unload(request.params.model, unloadDependents === true);
    return reply.code(200).send();
  });
};
