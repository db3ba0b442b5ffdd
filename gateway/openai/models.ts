// GET /v1/models in OpenAI's list format (with vLLM's max_model_len) and GET /v1/models/{model}.
import type { FastifyInstance } from 'fastify';
import type { RegisteredModel, ModelRegistry } from '../served-model.ts';

function modelCard(model: RegisteredModel) {
  return { id: model.name, object: 'model', created: model.createdAtSec, owned_by: 'conduit', max_model_len: model.maxModelLen };
}

export function registerModelsRoute(app: FastifyInstance, registry: ModelRegistry) {
  app.get('/v1/models', async () => ({ object: 'list', data: registry.models.map(modelCard) }));
  app.get<{ Params: { model: string } }>('/v1/models/:model', async (request) => modelCard(registry.get(request.params.model)));
}
