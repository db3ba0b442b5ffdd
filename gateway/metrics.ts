// Prometheus metrics on their own registry (so tests can build many servers in one process),
// served by a separate fastify instance on the metrics port. Worker gauges are read from each
// worker's health() at scrape time, never polled in the background.
import Fastify, { type FastifyInstance } from 'fastify';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { ServedModel } from './served-model.ts';
import { probeWorker } from './worker-health.ts';

const LATENCY_BUCKETS_SEC = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80];

export class GatewayMetrics {
  readonly registry = new Registry();
  private readonly models: readonly ServedModel[];
  private readonly requests: Counter<'endpoint' | 'status_code'>;
  private readonly timeToFirstToken: Histogram<'model_name'>;
  private readonly e2eLatency: Histogram<'model_name'>;
  private readonly promptTokens: Counter<'model_name'>;
  private readonly generationTokens: Counter<'model_name'>;
  private readonly numRunning: Gauge<'model_name' | 'worker'>;
  private readonly numWaiting: Gauge<'model_name' | 'worker'>;
  private readonly numKvBlocksUsed: Gauge<'model_name' | 'worker'>;
  private readonly numKvBlocksTotal: Gauge<'model_name' | 'worker'>;

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
    const workerGauge = (name: string, help: string) =>
      new Gauge({ name, help, labelNames: ['model_name', 'worker'], registers });
    this.numRunning = workerGauge('conduit_num_requests_running', 'Sequences in the running batch of a worker.');
    this.numWaiting = workerGauge('conduit_num_requests_waiting', 'Sequences waiting for a worker to schedule them.');
    this.numKvBlocksUsed = workerGauge('conduit_kv_blocks_used', 'KV-cache blocks in use on a worker.');
    this.numKvBlocksTotal = workerGauge('conduit_kv_blocks_total', 'KV-cache blocks of a worker.');
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

  /** The Prometheus text exposition, with worker gauges fresh from every worker. */
  async render(): Promise<string> {
    await this.refreshWorkerGauges();
    return this.registry.metrics();
  }

  private async refreshWorkerGauges() {
    const probes = this.models.flatMap((model) =>
      model.workers.map(async (worker) => ({ model, worker, health: await probeWorker(worker) })),
    );
    const results = await Promise.all(probes);
    // A worker that stopped answering drops out rather than reporting stale numbers.
    for (const gauge of [this.numRunning, this.numWaiting, this.numKvBlocksUsed, this.numKvBlocksTotal]) gauge.reset();
    for (const { model, worker, health } of results) {
      if (health === null) continue;
      const labels = { model_name: model.name, worker: worker.address };
      this.numRunning.set(labels, health.load.numRunning);
      this.numWaiting.set(labels, health.load.numWaiting);
      this.numKvBlocksUsed.set(labels, health.load.numTotalBlocks - health.load.numFreeBlocks);
      this.numKvBlocksTotal.set(labels, health.load.numTotalBlocks);
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
