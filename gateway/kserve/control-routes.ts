// The HTTP routes of Triton's shared-memory, trace and logging extensions (under /v2):
// /systemsharedmemory[/region/{r}]/{status,register,unregister}, the same for /cudasharedmemory
// (answered as a Triton built without GPU support), /[models/{m}/]trace/setting and /logging.
// All of them are administrative: with API keys, only an admin key may call them (auth.ts).
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { ClassicError, type ModelRepository } from '../../triton/index.ts';
import { adminOnly } from '../auth.ts';
import {
  CUDA_SHARED_MEMORY_SURFACE, LOGGING_SURFACE, SHARED_MEMORY_SURFACE, TRACE_SURFACE, type KServeControl,
} from './control.ts';
import { cudaRegisterError, cudaStatus } from './cuda-shared-memory.ts';
import type { SettingValue } from './trace.ts';

export interface ControlRouteHelpers {
  /** The request body as a JSON object ({} when empty). */
  jsonBody(request: FastifyRequest): Record<string, unknown>;
  send(request: FastifyRequest, reply: FastifyReply, body: string, contentType: string): unknown;
}

type RegionParams = { region?: string };

/** A trace setting's JSON value: a string, a list of strings, or null to clear (numbers read as their digits). */
function settingValue(name: string, value: unknown): SettingValue {
  if (value === null || typeof value === 'string') return value;
  if (typeof value === 'number' && Number.isInteger(value)) return String(value);
  if (Array.isArray(value) && value.every((item) => typeof item === 'string')) return value;
  throw new ClassicError('INVALID_ARG', `trace setting '${name}' must be a string, a list of strings or null`);
}

export function registerControlRoutes(app: FastifyInstance, control: KServeControl, repository: ModelRepository, helpers: ControlRouteHelpers) {
  const { jsonBody, send } = helpers;
  const sendJson = (request: FastifyRequest, reply: FastifyReply, body: unknown) => send(request, reply, JSON.stringify(body), 'application/json');
  const { sharedMemory } = control;
  const sharedMemoryAdmin = { onRequest: adminOnly(SHARED_MEMORY_SURFACE) };
  const cudaAdmin = { onRequest: adminOnly(CUDA_SHARED_MEMORY_SURFACE) };
  const traceAdmin = { onRequest: adminOnly(TRACE_SURFACE) };
  const loggingAdmin = { onRequest: adminOnly(LOGGING_SURFACE) };

  for (const url of ['/systemsharedmemory/status', '/systemsharedmemory/region/:region/status']) {
    app.get<{ Params: RegionParams }>(url, sharedMemoryAdmin, async (request, reply) => sendJson(request, reply, sharedMemory.status(request.params.region ?? null)));
  }
  app.post<{ Params: { region: string } }>('/systemsharedmemory/region/:region/register', sharedMemoryAdmin, async (request, reply) => {
    const body = jsonBody(request);
    sharedMemory.register(request.params.region, body.key as string, body.offset, body.byte_size);
    return reply.code(200).send();
  });
  for (const url of ['/systemsharedmemory/unregister', '/systemsharedmemory/region/:region/unregister']) {
    app.post<{ Params: RegionParams }>(url, sharedMemoryAdmin, async (request, reply) => {
      sharedMemory.unregister(request.params.region ?? null);
      return reply.code(200).send();
    });
  }

  for (const url of ['/cudasharedmemory/status', '/cudasharedmemory/region/:region/status']) {
    app.get<{ Params: RegionParams }>(url, cudaAdmin, async (request, reply) => sendJson(request, reply, cudaStatus(request.params.region ?? null)));
  }
  app.post<{ Params: { region: string } }>('/cudasharedmemory/region/:region/register', cudaAdmin, async (request) => {
    throw cudaRegisterError(request.params.region);
  });
  // Nothing is ever registered, and unregistering an unknown region succeeds in Triton.
  for (const url of ['/cudasharedmemory/unregister', '/cudasharedmemory/region/:region/unregister']) {
    app.post(url, cudaAdmin, async (_request, reply) => reply.code(200).send());
  }

  for (const url of ['/trace/setting', '/models/:model/trace/setting']) {
    const modelOf = (request: FastifyRequest<{ Params: { model?: string } }>) => {
      const { model } = request.params;
      if (model === undefined) return null;
      repository.get(model, null);
      return model;
    };
    app.get<{ Params: { model?: string } }>(url, traceAdmin, async (request, reply) => sendJson(request, reply, control.trace.settings(modelOf(request))));
    app.post<{ Params: { model?: string } }>(url, traceAdmin, async (request, reply) => {
      const model = modelOf(request);
      const changes = Object.fromEntries(Object.entries(jsonBody(request)).map(([name, value]) => [name, settingValue(name, value)]));
      control.trace.update(model, changes);
      return sendJson(request, reply, control.trace.settings(model));
    });
  }

  app.get('/logging', loggingAdmin, async (request, reply) => sendJson(request, reply, control.logging.get()));
  app.post('/logging', loggingAdmin, async (request, reply) => sendJson(request, reply, control.logging.update(jsonBody(request))));
}
