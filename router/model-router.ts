// The router of one served model: its workers, the exact prefix index of their KV caches, and
// the policy that picks a worker for each request.
//
// kv-aware (the default): hash the prompt's full blocks with the engine's block hash, find per
// worker the longest cached prefix in the index (or among the prompts in flight to it, which
// will be cached by the time this one is scheduled behind them), and take the lowest
//
//   cost = prompt tokens the worker would still compute + loadWeight × its load
//   load = queued prefill tokens + requestLoadTokens × requests in flight      (tokens of work ahead)
//
// skipping workers over the busy threshold while any other is not; ties go to the lighter load,
// then to chance (so that gateways deciding at once do not herd onto one worker). A session key
// sticks to the worker that served its last turn unless that worker is busy.
//
// Load is what the worker last reported, or what this gateway has sent it since if that is
// more: a report lags the requests routed since it was made, and a burst decided between two
// reports must not all land on one worker (llm-d-router #2515, dynamo #589).
import { pino, type Logger } from 'pino';
import { BLOCK_HASH_WORDS, blockHashWords, chainBlockHashWords, HASH_SCHEME, rootHash } from '../engine/kv/block-hash.ts';
import type { KvEvent, StepReport, WorkerLoad, WorkerModelInfo } from '../engine/types.ts';
import { AffinityTable } from './affinity.ts';
import { PrefixIndex } from './prefix-index.ts';
import type { RouterSettings } from './settings.ts';

/**
 * Blocks hashed per native call while matching a prompt: the lookup stops at the first block no
 * worker holds, so a cold prompt costs one run, and a long hit a call per run.
 */
const HASH_RUN_BLOCKS = 32;

/** What the router needs of a worker (an EngineClient is one). */
export interface RoutableWorker {
  readonly address: string;
  /** The load of the worker's last report; null while its stream is down. */
  readonly load: WorkerLoad | null;
  onReport(listener: (report: StepReport) => void): () => void;
  health(): Promise<{ model: WorkerModelInfo }>;
}

export interface RouteRequest {
  promptTokenIds: readonly number[];
  cacheSalt?: string;
  /** A conversation's key: its turns prefer the worker that served the previous one. */
  affinityKey?: string;
  /**
   * The key the conversation's next turn will send as its affinityKey, when it differs from this
   * one's (a Responses turn's own id, which the next names as previous_response_id).
   */
  nextTurnKey?: string;
  /** False when the worker will compute the whole prompt anyway (prompt logprobs). */
  usesPrefixCache?: boolean;
}

/** Where the router reports what it did (router/metrics.ts). */
export interface RouterObserver {
  routed(modelName: string, address: string, numPromptTokens: number, numPredictedCachedTokens: number | null, decisionSeconds: number): void;
  /** A request's first output: numCachedTokens of its prompt came from the worker's cache. */
  started(modelName: string, address: string, numCachedTokens: number): void;
  /** A request that failed on a worker before it started was sent to another. */
  retried(modelName: string, fromAddress: string): void;
  /** A KV event from a shared feed reached the index this long after the worker published it. */
  kvEventLag(modelName: string, seconds: number): void;
}

/** One worker as the router sees it. */
class WorkerState<W extends RoutableWorker> {
  /** This gateway's requests on the worker, from routing to their last output. */
  numLocalRequests = 0;
  /** Uncached prompt tokens of this gateway's requests that have not produced a first output. */
  numLocalPrefillTokens = 0;
  /** Its KV events come from a shared feed (Redis); those on its engine stream are ignored. */
  isFedExternally = false;
  /** The index's block count minus the worker's own, at the last report applied; null before one. */
  numDriftBlocks: number | null = null;
  /** Its block hashes are ours (scheme and block size); false: it never scores a hit. */
  hashesMatch = true;
  /** Prompts this gateway routed here that have not produced a first output: not yet in the cache, soon to be. */
  readonly inFlightPrompts: RouteRequest[] = [];
  unsubscribe: () => void = () => {};

