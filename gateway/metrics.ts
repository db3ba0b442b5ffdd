// Prometheus metrics on their own registry (so tests can build many servers in one process),
// served by a separate fastify instance on the metrics port. Worker metrics come from the step
// reports each worker pushes on its engine stream: gauges hold the latest load, counters and
// histograms add up every step. Nothing is polled.
import Fastify, { type FastifyInstance } from 'fastify';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import { RouterMetrics } from '../router/metrics.ts';
import { routerOf, type ServedModel } from './served-model.ts';

const LATENCY_BUCKETS_SEC = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80];
const STEP_BUCKETS_SEC = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5];
const TOKENS_PER_STEP_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192];

type WorkerLabel = 'model_name' | 'worker';

export class GatewayMetrics {
  readonly registry = new Registry();
  /** The routers' metrics (router/metrics.ts), on this registry. */
  readonly routing: RouterMetrics;
  private readonly models: readonly ServedModel[];
  private readonly requests: Counter<'endpoint' | 'status_code'>;
  private readonly timeToFirstToken: Histogram<'model_name'>;
  private readonly e2eLatency: Histogram<'model_name'>;
  private readonly promptTokens: Counter<'model_name'>;
  private readonly generationTokens: Counter<'model_name'>;
  private readonly numRunning: Gauge<WorkerLabel>;
  private readonly numWaiting: Gauge<WorkerLabel>;
  private readonly numQueuedPrefillTokens: Gauge<WorkerLabel>;
  private readonly numKvBlocksUsed: Gauge<WorkerLabel>;
  private readonly numKvBlocksTotal: Gauge<WorkerLabel>;
  private readonly kvCacheUsage: Gauge<WorkerLabel>;
  private readonly numPreemptions: Counter<WorkerLabel>;
  private readonly numPrefixQueriedTokens: Counter<WorkerLabel>;
  private readonly numPrefixHitTokens: Counter<WorkerLabel>;
  private readonly stepTime: Histogram<WorkerLabel>;
  private readonly schedulingTime: Histogram<WorkerLabel>;
  private readonly tokensPerStep: Histogram<WorkerLabel>;

  constructor(models: readonly ServedModel[]) {
    this.models = models;
    const registers = [this.registry];
    collectDefaultMetrics({ register: this.registry });
    this.requests = new Counter({
      name: 'conduit_http_requests_total',
      help: 'HTTP requests by endpoint and status code.',
      labelNames: ['endpoint', 'status_code'],
      registers,
    });
    this.timeToFirstToken = new Histogram({
      name: 'conduit_time_to_first_token_seconds',
      help: 'From request arrival to the first generated token.',
      labelNames: ['model_name'],
      buckets: LATENCY_BUCKETS_SEC,
      registers,
    });
    this.e2eLatency = new Histogram({
      name: 'conduit_e2e_request_latency_seconds',
      help: 'From request arrival to the last generated token.',
      labelNames: ['model_name'],
      buckets: LATENCY_BUCKETS_SEC,
      registers,
    });
    this.promptTokens = new Counter({
      name: 'conduit_prompt_tokens_total',
      help: 'Prompt tokens of finished requests.',
      labelNames: ['model_name'],
      registers,
    });
    this.generationTokens = new Counter({
      name: 'conduit_generation_tokens_total',
      help: 'Generated tokens of finished requests.',
      labelNames: ['model_name'],
      registers,
    });
    const labelNames: WorkerLabel[] = ['model_name', 'worker'];
    const workerGauge = (name: string, help: string) => new Gauge({ name, help, labelNames, registers });
    const workerCounter = (name: string, help: string) => new Counter({ name, help, labelNames, registers });
    const workerHistogram = (name: string, help: string, buckets: number[]) =>
      new Histogram({ name, help, labelNames, buckets, registers });
    this.numRunning = workerGauge('conduit_num_requests_running', 'Sequences in the running batch of a worker.');
    this.numWaiting = workerGauge('conduit_num_requests_waiting', 'Sequences waiting for a worker to schedule them.');
    this.numQueuedPrefillTokens = workerGauge(
      'conduit_num_queued_prefill_tokens',
      'Prompt tokens the waiting sequences of a worker still have to compute.',
    );
    this.numKvBlocksUsed = workerGauge('conduit_kv_blocks_used', 'KV-cache blocks in use on a worker (cached free blocks not counted).');
    this.numKvBlocksTotal = workerGauge('conduit_kv_blocks_total', 'KV-cache blocks of a worker.');
    this.kvCacheUsage = workerGauge('conduit_kv_cache_usage_ratio', 'Fraction of a worker\'s KV-cache blocks in use, 0 to 1.');
    this.numPreemptions = workerCounter('conduit_num_preemptions_total', 'Sequences preempted (their KV freed, recomputed later).');
    this.numPrefixQueriedTokens = workerCounter(
      'conduit_prefix_cache_queries_total',
      'Prompt tokens looked up in the prefix cache at admission.',
    );
    this.numPrefixHitTokens = workerCounter('conduit_prefix_cache_hits_total', 'Prompt tokens found in the prefix cache at admission.');
    this.stepTime = workerHistogram('conduit_engine_step_duration_seconds', 'One engine step: scheduling plus the forward pass.', STEP_BUCKETS_SEC);
    this.schedulingTime = workerHistogram(
      'conduit_engine_scheduling_duration_seconds',
      'Engine-loop time of one step outside the forward pass (scheduling, bookkeeping, outputs).',
      STEP_BUCKETS_SEC,
    );
    this.tokensPerStep = workerHistogram('conduit_engine_tokens_per_step', 'Tokens one engine step computed.', TOKENS_PER_STEP_BUCKETS);
    this.routing = new RouterMetrics(this.registry);
    for (const model of models) {
      const router = routerOf(model);
      this.routing.watch(router);
      // Workers may join and leave (discovered in Redis): each is watched while it serves.
      router.watchWorkers((worker) => {
        const labels = { model_name: model.name, worker: worker.address };
        // Label-bound children: a step report then costs no label hashing.
        const step = {
          numPreemptions: this.numPreemptions.labels(labels),
          numPrefixQueriedTokens: this.numPrefixQueriedTokens.labels(labels),
          numPrefixHitTokens: this.numPrefixHitTokens.labels(labels),
          stepTime: this.stepTime.labels(labels),
          schedulingTime: this.schedulingTime.labels(labels),
          tokensPerStep: this.tokensPerStep.labels(labels),
        };
        return worker.onReport(({ stats }) => {
          if (stats === null) return;
          step.numPreemptions.inc(stats.numPreempted);
          step.numPrefixQueriedTokens.inc(stats.numPrefixQueriedTokens);
          step.numPrefixHitTokens.inc(stats.numPrefixHitTokens);
          step.stepTime.observe((stats.scheduleMs + stats.forwardMs) / 1000);
          step.schedulingTime.observe(stats.scheduleMs / 1000);
          step.tokensPerStep.observe(stats.numScheduledTokens);
        });
      });
    }
  }

