// A discrete-event simulation of many engine workers behind several gateway replicas, for the
// router benchmark: no model, a timing model instead. Each worker computes one prefill at a time
// (prefill is compute-bound), costing a fixed overhead plus a time per uncached prompt token, then
// decodes its output at a fixed time per token alongside the others; it keeps an LRU prefix cache
// of a fixed number of blocks named by the engine's real block hash, and reports its KV events and
// load to every gateway's ModelRouter, as the engine streams (or Redis) do. The routers are the
// real ones; only time is simulated, except each routing decision, which is timed for real.
import { BLOCK_HASH_WORDS, blockHashWords, chainBlockHashWords, extendBlockHashes, HASH_SCHEME, rootHash, type BlockHash } from '../engine/kv/block-hash.ts';
import type { KvEvent, StepReport, WorkerLoad, WorkerModelInfo } from '../engine/types.ts';
import { createRng, exponentialGapMs, type Rng } from '../loadtest/random.ts';
import { ModelRouter, type RoutableWorker, type RoutedRequest } from '../router/model-router.ts';
import { DEFAULT_ROUTER_SETTINGS, type RoutingPolicy } from '../router/settings.ts';

const MODEL = 'simulated';

export interface TimingModel {
  /** Per prefill, beside its tokens (the batch's fixed cost). */
  prefillOverheadMs: number;
  prefillMsPerToken: number;
  /** Per output token of one sequence; decoding does not hold up prefills. */
  decodeMsPerToken: number;
}

export type SimWorkload =
  /** Conversations arriving as a Poisson process; each turn resends the history and follows the last after a pause. */
  | { kind: 'multi-turn'; numConversations: number; numTurns: number; inputTokens: number; outputTokens: number; conversationsPerS: number; thinkMs: number }
  /** Requests arriving as a Poisson process, each behind one of numGroups long system prompts. */
  | { kind: 'shared-prefix'; numRequests: number; numGroups: number; systemPromptTokens: number; inputTokens: number; outputTokens: number; requestsPerS: number };

export interface SimSettings {
  policy: RoutingPolicy;
  numWorkers: number;
  numGateways: number;
  blockSizeTokens: number;
  numKvBlocksPerWorker: number;
  timing: TimingModel;
  workload: SimWorkload;
  seed: number;
}

export interface SimResult {
  numRequests: number;
  /** Cached prompt tokens / prompt tokens, as the workers found them. */
  prefixHitRate: number;
  /** Simulated milliseconds, sorted. */
  ttftsMs: Float64Array;
  /** Real microseconds per routing decision, sorted. */
  decisionsUs: Float64Array;
  /**
   * The process's CPU microseconds over each decision, sorted: unlike the wall time, no time in
   * which another process had the core (on a shared machine, what p99 mostly measures); any
   * other thread of this process running meanwhile (V8's GC helpers) counts.
   */
  decisionsCpuUs: Float64Array;
  /**
   * Real microseconds to hash every block a decision may look up, in the numeric form the router
   * looks them up by, for every tenth request, sorted: the share of hashing.
   */
  hashingUs: Float64Array;
  /** Distinct blocks in the first gateway's index at the end. */
  numIndexedBlocks: number;
}

interface SimRequest {
  promptTokenIds: number[];
  /** Full blocks of the prompt, as the engine names them. */
  promptHashes: BlockHash[];
  numOutputTokens: number;
  arrivalMs: number;
  routed: RoutedRequest<SimWorker>;
  onDone: (doneMs: number, outputTokenIds: number[]) => void;
}

/** A min-heap of timed callbacks: the simulation's clock. */
class EventQueue {
  private readonly times: number[] = [];
  private readonly actions: (() => void)[] = [];
  nowMs = 0;

  at(timeMs: number, action: () => void): void {
    let i = this.times.length;
    this.times.push(timeMs);
    this.actions.push(action);
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (this.times[parent] <= timeMs) break;
      this.swap(i, parent);
      i = parent;
    }
  }

  run(): void {
    while (this.times.length > 0) {
      this.nowMs = this.times[0];
      const action = this.actions[0];
      const lastTime = this.times.pop()!;
      const lastAction = this.actions.pop()!;
      if (this.times.length > 0) {
        this.times[0] = lastTime;
        this.actions[0] = lastAction;
        this.siftDown();
      }
      action();
    }
  }

  private siftDown(): void {
    const n = this.times.length;
    let i = 0;
    for (;;) {
      const left = 2 * i + 1;
      const right = left + 1;
      let least = i;
      if (left < n && this.times[left] < this.times[least]) least = left;
      if (right < n && this.times[right] < this.times[least]) least = right;
      if (least === i) return;
      this.swap(i, least);
      i = least;
    }
  }

  private swap(a: number, b: number): void {
    [this.times[a], this.times[b]] = [this.times[b], this.times[a]];
    [this.actions[a], this.actions[b]] = [this.actions[b], this.actions[a]];
  }
}

