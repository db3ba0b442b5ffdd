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
/** vLLM's inter-token buckets, with finer ones below 10 ms for small models on CPUs. */
const INTER_TOKEN_BUCKETS_SEC = [
  0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80,
];
/** Tokens per request, 1-2-5 steps (vLLM's build_1_2_5_buckets). */
const TOKENS_PER_REQUEST_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 20_000, 50_000, 100_000, 200_000];

type WorkerLabel = 'model_name' | 'worker';
type ModelLabel = 'model_name';

/** How a generation ended: `conduit_request_success_total`'s finished_reason. */
export type FinishedReason = 'stop' | 'length' | 'abort' | 'error';

/** The per-model request families, on the gateway's registry. */
interface RequestFamilies {
  timeToFirstToken: Histogram<ModelLabel>;
  interTokenLatency: Histogram<ModelLabel>;
  e2eLatency: Histogram<ModelLabel>;
  queueTime: Histogram<ModelLabel>;
  prefillTime: Histogram<ModelLabel>;
  decodeTime: Histogram<ModelLabel>;
  promptTokens: Counter<ModelLabel>;
  generationTokens: Counter<ModelLabel>;
  requestPromptTokens: Histogram<ModelLabel>;
  requestGenerationTokens: Histogram<ModelLabel>;
  requestSuccess: Counter<ModelLabel | 'finished_reason'>;
}

/**
 * One model's request metrics, bound to its label once (generation.ts takes it per request), so
 * that observing a token costs no label lookup.
 */
export class ModelRequestMetrics {
  private readonly timeToFirstToken: Histogram.Internal<ModelLabel>;
  private readonly interTokenLatency: Histogram.Internal<ModelLabel>;
  private readonly e2eLatency: Histogram.Internal<ModelLabel>;
  private readonly queueTime: Histogram.Internal<ModelLabel>;
  private readonly prefillTime: Histogram.Internal<ModelLabel>;
  private readonly decodeTime: Histogram.Internal<ModelLabel>;
  private readonly promptTokens: Counter.Internal;
  private readonly generationTokens: Counter.Internal;
  private readonly requestPromptTokens: Histogram.Internal<ModelLabel>;
  private readonly requestGenerationTokens: Histogram.Internal<ModelLabel>;
  private readonly requestSuccess: Counter<ModelLabel | 'finished_reason'>;

  constructor(families: RequestFamilies, private readonly modelName: string) {
    this.timeToFirstToken = families.timeToFirstToken.labels(modelName);
    this.interTokenLatency = families.interTokenLatency.labels(modelName);
    this.e2eLatency = families.e2eLatency.labels(modelName);
    this.queueTime = families.queueTime.labels(modelName);
    this.prefillTime = families.prefillTime.labels(modelName);
    this.decodeTime = families.decodeTime.labels(modelName);
    this.promptTokens = families.promptTokens.labels(modelName);
    this.generationTokens = families.generationTokens.labels(modelName);
    this.requestPromptTokens = families.requestPromptTokens.labels(modelName);
    this.requestGenerationTokens = families.requestGenerationTokens.labels(modelName);
    this.requestSuccess = families.requestSuccess;
  }

  firstToken(secondsSinceArrival: number) {
    this.timeToFirstToken.observe(secondsSinceArrival);
  }

  /** numTokens tokens, each secondsPerToken after the one before it. */
  interTokens(secondsPerToken: number, numTokens: number) {
    for (let i = 0; i < numTokens; i++) this.interTokenLatency.observe(secondsPerToken);
  }

  /** The worker's own figures for the request (its clock): waiting to be scheduled, then its prefill. */
  engineTimings(queueSeconds: number, prefillSeconds: number) {
    this.queueTime.observe(queueSeconds);
    this.prefillTime.observe(prefillSeconds);
  }

  /** A generation that finished (stop or length): latencies and token counts. */
  finished(secondsSinceArrival: number, decodeSeconds: number, numPromptTokens: number, numGenerationTokens: number) {
    this.e2eLatency.observe(secondsSinceArrival);
    this.decodeTime.observe(decodeSeconds);
    this.promptTokens.inc(numPromptTokens);
    this.generationTokens.inc(numGenerationTokens);
    this.requestPromptTokens.observe(numPromptTokens);
    this.requestGenerationTokens.observe(numGenerationTokens);
  }

