// `conduit serve`: one gateway (with the router inside it) over the engine workers that the
// configuration names, spawned here or already running elsewhere. Its ports are bound first, so
// that a taken one ends the start before any model loads; the gateway answers 503 `starting`
// while the workers and the model repository load, then turns ready. A worker that exits before
// it ever served, one not serving within the ready timeout, or a repository model that fails to
// load ends the start with a FatalError.
import { keyLimitsOf, resolveApiKeys } from '../configs/api-keys.ts';
import type { Config } from '../configs/schema.ts';
import { servedName, threadsPerWorker } from '../configs/schema.ts';
import { ModelRepository } from '../triton/index.ts';
import { GrpcEngineClient, type EngineClientOptions } from '../engine/grpc/client.ts';
import { KServeControl } from '../gateway/kserve/control.ts';
import { startKServeGrpc, type KServeGrpcServer } from '../gateway/kserve/grpc.ts';
import { registerTritonMetrics } from '../gateway/kserve/metrics.ts';
import { registerWorkerRestarts, registerWorkerUnresponsive } from '../gateway/metrics.ts';
import { AccessControl, createGateway, createMetricsServer, GatewayMetrics, Readiness, type ServedModel, type ServedWorker } from '../gateway/server.ts';
import { FatalError } from './fatal-error.ts';
import { CONDUIT_VERSION } from './version.ts';
import { gatewayLimitsOf } from './gateway-limits.ts';
import { createGatewayLogger } from '../gateway/logging.ts';
import { CheckpointError } from '../gateway/served-model.ts';
import { createLifecycleLog, type ListeningAddresses } from './lifecycle-log.ts';
import type { Logger } from 'pino';
import { LocalWorker } from './local-workers.ts';
import { listenOrExplain } from './listen.ts';
import type { ModelRouter } from '../router/model-router.ts';
import type { RedisSharedState } from '../router/redis-state.ts';
import { createRouter, startSharedState } from './routing.ts';
import { workerArgs } from './worker-flags.ts';

const healthPollIntervalMs = 200;

export interface RunningServer extends ListeningAddresses {
  close(): Promise<void>;
}

export interface ServeOptions {
  /** Called once the ports are bound, before the models load. */
  onListening?: (addresses: ListeningAddresses) => void;
  /** Aborting it while the models load stops the start: everything is closed and serve() rejects with the signal's reason. */
  signal?: AbortSignal;
  /** The gateway's log, shared with the caller's lifecycle lines; one at server.log_level on stdout when omitted. */
  logger?: Logger;
}

/** One model of the configuration, its workers known by address before any of them runs. */
interface PlannedModel {
  served: ServedModel;
  /** The workers spawned here, each with its client. */
  localWorkers: { worker: LocalWorker; client: GrpcEngineClient }[];
  /** The clients of the workers the configuration names by address. */
  remoteClients: GrpcEngineClient[];
  /** The configured cap, if any, on what the workers report. */
  maxModelLenCap: number;
}

/** deadlineMs: Date.now() by which it must serve, timeoutMs from the start (for the message). */
async function waitUntilServing(client: GrpcEngineClient, deadlineMs: number, timeoutMs: number, signal: AbortSignal) {
  let lastError: unknown = null;
  while (Date.now() < deadlineMs) {
    // The start failed elsewhere: stop polling, so that nothing holds the process.
    if (signal.aborted) throw signal.reason;
    try {
      const health = await client.health();
      // Ready means requests can go: the engine stream is up too (its first message is the load).
      if (health.serving) client.connect();
      if (health.serving && client.load !== null) return health;
    } catch (err) {
      lastError = err;
    }
    await new Promise((resolve) => setTimeout(resolve, healthPollIntervalMs));
  }
  throw new FatalError(`worker ${client.address} not serving after ${timeoutMs / 1000} s (server.worker_ready_timeout_s)` +
    (lastError ? `: ${(lastError as Error).message}` : ''));
}

/** The model's workers serving (a local one that exits first fails the start), then its context length. */
async function waitForModel(model: PlannedModel, sharedState: RedisSharedState<ServedWorker> | null, timeoutMs: number, signal: AbortSignal): Promise<number> {
  const deadlineMs = Date.now() + timeoutMs;
  const healths = await Promise.all([
    ...model.localWorkers.map(async ({ worker, client }) => {
      const health = await Promise.race([waitUntilServing(client, deadlineMs, timeoutMs, signal), worker.startFailure]);
      worker.markServing();
      return health;
    }),
    ...model.remoteClients.map((client) => waitUntilServing(client, deadlineMs, timeoutMs, signal)),
  ]);
  if (healths.length > 0 || sharedState === null) return Math.min(model.maxModelLenCap, ...healths.map((h) => h.model.maxModelLen));
  // A model served only by workers found in Redis waits for the first of them.
  try {
    const registration = await sharedState.waitForWorker(model.served.name, timeoutMs);
    return Math.min(model.maxModelLenCap, registration.model.maxModelLen);
  } catch (err) {
    throw new FatalError((err as Error).message);
  }
}

