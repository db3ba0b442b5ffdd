// GET /health: 200 when the gateway is ready and every model has at least one worker serving,
// 503 otherwise, with the gateway's state (starting, ready, draining) in the body. Each worker
// is asked with a timeout, so a hung worker makes the probe fail instead of hang.
import type { FastifyPluginAsync } from 'fastify';
import { NOT_READY_RETRY_AFTER_S, type Readiness } from './readiness.ts';
import type { ServedModel } from './served-model.ts';
import { probeWorker } from './worker-health.ts';

export interface HealthPluginOptions {
  models: readonly ServedModel[];
  readiness: Readiness;
}

export const healthPlugin: FastifyPluginAsync<HealthPluginOptions> = async (app, { models, readiness }) => {
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
    const { state } = readiness;
    const isHealthy = state === 'ready' && modelStates.every((modelState) => modelState.numServingWorkers > 0);
    if (state !== 'ready') reply.header('retry-after', String(NOT_READY_RETRY_AFTER_S));
    return reply.code(isHealthy ? 200 : 503).send({ status: isHealthy ? 'ok' : 'unavailable', state, models: modelStates });
  });
};