class SimWorker implements RoutableWorker {
  load: WorkerLoad;
  numPromptTokens = 0;
  numCachedTokens = 0;
  private readonly listeners = new Set<(report: StepReport) => void>();
  /** Cached blocks, least recently used first. */
  private readonly cache = new Map<BlockHash, true>();
  private readonly waiting: SimRequest[] = [];
  private isPrefilling = false;
  private numDecoding = 0;

  constructor(
    readonly address: string,
    private readonly info: WorkerModelInfo,
    private readonly root: BlockHash,
    private readonly numKvBlocks: number,
    private readonly timing: TimingModel,
    private readonly clock: EventQueue,
    private readonly ttftsMs: number[],
  ) {
    this.load = this.currentLoad();
  }

  onReport(listener: (report: StepReport) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  async health(): Promise<{ model: WorkerModelInfo }> {
    return { model: this.info };
  }

  submit(request: SimRequest): void {
    this.waiting.push(request);
    this.report([]);
    this.startNextPrefill();
  }

  private startNextPrefill(): void {
    if (this.isPrefilling || this.waiting.length === 0) return;
    const request = this.waiting.shift()!;
    this.isPrefilling = true;
    // The engine computes the block holding the last token whatever it caches.
    const numLookupBlocks = Math.floor((request.promptTokenIds.length - 1) / this.info.blockSizeTokens);
    let numCachedBlocks = 0;
    while (numCachedBlocks < numLookupBlocks && this.cache.has(request.promptHashes[numCachedBlocks])) numCachedBlocks++;
    const numCachedTokens = numCachedBlocks * this.info.blockSizeTokens;
    const numPromptTokens = request.promptTokenIds.length;
    this.numPromptTokens += numPromptTokens;
    this.numCachedTokens += numCachedTokens;
    const prefillMs = this.timing.prefillOverheadMs + (numPromptTokens - numCachedTokens) * this.timing.prefillMsPerToken;
    this.clock.at(this.clock.nowMs + prefillMs, () => {
      this.isPrefilling = false;
      this.ttftsMs.push(this.clock.nowMs - request.arrivalMs);
      request.routed.started(numCachedTokens);
      this.numDecoding++;
      this.report(this.cacheBlocks(request.promptHashes));
      this.startNextPrefill();
      this.clock.at(this.clock.nowMs + request.numOutputTokens * this.timing.decodeMsPerToken, () => this.finish(request));
    });
  }

  private finish(request: SimRequest): void {
    this.numDecoding--;
    request.routed.finished();
    // The blocks its output filled are cached too: the next turn of a conversation finds them.
    const outputTokenIds = Array.from({ length: request.numOutputTokens }, (_, i) => (request.promptTokenIds.length * 7919 + i * 104729) % 32000);
    const tokenIds = request.promptTokenIds.concat(outputTokenIds);
    const hashes = extendBlockHashes(request.promptHashes.slice(), this.root, tokenIds, this.info.blockSizeTokens, Math.floor(tokenIds.length / this.info.blockSizeTokens));
    this.report(this.cacheBlocks(hashes));
    request.onDone(this.clock.nowMs, outputTokenIds);
  }

  /** Caches the blocks (most recently used now), evicting the least recently used past capacity. */
  private cacheBlocks(hashes: readonly BlockHash[]): KvEvent[] {
    const stored: BlockHash[] = [];
    for (const hash of hashes) {
      if (this.cache.delete(hash)) this.cache.set(hash, true);
      else {
        this.cache.set(hash, true);
        stored.push(hash);
      }
    }
    const removed: BlockHash[] = [];
    for (const hash of this.cache.keys()) {
      if (this.cache.size <= this.numKvBlocks) break;
      this.cache.delete(hash);
      removed.push(hash);
    }
    return [{ kind: 'stored', blockHashes: stored }, { kind: 'removed', blockHashes: removed }];
  }

  private currentLoad(): WorkerLoad {
    let numQueuedPrefillTokens = 0;
    for (const request of this.waiting) numQueuedPrefillTokens += request.promptTokenIds.length;
    return {
      numRunning: this.numDecoding + (this.isPrefilling ? 1 : 0),
      numWaiting: this.waiting.length,
      numFreeBlocks: Math.max(0, this.numKvBlocks - this.cache.size),
      numTotalBlocks: this.numKvBlocks,
      numQueuedPrefillTokens,
      numCachedBlocks: this.cache.size,
    };
  }

  private report(events: KvEvent[]): void {
    this.load = this.currentLoad();
    const report: StepReport = { events, load: this.load, stats: null };
    for (const listener of this.listeners) listener(report);
  }
}

function randomTokens(rng: Rng, numTokens: number): number[] {
  return Array.from({ length: numTokens }, () => 3 + Math.floor(rng() * 31_000));
}

/** Runs the workload to its end under the policy and returns what the clients and workers saw. */
export function simulate(settings: SimSettings): SimResult {
  const rng = createRng(settings.seed);
  const clock = new EventQueue();
  const ttftsMs: number[] = [];
  const decisionsUs: number[] = [];
  const decisionsCpuUs: number[] = [];
  const hashingUs: number[] = [];
  const info: WorkerModelInfo = {
    modelName: MODEL, maxModelLen: 1 << 20, vocabSize: 32_000, blockSizeTokens: settings.blockSizeTokens, eosTokenIds: [2], blockHashScheme: HASH_SCHEME,
  };
  const root = rootHash({ model: MODEL });
  const rootWords = new Uint32Array(BLOCK_HASH_WORDS);
  blockHashWords(root, rootWords, 0);
  const workers = Array.from(
    { length: settings.numWorkers },
    (_, i) => new SimWorker(`sim-${i}`, info, root, settings.numKvBlocksPerWorker, settings.timing, clock, ttftsMs),
  );
  const routers = Array.from({ length: settings.numGateways }, () => {
    const router = new ModelRouter<SimWorker>({
      modelName: MODEL, blockSizeTokens: settings.blockSizeTokens, settings: { ...DEFAULT_ROUTER_SETTINGS, policy: settings.policy }, random: createRng(rng() * 2 ** 32),
    });
    for (const worker of workers) router.addWorker(worker, info);
    return router;
  });

  const send = (promptTokenIds: number[], promptHashes: BlockHash[], numOutputTokens: number, onDone: SimRequest['onDone']) => {
    const router = routers[Math.floor(rng() * routers.length)];
    const startCpu = process.cpuUsage();
    const startNs = process.hrtime.bigint();
    const routed = router.route({ promptTokenIds })!;
    decisionsUs.push(Number(process.hrtime.bigint() - startNs) / 1000);
    const cpu = process.cpuUsage(startCpu);
    decisionsCpuUs.push(cpu.user + cpu.system);
    if (decisionsUs.length % 10 === 0) {
      const hashStartNs = process.hrtime.bigint();
      chainBlockHashWords(rootWords, 0, promptTokenIds, 0, Math.floor((promptTokenIds.length - 1) / settings.blockSizeTokens), settings.blockSizeTokens);
      hashingUs.push(Number(process.hrtime.bigint() - hashStartNs) / 1000);
    }
    routed.worker.submit({ promptTokenIds, promptHashes, numOutputTokens, arrivalMs: clock.nowMs, routed, onDone });
  };
  const hashesOf = (tokenIds: number[], known: BlockHash[]) =>
    extendBlockHashes(known, root, tokenIds, settings.blockSizeTokens, Math.floor(tokenIds.length / settings.blockSizeTokens));

  const { workload } = settings;
  let numRequests = 0;
  if (workload.kind === 'multi-turn') {
    let arrivalMs = 0;
    for (let c = 0; c < workload.numConversations; c++) {
      arrivalMs += exponentialGapMs(rng, workload.conversationsPerS);
      const history: number[] = [];
      let hashes: BlockHash[] = [];
      const turn = (numDone: number) => {
        history.push(...randomTokens(rng, workload.inputTokens));
        hashes = hashesOf(history, hashes);
        numRequests++;
        send(history.slice(), hashes.slice(), workload.outputTokens, (doneMs, outputTokenIds) => {
          history.push(...outputTokenIds);
          if (numDone + 1 < workload.numTurns) clock.at(doneMs + workload.thinkMs, () => turn(numDone + 1));
        });
      };
      clock.at(arrivalMs, () => turn(0));
    }
  } else {
    const systemPrompts = Array.from({ length: workload.numGroups }, () => randomTokens(rng, workload.systemPromptTokens));
    const systemHashes = systemPrompts.map((tokens) => hashesOf(tokens, []));
    let arrivalMs = 0;
    for (let r = 0; r < workload.numRequests; r++) {
      arrivalMs += exponentialGapMs(rng, workload.requestsPerS);
      const group = Math.floor(rng() * workload.numGroups);
      clock.at(arrivalMs, () => {
        const tokens = systemPrompts[group].concat(randomTokens(rng, workload.inputTokens));
        numRequests++;
        send(tokens, hashesOf(tokens, systemHashes[group].slice()), workload.outputTokens, () => {});
      });
    }
  }
  clock.run();

  let numPromptTokens = 0;
  let numCachedTokens = 0;
  for (const worker of workers) {
    numPromptTokens += worker.numPromptTokens;
    numCachedTokens += worker.numCachedTokens;
  }
  return {
    numRequests,
    prefixHitRate: numPromptTokens === 0 ? 0 : numCachedTokens / numPromptTokens,
    ttftsMs: Float64Array.from(ttftsMs).sort(),
    decisionsUs: Float64Array.from(decisionsUs).sort(),
    decisionsCpuUs: Float64Array.from(decisionsCpuUs).sort(),
    hashingUs: Float64Array.from(hashingUs).sort(),
    numIndexedBlocks: routers[0].numIndexedBlocks,
  };
}

/** The q-quantile (0-1) of sorted values, nearest rank. */
export function quantile(sorted: Float64Array, q: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))];
}