  /** Every generation, however it ended. */
  ended(reason: FinishedReason) {
    this.requestSuccess.inc({ model_name: this.modelName, finished_reason: reason });
  }
}

export class GatewayMetrics {
  readonly registry = new Registry();
  /** The routers' metrics (router/metrics.ts), on this registry. */
  readonly routing: RouterMetrics;
  private readonly models: readonly ServedModel[];
  private readonly requests: Counter<'endpoint' | 'status_code'>;
  private readonly requestDuration: Histogram<'endpoint' | 'method' | 'status_code'>;
  private readonly modelMetrics = new Map<string, ModelRequestMetrics>();
  private readonly requestFamilies: RequestFamilies;
  private readonly numRunning: Gauge<WorkerLabel>;
  private readonly numWaiting: Gauge<WorkerLabel>;
  private readonly numQueuedPrefillTokens: Gauge<WorkerLabel>;
  private readonly numKvBlocksUsed: Gauge<WorkerLabel>;
  private readonly numKvBlocksTotal: Gauge<WorkerLabel>;
  private readonly kvCacheUsage: Gauge<WorkerLabel>;
  private readonly workerResidentMemory: Gauge<WorkerLabel>;
  private readonly numPreemptions: Counter<WorkerLabel>;
  private readonly numPrefixQueriedTokens: Counter<WorkerLabel>;
  private readonly numPrefixHitTokens: Counter<WorkerLabel>;
  private readonly stepTime: Histogram<WorkerLabel>;
  private readonly numSpecDrafts: Counter<WorkerLabel>;
  private readonly numSpecDraftTokens: Counter<WorkerLabel>;
  private readonly numSpecAcceptedTokens: Counter<WorkerLabel>;
  private readonly numSpecAcceptedTokensPerPosition: Counter<WorkerLabel | 'position'>;
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
    this.requestDuration = new Histogram({
      name: 'conduit_http_request_duration_seconds',
      help: 'From an HTTP request\'s arrival until its response is over (a stream\'s end, a WebSocket\'s close).',
      labelNames: ['endpoint', 'method', 'status_code'],
      buckets: LATENCY_BUCKETS_SEC,
      registers,
    });
    const modelHistogram = (name: string, help: string, buckets: number[]) =>
      new Histogram({ name, help, labelNames: ['model_name'], buckets, registers });
    const modelCounter = (name: string, help: string) => new Counter({ name, help, labelNames: ['model_name'], registers });
    this.requestFamilies = {
      timeToFirstToken: modelHistogram('conduit_time_to_first_token_seconds', 'From request arrival to the first generated token.', LATENCY_BUCKETS_SEC),
      interTokenLatency: modelHistogram(
        'conduit_inter_token_latency_seconds',
        'Between consecutive output tokens of a request, as the gateway receives them (tokens of one step share its gap).',
        INTER_TOKEN_BUCKETS_SEC,
      ),
      e2eLatency: modelHistogram('conduit_e2e_request_latency_seconds', 'From request arrival to the last generated token.', LATENCY_BUCKETS_SEC),
      queueTime: modelHistogram(
        'conduit_request_queue_time_seconds',
        'From a request\'s arrival at its worker until the worker first scheduled it (the worker\'s clock).',
        LATENCY_BUCKETS_SEC,
      ),
      prefillTime: modelHistogram(
        'conduit_request_prefill_time_seconds',
        'From a request\'s first scheduling until its first token (the worker\'s clock).',
        LATENCY_BUCKETS_SEC,
      ),
      decodeTime: modelHistogram('conduit_request_decode_time_seconds', 'From a finished request\'s first token to its last.', LATENCY_BUCKETS_SEC),
      promptTokens: modelCounter('conduit_prompt_tokens_total', 'Prompt tokens of finished requests.'),
      generationTokens: modelCounter('conduit_generation_tokens_total', 'Generated tokens of finished requests.'),
      requestPromptTokens: modelHistogram('conduit_request_prompt_tokens', 'Prompt tokens of each finished request.', TOKENS_PER_REQUEST_BUCKETS),
      requestGenerationTokens: modelHistogram(
        'conduit_request_generation_tokens',
        'Generated tokens of each finished request.',
        TOKENS_PER_REQUEST_BUCKETS,
      ),
      requestSuccess: new Counter({
        name: 'conduit_request_success_total',
        help: 'Generations ended, by how: stop, length, abort (the client left, or the worker ended it), error.',
        labelNames: ['model_name', 'finished_reason'],
        registers,
      }),
    };
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
    this.workerResidentMemory = workerGauge(
      'conduit_worker_resident_memory_bytes',
      'A worker process\'s resident set size, as its last step reported it.',
    );
    this.numPreemptions = workerCounter('conduit_num_preemptions_total', 'Sequences preempted (their KV freed, recomputed later).');
    this.numPrefixQueriedTokens = workerCounter(
      'conduit_prefix_cache_queries_total',
      'Prompt tokens looked up in the prefix cache at admission.',
    );
    this.numPrefixHitTokens = workerCounter('conduit_prefix_cache_hits_total', 'Prompt tokens found in the prefix cache at admission.');
    // vLLM's spec_decode counters, under our prefix: acceptance rate = accepted / draft tokens,
    // and per position, accepted_per_pos / drafts.
    this.numSpecDrafts = workerCounter('conduit_spec_decode_num_drafts_total', 'Speculative decoding: verifications of at least one proposed token.');
    this.numSpecDraftTokens = workerCounter('conduit_spec_decode_num_draft_tokens_total', 'Speculative decoding: proposed tokens verified.');
    this.numSpecAcceptedTokens = workerCounter('conduit_spec_decode_num_accepted_tokens_total', 'Speculative decoding: proposed tokens accepted.');
    this.numSpecAcceptedTokensPerPosition = new Counter({
      name: 'conduit_spec_decode_num_accepted_tokens_per_pos_total',
      help: 'Speculative decoding: proposed tokens accepted at each position (0-based) of their draft.',
      labelNames: [...labelNames, 'position'],
      registers,
    });
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
          numSpecDrafts: this.numSpecDrafts.labels(labels),
          numSpecDraftTokens: this.numSpecDraftTokens.labels(labels),
          numSpecAcceptedTokens: this.numSpecAcceptedTokens.labels(labels),
        };
        const residentMemory = this.workerResidentMemory.labels(labels);
        const stopWatching = worker.onReport(({ stats }) => {
          if (stats === null) return;
          residentMemory.set(stats.residentMemoryBytes);
          step.numPreemptions.inc(stats.numPreempted);
          step.numPrefixQueriedTokens.inc(stats.numPrefixQueriedTokens);
          step.numPrefixHitTokens.inc(stats.numPrefixHitTokens);
          step.stepTime.observe((stats.scheduleMs + stats.forwardMs) / 1000);
          step.schedulingTime.observe(stats.scheduleMs / 1000);
          step.tokensPerStep.observe(stats.numScheduledTokens);
          const spec = stats.specDecode;
          if (spec !== undefined && spec.numDrafts > 0) {
            step.numSpecDrafts.inc(spec.numDrafts);
            step.numSpecDraftTokens.inc(spec.numDraftTokens);
            step.numSpecAcceptedTokens.inc(spec.numAcceptedTokens);
            spec.numAcceptedTokensPerPosition.forEach((count, position) => {
              if (count > 0) this.numSpecAcceptedTokensPerPosition.inc({ ...labels, position: String(position) }, count);
            });
          }
        });
        return () => {
          stopWatching();
          this.workerResidentMemory.remove(labels);
        };
      });
    }
  }

  observeRequest(endpoint: string, method: string, statusCode: number, durationSeconds: number) {
    const status_code = String(statusCode);
    this.requests.inc({ endpoint, status_code });
    this.requestDuration.observe({ endpoint, method, status_code }, durationSeconds);
  }

  /** The request metrics of one model, bound to its label. */
  forModel(modelName: string): ModelRequestMetrics {
    let bound = this.modelMetrics.get(modelName);
    if (bound === undefined) {
      bound = new ModelRequestMetrics(this.requestFamilies, modelName);
      this.modelMetrics.set(modelName, bound);
    }
    return bound;
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

/** Times a remote worker's engine stream went silent past server.worker_heartbeat_timeout_s (it was out of routing until it answered). */
export function registerWorkerUnresponsive(registry: Registry): Counter<'model_name' | 'worker'> {
  return new Counter({
    name: 'conduit_worker_unresponsive_total',
    help: 'Times a remote engine worker sent nothing on its stream past the heartbeat timeout and was taken out of routing until it answered.',
    labelNames: ['model_name', 'worker'],
    registers: [registry],
  });
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