  constructor(
    readonly worker: W,
    readonly slot: number,
  ) {}

  get isAvailable(): boolean {
    return this.worker.load !== null;
  }

  get numRequests(): number {
    const load = this.worker.load;
    return load === null ? this.numLocalRequests : Math.max(load.numRunning + load.numWaiting, this.numLocalRequests);
  }

  get numQueuedPrefillTokens(): number {
    const load = this.worker.load;
    return load === null ? this.numLocalPrefillTokens : Math.max(load.numQueuedPrefillTokens, this.numLocalPrefillTokens);
  }

  get kvUsage(): number {
    const load = this.worker.load;
    return load === null || load.numTotalBlocks === 0 ? 0 : 1 - load.numFreeBlocks / load.numTotalBlocks;
  }
}

/** One routed request: tell the router when it starts and when it ends, so its load counts right. */
export class RoutedRequest<W extends RoutableWorker> {
  private hasStarted = false;
  private isFinished = false;

  constructor(
    private readonly router: ModelRouter<W>,
    private readonly state: WorkerState<W>,
    readonly request: RouteRequest,
    /** Prompt tokens the index predicted the worker holds; null when the policy did not look. */
    readonly numPredictedCachedTokens: number | null,
    private readonly numPendingPrefillTokens: number,
    /** Workers this request already failed on. */
    private readonly excluded: ReadonlySet<W> | undefined,
  ) {}

  get worker(): W {
    return this.state.worker;
  }

  /** The worker's first output for the request: its prompt is computed. */
  started(numCachedTokens: number): void {
    if (this.hasStarted || this.isFinished) return;
    this.hasStarted = true;
    this.state.numLocalPrefillTokens -= this.numPendingPrefillTokens;
    this.forgetPrompt();
    this.router.observer?.started(this.router.modelName, this.state.worker.address, numCachedTokens);
  }

  /** Its last output, an error, or an abort. Idempotent. */
  finished(): void {
    if (this.isFinished) return;
    this.isFinished = true;
    if (!this.hasStarted) {
      this.state.numLocalPrefillTokens -= this.numPendingPrefillTokens;
      this.forgetPrompt();
    }
    this.state.numLocalRequests--;
  }

  /** Computed (its blocks reach the index by KV events), or never will be. */
  private forgetPrompt(): void {
    const prompts = this.state.inFlightPrompts;
    const position = prompts.indexOf(this.request);
    if (position >= 0) prompts.splice(position, 1);
  }

  /**
   * The worker failed the request before it started: ends this route and routes the request
   * again among the workers it has not failed on. Null when none is left.
   */
  retry(): RoutedRequest<W> | null {
    this.finished();
    const excluded = new Set(this.excluded);
    excluded.add(this.state.worker);
    this.router.observer?.retried(this.router.modelName, this.state.worker.address);
    return this.router.route(this.request, excluded);
  }
}

export interface ModelRouterOptions {
  /** The served model's name: part of every block hash's root. */
  modelName: string;
  /** The workers' KV block size; null: learned from the first worker's health. */
  blockSizeTokens: number | null;
  settings: RouterSettings;
  /** Draws in [0, 1) for tie-breaks and the random policy (seeded in tests). */
  random?: () => number;
  /** The gateway's log (component `router`); silent when omitted. */
  log?: Logger;
}

export const silentLogger: Logger = pino({ level: 'silent' });

export type WorkerWatcher<W> = (worker: W) => (() => void) | void;

