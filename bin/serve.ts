// `conduit serve`: one gateway (with the router inside it) over the engine workers that the
// configuration names, spawned here or already running elsewhere.
import type { Config } from '../configs/schema.ts';
import { servedName, threadsPerWorker } from '../configs/schema.ts';
import { GrpcEngineClient } from '../engine/grpc/client.ts';
import { createGateway, createMetricsServer, GatewayMetrics, type ServedModel } from '../gateway/server.ts';
import { gatewayLimitsOf } from './gateway-limits.ts';
import { LocalWorker } from './local-workers.ts';
import { workerArgs } from './worker-flags.ts';

const workerReadyTimeoutMs = 300_000;
const healthPollIntervalMs = 200;

export interface RunningServer {
  httpAddress: string;
  metricsAddress: string;
  close(): Promise<void>;
}

async function waitUntilServing(client: GrpcEngineClient, deadlineMs: number) {
  let lastError: unknown = null;
  while (Date.now() < deadlineMs) {
    try {
      const health = await client.health();
      if (health.serving) return health;
    } catch (err) {
      lastError = err;
    }
    await new Promise((resolve) => setTimeout(resolve, healthPollIntervalMs));
  }
  throw new Error(`worker ${client.address} not serving after ${workerReadyTimeoutMs / 1000} s` +
    (lastError ? `: ${(lastError as Error).message}` : ''));
}

export async function serve(config: Config): Promise<RunningServer> {
  const localWorkers: LocalWorker[] = [];
  const clients: GrpcEngineClient[] = [];
  const closeWorkers = async () => {
    for (const client of clients) client.close();
    await Promise.all(localWorkers.map((worker) => worker.stop()));
  };
  try {
    const models: ServedModel[] = [];
    for (const [modelIndex, model] of config.models.entries()) {
      const numThreads = threadsPerWorker(model, config);
      const addresses: string[] = [...model.remote_workers];
      for (let i = 0; i < model.num_workers; i++) {
        const worker = new LocalWorker((listen) => workerArgs(model, numThreads, listen), `${modelIndex}-${i}`);
        worker.start();
        localWorkers.push(worker);
        addresses.push(worker.address);
      }
      const workers = addresses.map((address) => new GrpcEngineClient(address));
      clients.push(...workers);
      const deadlineMs = Date.now() + workerReadyTimeoutMs;
      const healths = await Promise.all(workers.map((client) => waitUntilServing(client, deadlineMs)));
      models.push({
        name: servedName(model),
        modelDir: model.path,
        maxModelLen: Math.min(...healths.map((h) => h.model.maxModelLen)),
        queueTimeoutMs: model.queue_timeout_s === undefined ? undefined : model.queue_timeout_s * 1000,
        requestTimeoutMs: model.request_timeout_s === undefined ? undefined : model.request_timeout_s * 1000,
        workers,
      });
    }
    const gatewayMetrics = new GatewayMetrics(models);
    const { server } = config;
    const gateway = await createGateway({
      models,
      bodyLimitBytes: server.body_limit_bytes,
      metrics: gatewayMetrics,
      limits: gatewayLimitsOf(server),
      responses: {
        storeMaxResponses: server.response_store_max_responses,
        storeTtlMs: server.response_store_ttl_s * 1000,
        websocketMaxConnectionMs: server.websocket_max_connection_s * 1000,
        websocketPingIntervalMs: server.websocket_ping_interval_s * 1000,
        maxBufferedBytes: server.stream_max_buffered_bytes,
      },
    });
    const metrics = await createMetricsServer({ metrics: gatewayMetrics });
    const httpAddress = await gateway.listen({ host: config.server.host, port: config.server.http_port });
    const metricsAddress = await metrics.listen({ host: config.server.host, port: config.server.metrics_port });
    return {
      httpAddress,
      metricsAddress,
      async close() {
        await gateway.close();
        await metrics.close();
        await closeWorkers();
      },
    };
  } catch (err) {
    await closeWorkers();
    throw err;
  }
}
