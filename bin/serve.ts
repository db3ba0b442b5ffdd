// `conduit serve`: one gateway (with the router inside it) over the engine workers that the
// configuration names, spawned here or already running elsewhere.
import { keyLimitsOf, resolveApiKeys } from '../configs/api-keys.ts';
import type { Config } from '../configs/schema.ts';
import { servedName, threadsPerWorker } from '../configs/schema.ts';
import { ModelRepository } from '../engine/classic/index.ts';
import { GrpcEngineClient } from '../engine/grpc/client.ts';
import { startKServeGrpc, type KServeGrpcServer } from '../gateway/kserve/grpc.ts';
import { registerTritonMetrics } from '../gateway/kserve/metrics.ts';
import { createGateway, createMetricsServer, GatewayMetrics, Readiness, type ServedModel, type ServedWorker } from '../gateway/server.ts';
import { gatewayLimitsOf } from './gateway-limits.ts';
import { LocalWorker } from './local-workers.ts';
import type { ModelRouter } from '../router/model-router.ts';
import { createRouter, startSharedState } from './routing.ts';
import { workerArgs } from './worker-flags.ts';

const workerReadyTimeoutMs = 300_000;
/** The version /v2 reports. */
const CONDUIT_VERSION = '0.1.0';
const healthPollIntervalMs = 200;

export interface RunningServer {
  httpAddress: string;
  metricsAddress: string;
  /** KServe v2 gRPC, when a model repository is configured. */
  grpcAddress: string | null;
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
  // Before any worker starts: a missing key file fails at once.
  const apiKeys = resolveApiKeys(config.server);
  const localWorkers: LocalWorker[] = [];
  const clients: GrpcEngineClient[] = [];
  const routers = new Map<string, ModelRouter<ServedWorker>>();
  // Workers registered in Redis join the routers as they are found (none without router.redis_url).
  const sharedState = startSharedState(config.router, routers, (registration) => new GrpcEngineClient(registration.address));
  const closeWorkers = async () => {
    await sharedState?.close();
    for (const client of clients) client.close();
    await Promise.all(localWorkers.map((worker) => worker.stop()));
  };
  let repository: ModelRepository | null = null;
  let grpcServer: KServeGrpcServer | null = null;
  // Closed on any failure, so that a port taken after the HTTP one was bound ends the process
  // instead of leaving a gateway answering 503 forever.
  let gateway: Awaited<ReturnType<typeof createGateway>> | null = null;
  let metrics: Awaited<ReturnType<typeof createMetricsServer>> | null = null;
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
      // Added before any stream message arrives: a stream's first lists the worker's cache.
      const router = createRouter<ServedWorker>(model, config.router);
      for (const worker of workers) router.addWorker(worker);
      routers.set(servedName(model), router);
      const deadlineMs = Date.now() + workerReadyTimeoutMs;
      const healths = await Promise.all(workers.map((client) => waitUntilServing(client, deadlineMs)));
      // A model served only by workers found in Redis waits for the first of them.
      const maxModelLens = healths.length > 0 || sharedState === null
        ? healths.map((h) => h.model.maxModelLen)
        : [(await sharedState.waitForWorker(servedName(model), workerReadyTimeoutMs)).model.maxModelLen];
      models.push({
        name: servedName(model),
        modelDir: model.path,
        maxModelLen: Math.min(model.max_model_len ?? Infinity, ...maxModelLens),
        queueTimeoutMs: model.queue_timeout_s === undefined ? undefined : model.queue_timeout_s * 1000,
        requestTimeoutMs: model.request_timeout_s === undefined ? undefined : model.request_timeout_s * 1000,
        workers: router.workers,
        router,
      });
    }
    if (config.model_repository !== undefined) {
      const { path: repoDir, model_control_mode: mode, repository_poll_s: pollS, load_models: startupModels } = config.model_repository;
      repository = new ModelRepository({ repoDir, mode, pollIntervalMs: pollS * 1000, startupModels });
      await repository.start();
    }
    const gatewayMetrics = new GatewayMetrics(models);
    if (sharedState !== null) gatewayMetrics.routing.watchSharedState(sharedState);
    if (repository !== null) registerTritonMetrics(gatewayMetrics.registry, repository);
    const { server } = config;
    const readiness = new Readiness('starting');
    gateway = await createGateway({
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
      classic: repository === null ? undefined : { repository, version: CONDUIT_VERSION },
      readiness,
      drainTimeoutMs: server.drain_timeout_s * 1000,
      logger: { level: server.log_level },
      access: {
        apiKeys,
        anonymousLimits: keyLimitsOf(server.key_limits),
        maxConcurrentRequests: server.max_concurrent_requests,
      },
    });
    metrics = await createMetricsServer({ metrics: gatewayMetrics });
    const httpAddress = await gateway.listen({ host: config.server.host, port: config.server.http_port });
    const metricsAddress = await metrics.listen({ host: config.server.host, port: config.server.metrics_port });
    if (repository !== null) {
      grpcServer = await startKServeGrpc({ repository, llms: models, version: CONDUIT_VERSION, host: config.server.host, port: config.server.grpc_port });
    }
    // Every worker answered serving above (the ports, gRPC's too, bind only then, for now).
    readiness.markReady();
    return {
      httpAddress,
      metricsAddress,
      grpcAddress: grpcServer === null ? null : `${config.server.host}:${grpcServer.port}`,
      async close() {
        // Drains: in-flight requests finish (up to drain_timeout_s), new ones get 503; KServe's gRPC
        // calls in flight finish alike.
        await Promise.all([gateway?.close(), grpcServer?.close()]);
        await metrics?.close();
        await repository?.close();
        await closeWorkers();
      },
    };
  } catch (err) {
    await Promise.all([gateway?.close(), grpcServer?.close(), metrics?.close()]);
    await repository?.close();
    await closeWorkers();
    throw err;
  }
}
