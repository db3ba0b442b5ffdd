// The routers' Prometheus metrics, on the registry the gateway serves: what each decision chose
// and predicted, what the worker then found in its cache, how long deciding took, and the
// index's size, drift and event lag. Gauges are read from the routers at scrape time.
import { Counter, Gauge, Histogram, type Registry } from 'prom-client';
import type { ModelRouter, RoutableWorker, RouterObserver } from './model-router.ts';

const DECISION_BUCKETS_SEC = [5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2];
const LAG_BUCKETS_SEC = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];

type WorkerLabel = 'model_name' | 'worker';

/** What the gauges read of a router. */
type IndexView = Pick<ModelRouter<RoutableWorker>, 'modelName' | 'numIndexedBlocks' | 'indexStats'>;

export class RouterMetrics implements RouterObserver {
  private readonly routers: IndexView[] = [];
  private readonly requests: Counter<WorkerLabel>;
  private readonly promptTokens: Counter<WorkerLabel>;
  private readonly predictedCachedTokens: Counter<WorkerLabel>;
  private readonly cachedTokens: Counter<WorkerLabel>;
  private readonly retries: Counter<WorkerLabel>;
  private readonly decisionTime: Histogram<'model_name'>;
  private readonly eventLag: Histogram<'model_name'>;

  constructor(private readonly registry: Registry) {
    const registers = [registry];
    const labelNames: WorkerLabel[] = ['model_name', 'worker'];
    const counter = (name: string, help: string) => new Counter({ name, help, labelNames, registers });
    this.requests = counter('conduit_router_requests_total', 'Requests the router sent to a worker.');
    this.promptTokens = counter('conduit_router_prompt_tokens_total', 'Prompt tokens of the requests routed to a worker.');
    this.predictedCachedTokens = counter(
      'conduit_router_predicted_cached_tokens_total',
      'Prompt tokens the prefix index predicted a worker holds, at routing (kv-aware).',
    );
    this.cachedTokens = counter(
      'conduit_router_cached_tokens_total',
      'Prompt tokens of routed requests that the worker found in its prefix cache (from its first output).',
    );
    this.retries = counter('conduit_router_retries_total', 'Requests that failed on a worker before starting and were sent to another.');
    this.decisionTime = new Histogram({
      name: 'conduit_router_decision_duration_seconds',
      help: 'One routing decision: hashing the prompt, the index lookup and the policy.',
      labelNames: ['model_name'],
      buckets: DECISION_BUCKETS_SEC,
      registers,
    });
    this.eventLag = new Histogram({
      name: 'conduit_router_kv_event_lag_seconds',
      help: 'From a worker publishing KV events to a shared feed (Redis) to their reaching this index.',
      labelNames: ['model_name'],
      buckets: LAG_BUCKETS_SEC,
      registers,
    });
    const routers = this.routers;
    new Gauge({
      name: 'conduit_router_index_blocks',
      help: 'KV blocks the prefix index holds for a worker.',
      labelNames,
      registers,
      collect() {
        this.reset();
        for (const router of routers) {
          for (const stats of router.indexStats()) this.set({ model_name: router.modelName, worker: stats.address }, stats.numBlocks);
        }
      },
    });
    new Gauge({
      name: 'conduit_router_index_drift_blocks',
      help: 'The index\'s blocks for a worker minus the worker\'s own count, at the last report applied (0 when exact).',
      labelNames,
      registers,
      collect() {
        this.reset();
        for (const router of routers) {
          for (const stats of router.indexStats()) {
            if (stats.numDriftBlocks !== null) this.set({ model_name: router.modelName, worker: stats.address }, stats.numDriftBlocks);
          }
        }
      },
    });
    new Gauge({
      name: 'conduit_router_index_distinct_blocks',
      help: 'Distinct KV blocks in a model\'s prefix index (a block on several workers counts once).',
      labelNames: ['model_name'],
      registers,
      collect() {
        this.reset();
        for (const router of routers) this.set({ model_name: router.modelName }, router.numIndexedBlocks);
      },
    });
  }

  /** A gauge of the connection to Redis (router/redis-state.ts). */
  watchSharedState(state: { readonly isConnected: boolean }): void {
    new Gauge({
      name: 'conduit_router_redis_connected',
      help: 'Whether the gateway is connected to the Redis that shares workers and KV events (1) or routes on its last state (0).',
      registers: [this.registry],
      collect() {
        this.set(state.isConnected ? 1 : 0);
      },
    });
  }

  /** Reports the router's decisions here from now on. */
  watch<W extends RoutableWorker>(router: ModelRouter<W>): void {
    router.observer = this;
    this.routers.push(router);
  }

  routed(modelName: string, address: string, numPromptTokens: number, numPredictedCachedTokens: number | null, decisionSeconds: number): void {
    const labels = { model_name: modelName, worker: address };
    this.requests.inc(labels);
    this.promptTokens.inc(labels, numPromptTokens);
    if (numPredictedCachedTokens !== null) this.predictedCachedTokens.inc(labels, numPredictedCachedTokens);
    this.decisionTime.observe({ model_name: modelName }, decisionSeconds);
  }

  started(modelName: string, address: string, numCachedTokens: number): void {
    this.cachedTokens.inc({ model_name: modelName, worker: address }, numCachedTokens);
  }

  retried(modelName: string, fromAddress: string): void {
    this.retries.inc({ model_name: modelName, worker: fromAddress });
  }

  kvEventLag(modelName: string, seconds: number): void {
    this.eventLag.observe({ model_name: modelName }, seconds);
  }
}