  observeRequest(endpoint: string, statusCode: number) {
    this.requests.inc({ endpoint, status_code: String(statusCode) });
  }

  observeFirstToken(modelName: string, secondsSinceArrival: number) {
    this.timeToFirstToken.observe({ model_name: modelName }, secondsSinceArrival);
  }

  observeFinished(modelName: string, secondsSinceArrival: number, numPromptTokens: number, numGenerationTokens: number) {
    this.e2eLatency.observe({ model_name: modelName }, secondsSinceArrival);
    this.promptTokens.inc({ model_name: modelName }, numPromptTokens);
    this.generationTokens.inc({ model_name: modelName }, numGenerationTokens);
  }

  /** The Prometheus text exposition, with each worker's gauges from the load it last pushed. */
  async render(): Promise<string> {
    this.setWorkerGauges();
    return this.registry.metrics();
  }

  private setWorkerGauges() {
    const gauges = [this.numRunning, this.numWaiting, this.numQueuedPrefillTokens, this.numKvBlocksUsed, this.numKvBlocksTotal, this.kvCacheUsage];
    // A worker whose stream is down drops out rather than reporting stale numbers.
    for (const gauge of gauges) gauge.reset();
    for (const model of this.models) {
      for (const worker of routerOf(model).workers) {
        const { load } = worker;
        if (load === null) continue;
        const labels = { model_name: model.name, worker: worker.address };
        const numUsedBlocks = load.numTotalBlocks - load.numFreeBlocks;
        this.numRunning.set(labels, load.numRunning);
        this.numWaiting.set(labels, load.numWaiting);
        this.numQueuedPrefillTokens.set(labels, load.numQueuedPrefillTokens);
        this.numKvBlocksUsed.set(labels, numUsedBlocks);
        this.numKvBlocksTotal.set(labels, load.numTotalBlocks);
        this.kvCacheUsage.set(labels, load.numTotalBlocks === 0 ? 0 : numUsedBlocks / load.numTotalBlocks);
      }
    }
  }
}

export async function createMetricsServer(options: { metrics: GatewayMetrics; logger?: boolean }): Promise<FastifyInstance> {
  const app = Fastify({ logger: options.logger ?? false });
  app.get('/metrics', async (_request, reply) => {
    const text = await options.metrics.render();
    return reply.type(options.metrics.registry.contentType).send(text);
  });
  return app;
}

/**
 * conduit_worker_restarts_total: restarts of the workers this gateway supervises, by why the
 * worker exited (`code N`, a signal's name, or `hung`: killed after its stream went silent).
 */
export function registerWorkerRestarts(registry: Registry): Counter<'model_name' | 'worker' | 'reason'> {
  return new Counter({
    name: 'conduit_worker_restarts_total',
    help: 'Restarts of the engine workers this gateway supervises, by why each exited.',
    labelNames: ['model_name', 'worker', 'reason'],
    registers: [registry],
  });
}