export class ModelRouter<W extends RoutableWorker> {
  readonly modelName: string;
  readonly settings: RouterSettings;
  /** The workers, live: the router adds and removes them in place. */
  readonly workers: W[] = [];
  observer: RouterObserver | null = null;
  private blockSizeTokens: number | null;
  private readonly index = new PrefixIndex();
  private readonly states: WorkerState<W>[] = [];
  private readonly freeSlots: number[] = [];
  private numSlots = 0;
  private readonly affinity: AffinityTable;
  private readonly watchers = new Set<WorkerWatcher<W>>();
  private readonly unwatchByWorker = new Map<W, (() => void)[]>();
  /** Per cache salt: its root hash in numeric form. */
  private readonly rootsBySalt = new Map<string, Uint32Array>();
  private readonly random: () => number;
  private readonly log: Logger;
  private nextRoundRobin = 0;
  private readonly scratchCandidates: WorkerState<W>[] = [];
  /** Per slot: leading prompt blocks the worker holds (reused by every lookup). */
  private matchedBlocks = new Int32Array(8);

  constructor(options: ModelRouterOptions) {
    this.modelName = options.modelName;
    this.blockSizeTokens = options.blockSizeTokens;
    this.settings = options.settings;
    this.random = options.random ?? Math.random;
    this.log = options.log ?? silentLogger;
    this.affinity = new AffinityTable(options.settings.sessionTtlMs, options.settings.maxSessions);
  }

  /** Distinct blocks in the index. */
  get numIndexedBlocks(): number {
    return this.index.numBlocks;
  }

  /**
   * Adds a worker and subscribes to its reports at once, so that the first (the whole prefix
   * cache) is not missed: add a new client before yielding to the event loop. `info` is the
   * worker's model as it reported it; without it the router asks the worker.
   */
  addWorker(worker: W, info?: WorkerModelInfo): void {
    if (this.states.some((state) => state.worker.address === worker.address)) {
      throw new Error(`worker ${worker.address} is already routed for ${this.modelName}`);
    }
    const slot = this.freeSlots.pop() ?? this.numSlots++;
    if (slot >= this.matchedBlocks.length) this.matchedBlocks = new Int32Array(2 * this.matchedBlocks.length);
    const state = new WorkerState(worker, slot);
    state.unsubscribe = worker.onReport((report) => {
      if (state.isFedExternally) return;
      this.index.apply(slot, report.events);
      state.numDriftBlocks = this.index.numBlocksOf(slot) - report.load.numCachedBlocks;
    });
    this.states.push(state);
    this.workers.push(worker);
    const unwatch: (() => void)[] = [];
    for (const watcher of this.watchers) {
      const stop = watcher(worker);
      if (stop) unwatch.push(stop);
    }
    this.unwatchByWorker.set(worker, unwatch);
    if (info !== undefined) this.checkModel(state, info);
    else {
      worker.health().then(
        (health) => this.checkModel(state, health.model),
        () => {}, // an unreachable worker is skipped by its load until its stream is up
      );
    }
  }

  /** Removes the worker (it left or stopped heartbeating): its blocks leave the index. Returns it. */
  removeWorker(address: string): W | undefined {
    const position = this.states.findIndex((state) => state.worker.address === address);
    if (position < 0) return undefined;
    const [state] = this.states.splice(position, 1);
    this.workers.splice(this.workers.indexOf(state.worker), 1);
    state.unsubscribe();
    this.index.clear(state.slot);
    this.freeSlots.push(state.slot);
    this.affinity.forgetWorker(address);
    for (const stop of this.unwatchByWorker.get(state.worker) ?? []) stop();
    this.unwatchByWorker.delete(state.worker);
    return state.worker;
  }

  /** Calls watcher for every worker now and later; the function it returns runs when that worker leaves. */
  watchWorkers(watcher: WorkerWatcher<W>): void {
    this.watchers.add(watcher);
    for (const state of this.states) {
      const stop = watcher(state.worker);
      if (stop) this.unwatchByWorker.get(state.worker)!.push(stop);
    }
  }

  /**
   * Switches where the worker's KV events come from: a shared feed (true: applyExternalEvents)
   * or its engine stream (false). The index keeps what it knows; the next events build on it.
   */
  setFedExternally(address: string, isFedExternally: boolean): void {
    const state = this.stateOf(address);
    if (state !== undefined) state.isFedExternally = isFedExternally;
  }

