// GET /health: 200 when the gateway is ready and every model has at least one worker serving,
// 503 otherwise, with the gateway's state (starting, ready, draining) in the body. A worker
// serves while its engine stream is up (it has reported its load, and heartbeats every second;
// one silent past worker_heartbeat_timeout_s loses its stream), which is what routing goes by
// too: the probe reads that state and never waits on a worker, so a stopped one cannot slow it.
import type { FastifyPluginAsync } from 'fastify';
import { NOT_READY_RETRY_AFTER_S, type Readiness } from './readiness.ts';
import type { ServedModel } from './served-model.ts';

export interface HealthPluginOptions {
  models: readonly ServedModel[];
  readiness: Readiness;
}

export const healthPlugin: FastifyPluginAsync<HealthPluginOptions> = async (app, { models, readiness }) => {
  app.get('/health', async (_request, reply) => {
    const modelStates = models.map((model) => ({
      name: model.name,
      numServingWorkers: model.workers.filter((worker) => worker.load !== null).length,
      numWorkers: model.workers.length,
    }));
    const { state } = readiness;
    const isHealthy = state === 'ready' && modelStates.every((modelState) => modelState.numServingWorkers > 0);
    if (state !== 'ready') reply.header('retry-after', String(NOT_READY_RETRY_AFTER_S));
    return reply.code(isHealthy ? 200 : 503).send({ status: isHealthy ? 'ok' : 'unavailable', state, models: modelStates });
  });
};
