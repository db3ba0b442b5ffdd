// GET /health: 200 when every model has at least one worker serving, 503 otherwise. Each
// worker is asked with a timeout, so a hung worker makes the probe fail instead of hang.
import type { FastifyPluginAsync } from 'fastify';
import type { ServedModel } from './served-model.ts';
import { probeWorker } from './worker-health.ts';

export interface HealthPluginOptions {
  models: readonly ServedModel[];
}

export const healthPlugin: FastifyPluginAsync<HealthPluginOptions> = async (app, { models }) => {
  app.get('/health', async (_request, reply) => {
    const modelStates = await Promise.all(
      models.map(async (model) => {
        const healths = await Promise.all(model.workers.map((worker) => probeWorker(worker)));
        return {
          name: model.name,
          numServingWorkers: healths.filter((health) => health !== null && health.serving).length,
          numWorkers: model.workers.length,
        };
      }),
    );
    const isHealthy = modelStates.every((state) => state.numServingWorkers > 0);
    return reply.code(isHealthy ? 200 : 503).send({ status: isHealthy ? 'ok' : 'unavailable', models: modelStates });
  });
};