  /** Events of a worker from a shared feed, with the worker's own block count after them. */
  applyExternalEvents(address: string, events: readonly KvEvent[], numCachedBlocks: number, publishedAtMs: number): void {
    const state = this.stateOf(address);
    if (state === undefined || !state.isFedExternally) return;
    this.index.apply(state.slot, events);
    state.numDriftBlocks = this.index.numBlocksOf(state.slot) - numCachedBlocks;
    this.observer?.kvEventLag(this.modelName, Math.max(0, Date.now() - publishedAtMs) / 1000);
  }

  /** Per worker: blocks in the index and the drift from the worker's own count (null: no report yet). */
  indexStats(): { address: string; numBlocks: number; numDriftBlocks: number | null }[] {
    return this.states.map((state) => ({
      address: state.worker.address,
      numBlocks: this.index.numBlocksOf(state.slot),
      numDriftBlocks: state.numDriftBlocks,
    }));
  }

  /**
   * Picks a worker for the request, leaving out `excluded` (workers it already failed on).
   * Null when no worker is left.
   */
  route(request: RouteRequest, excluded?: ReadonlySet<W>): RoutedRequest<W> | null {
    const startMs = performance.now();
    const candidates = this.candidates(excluded);
    if (candidates.length === 0) return null;
    const numPromptTokens = request.promptTokenIds.length;
    let chosen: WorkerState<W>;
    let numPredictedCachedTokens: number | null = null;
    // kv-aware looks even at one worker: its predicted hits are a metric.
    if (candidates.length === 1 && this.settings.policy !== 'kv-aware') chosen = candidates[0];
    else {
      switch (this.settings.policy) {
        case 'kv-aware':
          chosen = this.pickKvAware(candidates, request);
          numPredictedCachedTokens = this.numCachedTokensOn(chosen);
          break;
        case 'least-load':
          chosen = this.pickLeastLoad(candidates);
          break;
        case 'round-robin':
          chosen = this.pickRoundRobin(candidates);
          break;
        case 'random':
          chosen = candidates[Math.floor(this.random() * candidates.length)];
          break;
      }
    }
    if (this.settings.policy === 'kv-aware') {
      if (request.affinityKey !== undefined) this.affinity.set(request.affinityKey, chosen.worker.address);
      if (request.nextTurnKey !== undefined) this.affinity.set(request.nextTurnKey, chosen.worker.address);
    }
    const numPendingPrefillTokens = numPromptTokens - (numPredictedCachedTokens ?? 0);
    if (this.settings.policy === 'kv-aware' && request.usesPrefixCache !== false) chosen.inFlightPrompts.push(request);
    chosen.numLocalRequests++;
    chosen.numLocalPrefillTokens += numPendingPrefillTokens;
    this.observer?.routed(
      this.modelName, chosen.worker.address, numPromptTokens, numPredictedCachedTokens, (performance.now() - startMs) / 1000,
    );
    return new RoutedRequest(this, chosen, request, numPredictedCachedTokens, numPendingPrefillTokens, excluded);
  }

  /** Workers with a live stream, not excluded; if none has one, every worker not excluded. */
  private candidates(excluded: ReadonlySet<W> | undefined): WorkerState<W>[] {
    const candidates = this.scratchCandidates;
    candidates.length = 0;
    for (const state of this.states) {
      if (excluded?.has(state.worker)) continue;
      if (state.isAvailable) candidates.push(state);
      // A lost stream loses the worker's cache for us: the next stream lists it anew.
      else if (!state.isFedExternally) {
        this.index.clear(state.slot);
        state.numDriftBlocks = null;
      }
    }
    if (candidates.length > 0) return candidates;
    return this.states.filter((state) => !excluded?.has(state.worker));
  }