/** Every model the repository was asked to load at start has loaded (Triton exits otherwise too). */
function checkRepositoryLoaded(repository: ModelRepository): void {
  if (repository.isReady()) return;
  const failed = repository.index(false).filter((entry) => entry.state !== 'READY' && entry.reason !== 'unloaded');
  throw new FatalError(`model repository: ${failed.map((entry) => `${entry.name} failed to load: ${entry.reason}`).join('; ')}`);
}

function rejectOnAbort(signal: AbortSignal | undefined): Promise<never> {
  return new Promise<never>((_resolve, reject) => {
    if (signal === undefined) return;
    if (signal.aborted) reject(signal.reason);
    signal.addEventListener('abort', () => reject(signal.reason), { once: true });
  });
}

export async function serve(config: Config, options: ServeOptions = {}): Promise<RunningServer> {
  // Before any port is bound: a missing key file fails at once.
  const apiKeys = resolveApiKeys(config.server);
  const { server } = config;
  const logger = options.logger ?? createGatewayLogger({ level: server.log_level });
  const lifecycleLog = createLifecycleLog(logger);
  const routers = new Map<string, ModelRouter<ServedWorker>>();
  // Workers registered in Redis join the routers as they are found (none without router.redis_url).
  // A remote worker (named by address or found in Redis) has no process here to kill: a silent
  // stream takes it out of routing until it answers again.
  const remoteClientOptions = (modelName: string, address: string): EngineClientOptions => ({
    silenceTimeoutMs: server.worker_heartbeat_timeout_s * 1000,
    onSilent: (silentMs) => {
      lifecycleLog.workerUnresponsive(address, silentMs);
      workerUnresponsive.inc({ model_name: modelName, worker: address });
    },
    onAnswered: () => lifecycleLog.workerAnswered(address),
  });
  const sharedState = startSharedState(config.router, routers, (registration) =>
    new GrpcEngineClient(registration.address, remoteClientOptions(registration.model.modelName, registration.address)));
  // Every model with its workers' clients up front, so that the gateway can be built and listen
  // before any worker runs; maxModelLen is filled in when the workers answer.
  const planned: PlannedModel[] = config.models.map((model, modelIndex) => {
    const numThreads = threadsPerWorker(model, config);
    const localWorkers = Array.from({ length: model.num_workers }, (_, i) => {
      const worker: LocalWorker = new LocalWorker({
        args: (listen) => workerArgs(model, numThreads, listen),
        name: `${modelIndex}-${i}`,
        log: lifecycleLog,
        onRestart: (reason) => workerRestarts.inc({ model_name: servedName(model), worker: worker.address, reason }),
      });
      return { worker, client: new GrpcEngineClient(worker.address) };
    });
    const remoteClients = model.remote_workers.map((address) => new GrpcEngineClient(address, remoteClientOptions(servedName(model), address)));
    // Added before any stream message arrives: a stream's first lists the worker's cache.
    const router = createRouter<ServedWorker>(model, config.router);
    for (const client of [...localWorkers.map(({ client }) => client), ...remoteClients]) router.addWorker(client);
    routers.set(servedName(model), router);
    const served: ServedModel = {
      name: servedName(model),
      modelDir: model.path,
      // Unread until ready: the gateway refuses every request while starting.
      maxModelLen: 0,
      queueTimeoutMs: model.queue_timeout_s === undefined ? undefined : model.queue_timeout_s * 1000,
      requestTimeoutMs: model.request_timeout_s === undefined ? undefined : model.request_timeout_s * 1000,
      workers: router.workers,
      router,
    };
    return { served, localWorkers, remoteClients, maxModelLenCap: model.max_model_len ?? Infinity };
  });
  const models = planned.map((model) => model.served);
  const localWorkers = planned.flatMap((model) => model.localWorkers.map(({ worker }) => worker));
  const repository = config.model_repository === undefined ? null : new ModelRepository({
    repoDir: config.model_repository.path,
    mode: config.model_repository.model_control_mode,
    pollIntervalMs: config.model_repository.repository_poll_s * 1000,
    startupModels: config.model_repository.load_models,
    responseCacheBytes: config.model_repository.response_cache_bytes,
    maxInstancesPerModel: config.model_repository.max_instances_per_model,
    maxInstances: config.model_repository.max_instances,
    logger: logger.child({ component: 'model_repository' }),
  });
  const gatewayMetrics = new GatewayMetrics(models);
  const workerRestarts = registerWorkerRestarts(gatewayMetrics.registry);
  const workerUnresponsive = registerWorkerUnresponsive(gatewayMetrics.registry);
  let gateway: Awaited<ReturnType<typeof createGateway>> | null = null;
  let metrics: Awaited<ReturnType<typeof createMetricsServer>> | null = null;
  let grpcServer: KServeGrpcServer | null = null;
  // KServe's shared memory, trace and log settings, shared by /v2 and gRPC; closed after both.
  const kserveControl = config.model_repository === undefined ? null : new KServeControl({ traceFile: config.model_repository.trace_file ?? null });
  const closeAll = async () => {
    // Drains: in-flight requests finish (up to drain_timeout_s), new ones get 503; KServe's gRPC
    // calls in flight finish alike.
    await Promise.all([gateway?.close(), grpcServer?.close()]);
    kserveControl?.close();
    await metrics?.close();
    await repository?.close();
    await sharedState?.close();
    for (const model of planned) {
      for (const { client } of model.localWorkers) client.close();
      for (const client of model.remoteClients) client.close();
    }
    await Promise.all(localWorkers.map((worker) => worker.stop()));
  };
  const startWaits = new AbortController();
  try {
    if (sharedState !== null) gatewayMetrics.routing.watchSharedState(sharedState);
    if (repository !== null) registerTritonMetrics(gatewayMetrics.registry, repository);
    const readiness = new Readiness('starting');
    // One set of keys and quotas for HTTP, WebSocket and gRPC alike.
    const access = new AccessControl({
      apiKeys,
      anonymousLimits: keyLimitsOf(server.key_limits),
      maxConcurrentRequests: server.max_concurrent_requests,
    });
    const app = await createGateway({
      models,
      bodyLimitBytes: server.body_limit_bytes,
      metrics: gatewayMetrics,
      limits: gatewayLimitsOf(server),
      responses: {
        storeMaxResponses: server.response_store_max_responses,
        ...(server.response_store_max_bytes === undefined ? {} : { storeMaxBytes: server.response_store_max_bytes }),
        storeTtlMs: server.response_store_ttl_s * 1000,
        websocketMaxConnectionMs: server.websocket_max_connection_s * 1000,
        websocketPingIntervalMs: server.websocket_ping_interval_s * 1000,
        maxBufferedBytes: server.stream_max_buffered_bytes,
      },
      classic: repository === null ? undefined : { repository, version: CONDUIT_VERSION, control: kserveControl ?? undefined },
      readiness,
      drainTimeoutMs: server.drain_timeout_s * 1000,
      logger,
      access,
    });
    gateway = app;
    const metricsApp = await createMetricsServer({ metrics: gatewayMetrics });
    metrics = metricsApp;
    const { host } = server;
    const httpAddress = await listenOrExplain(host, server.http_port, 'server.http_port / --http-port', (port) => app.listen({ host, port }));
    const metricsAddress = await listenOrExplain(host, server.metrics_port, 'server.metrics_port / --metrics-port', (port) => metricsApp.listen({ host, port }));
    if (repository !== null) {
      grpcServer = await listenOrExplain(host, server.grpc_port, 'server.grpc_port / --grpc-port', (port) =>
        startKServeGrpc({
          repository, llms: models, llmModels: app.kserveLlms, version: CONDUIT_VERSION, host, port, readiness, control: kserveControl ?? undefined, logger: app.log, access,
          maxMessageBytes: server.body_limit_bytes,
        }));
    }
    const addresses = { httpAddress, metricsAddress, grpcAddress: grpcServer === null ? null : `${host}:${grpcServer.port}` };
    options.onListening?.(addresses);

    for (const worker of localWorkers) worker.start();
    const loaded = Promise.all([
      ...planned.map(async (model) => {
        model.served.maxModelLen = await waitForModel(model, sharedState, server.worker_ready_timeout_s * 1000, startWaits.signal);
      }),
      repository?.start().then(() => checkRepositoryLoaded(repository)),
    ]);
    // Once the race below is lost, its failures (those of waits cut short) are not news.
    loaded.catch(() => {});
    try {
      await Promise.race([loaded, rejectOnAbort(options.signal)]);
    } finally {
      // Ends the waits still polling, when the start failed or was stopped.
      startWaits.abort(new FatalError('the start was stopped'));
    }
    for (const model of planned) {
      for (const { worker, client } of model.localWorkers) worker.watchHeartbeats(client, server.worker_heartbeat_timeout_s * 1000, server.worker_ready_timeout_s * 1000);
    }
    readiness.markReady();
    return { ...addresses, close: closeAll };
  } catch (err) {
    await closeAll();
    // A checkpoint the gateway cannot read is the start's failure, told in one line.
    throw err instanceof CheckpointError ? new FatalError(err.message) : err;
  }
}
