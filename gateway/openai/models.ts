// GET /v1/models in OpenAI's list format, with vLLM's max_model_len.
import type { FastifyInstance } from 'fastify';
import type { ModelRegistry } from '../served-model.ts';

export function registerModelsRoute(app: FastifyInstance, registry: ModelRegistry) {
  app.get('/v1/models', async () => ({
    object: 'list',
    data: registry.models.map((model) => ({
      id: model.name,
      object: 'model',
      created: model.createdAtSec,
      owned_by: 'conduit',
      max_model_len: model.maxModelLen,
    })),
  }));
}