  private pickKvAware(candidates: WorkerState<W>[], request: RouteRequest): WorkerState<W> {
    const { settings } = this;
    this.matchPrompt(request);
    let meanRequests = 0;
    for (const state of candidates) meanRequests += state.numRequests;
    meanRequests /= candidates.length;
    const busyRequests = settings.busyLoadFactor * (meanRequests + 1);
    const isBusy = (state: WorkerState<W>) => state.numRequests > busyRequests || state.kvUsage >= settings.busyKvUsage;
    let numIdle = 0;
    for (const state of candidates) if (!isBusy(state)) numIdle++;

    if (request.affinityKey !== undefined) {
      const address = this.affinity.get(request.affinityKey);
      const sticky = address === undefined ? undefined : candidates.find((state) => state.worker.address === address);
      if (sticky !== undefined && !isBusy(sticky)) return sticky;
    }

    const numPromptTokens = request.promptTokenIds.length;
    let best: WorkerState<W> | null = null;
    let bestCost = Infinity;
    let bestLoad = Infinity;
    let numTied = 0;
    for (const state of candidates) {
      if (numIdle > 0 && isBusy(state)) continue;
      const load = this.loadTokensOf(state);
      const cost = numPromptTokens - this.numCachedTokensOn(state) + settings.loadWeight * load;
      if (cost < bestCost || (cost === bestCost && load < bestLoad)) {
        best = state;
        bestCost = cost;
        bestLoad = load;
        numTied = 1;
      } else if (cost === bestCost && load === bestLoad && this.random() * ++numTied < 1) {
        best = state;
      }
    }
    return best!;
  }

  private pickLeastLoad(candidates: WorkerState<W>[]): WorkerState<W> {
    let best = candidates[0];
    let bestLoad = Infinity;
    let numTied = 0;
    for (const state of candidates) {
      const load = this.loadTokensOf(state);
      if (load < bestLoad) {
        best = state;
        bestLoad = load;
        numTied = 1;
      } else if (load === bestLoad && this.random() * ++numTied < 1) {
        best = state;
      }
    }
    return best;
  }

  private pickRoundRobin(candidates: WorkerState<W>[]): WorkerState<W> {
    const chosen = candidates[this.nextRoundRobin % candidates.length];
    this.nextRoundRobin = (this.nextRoundRobin + 1) % Number.MAX_SAFE_INTEGER;
    return chosen;
  }

  private loadTokensOf(state: WorkerState<W>): number {
    return state.numQueuedPrefillTokens + this.settings.requestLoadTokens * state.numRequests;
  }

  /** Tokens of the current lookup's prompt the worker holds (after matchPrompt). */
  private numCachedTokensOn(state: WorkerState<W>): number {
    return state.hashesMatch ? this.matchedBlocks[state.slot] * (this.blockSizeTokens ?? 0) : 0;
  }

  /**
   * Writes into matchedBlocks each worker's cached prefix of the blocks the worker would look up:
   * every full block but one that holds the last token (the engine always computes it, for its
   * logits). A prompt in flight to a worker counts as cached there.
   */
  private matchPrompt(request: RouteRequest): void {
    this.matchedBlocks.fill(0);
    const blockSizeTokens = this.blockSizeTokens;
    if (blockSizeTokens === null || request.usesPrefixCache === false) return;
    const numBlocks = Math.floor((request.promptTokenIds.length - 1) / blockSizeTokens);
    this.matchIndexed(request, numBlocks, blockSizeTokens);
    this.matchInFlight(request, numBlocks, blockSizeTokens);
  }

  /**
   * The index's part. Hashes a run of blocks at a time, and stops at the first block no worker
   * holds: the prompt's uncached tail costs at most one run.
   */
  private matchIndexed(request: RouteRequest, numBlocks: number, blockSizeTokens: number): void {
    let parent = this.rootOf(request.cacheSalt);
    let parentOffset = 0;
    for (let firstBlock = 0; firstBlock < numBlocks; firstBlock += HASH_RUN_BLOCKS) {
      const numRunBlocks = Math.min(HASH_RUN_BLOCKS, numBlocks - firstBlock);
      const hashWords = chainBlockHashWords(parent, parentOffset, request.promptTokenIds, firstBlock, numRunBlocks, blockSizeTokens);
      if (!this.index.matchRun(hashWords, firstBlock, numRunBlocks, this.matchedBlocks)) return;
      // The run's last hash is the next run's parent: chainBlockHashWords reads it before it overwrites.
      parent = hashWords;
      parentOffset = (numRunBlocks - 1) * BLOCK_HASH_WORDS;
    }
  }

  /**
   * The prompts in flight's part. A worker's KV events name a prompt's blocks only once its
   * prefill is done, so the requests of a new prefix that arrive faster than it is computed
   * (a system prompt's first users, a burst) would each look cold, go to the least loaded worker,
   * and be computed and cached on every worker, crowding the caches. Counting the prompts this
   * gateway has routed and not seen start keeps them together, as SGLang's and llm-d's
   * approximate indexes do by inserting a prompt when they route it. A few prompts per worker,
   * compared token by token, most ending at their first token.
   */
  private matchInFlight(request: RouteRequest, numBlocks: number, blockSizeTokens: number): void {
    const tokenIds = request.promptTokenIds;
    for (const state of this.states) {
      let numMatchedTokens = this.matchedBlocks[state.slot] * blockSizeTokens;
      for (const other of state.inFlightPrompts) {
        if (other.cacheSalt !== request.cacheSalt) continue;
        // Every full block of the other prompt will be cached; this one looks up numBlocks.
        const otherTokenIds = other.promptTokenIds;
        const numComparable = Math.min(numBlocks * blockSizeTokens, otherTokenIds.length - (otherTokenIds.length % blockSizeTokens));
        if (numComparable <= numMatchedTokens) continue;
        let numEqual = 0;
        while (numEqual < numComparable && otherTokenIds[numEqual] === tokenIds[numEqual]) numEqual++;
        numMatchedTokens = Math.max(numMatchedTokens, numEqual - (numEqual % blockSizeTokens));
      }
      this.matchedBlocks[state.slot] = numMatchedTokens / blockSizeTokens;
    }
  }

  private rootOf(cacheSalt: string | undefined): Uint32Array {
    const key = cacheSalt ?? '';
    let root = this.rootsBySalt.get(key);
    if (root === undefined) {
      // Salts are per tenant: few, but bounded all the same.
      if (this.rootsBySalt.size >= 4096) this.rootsBySalt.clear();
      root = new Uint32Array(BLOCK_HASH_WORDS);
      blockHashWords(rootHash({ model: this.modelName, cacheSalt }), root, 0);
      this.rootsBySalt.set(key, root);
    }
    return root;
  }

  private stateOf(address: string): WorkerState<W> | undefined {
    return this.states.find((state) => state.worker.address === address);
  }

  private checkModel(state: WorkerState<W>, info: WorkerModelInfo): void {
    this.blockSizeTokens ??= info.blockSizeTokens;
    const problems: string[] = [];
    if (info.blockHashScheme !== HASH_SCHEME) problems.push(`hashes blocks by ${info.blockHashScheme}, not ${HASH_SCHEME}`);
    if (info.blockSizeTokens !== this.blockSizeTokens) problems.push(`has ${info.blockSizeTokens}-token blocks, not ${this.blockSizeTokens}`);
    if (info.modelName !== this.modelName) problems.push(`serves ${info.modelName}, not ${this.modelName}`);
    state.hashesMatch = problems.length === 0;
    if (!state.hashesMatch) {
      this.log.warn({ worker: state.worker.address }, `worker ${state.worker.address} ${problems.join('; ')}: routed by load only`);
    }
  }
}
