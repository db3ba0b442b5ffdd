// A worker for routing tests: no engine, just the load and KV events a test makes it report,
// with the engine's real block hashes so the router's lookups are the ones it makes in service.
import { extendBlockHashes, HASH_SCHEME, rootHash, type BlockHash } from '../../engine/kv/block-hash.ts';
import type { KvEvent, StepReport, WorkerLoad, WorkerModelInfo } from '../../engine/types.ts';
import type { RoutableWorker } from '../model-router.ts';

export const MODEL = 'synthetic';
export const BLOCK_SIZE = 4;

export function idleLoad(overrides: Partial<WorkerLoad> = {}): WorkerLoad {
  return {
    numRunning: 0, numWaiting: 0, numFreeBlocks: 1000, numTotalBlocks: 1000, numQueuedPrefillTokens: 0, numCachedBlocks: 0,
    ...overrides,
  };
}

/** The hashes of the first numBlocks full blocks of tokenIds, as a worker names them. */
export function hashesOf(tokenIds: readonly number[], numBlocks: number, cacheSalt?: string): BlockHash[] {
  return extendBlockHashes([], rootHash({ model: MODEL, cacheSalt }), tokenIds, BLOCK_SIZE, numBlocks);
}

/** tokens 0..n-1 offset by seed: distinct prompts per seed. */
export function prompt(numTokens: number, seed = 0): number[] {
  return Array.from({ length: numTokens }, (_, i) => seed * 10_000 + i);
}

export class SyntheticWorker implements RoutableWorker {
  load: WorkerLoad | null = idleLoad();
  private readonly listeners = new Set<(report: StepReport) => void>();
  private readonly cachedBlocks = new Set<BlockHash>();

  constructor(
    readonly address: string,
    private readonly info: Partial<WorkerModelInfo> = {},
  ) {}

  onReport(listener: (report: StepReport) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  async health(): Promise<{ model: WorkerModelInfo }> {
    return { model: this.modelInfo() };
  }

  modelInfo(): WorkerModelInfo {
    return {
      modelName: MODEL, maxModelLen: 4096, vocabSize: 100_000, blockSizeTokens: BLOCK_SIZE, eosTokenIds: [0], blockHashScheme: HASH_SCHEME,
      ...this.info,
    };
  }

  /** Reports events (keeping its own count of cached blocks, as an engine does) and a load. */
  report(events: KvEvent[], load: Partial<WorkerLoad> = {}): void {
    for (const event of events) {
      if (event.kind === 'cleared') this.cachedBlocks.clear();
      else for (const hash of event.blockHashes) event.kind === 'stored' ? this.cachedBlocks.add(hash) : this.cachedBlocks.delete(hash);
    }
    this.load = idleLoad({ numCachedBlocks: this.cachedBlocks.size, ...load });
    for (const listener of this.listeners) listener({ events, load: this.load, stats: null });
  }

  /** Reports that it cached the first numBlocks blocks of tokenIds. */
  stores(tokenIds: readonly number[], numBlocks: number, load: Partial<WorkerLoad> = {}): BlockHash[] {
    const hashes = hashesOf(tokenIds, numBlocks);
    this.report([{ kind: 'stored', blockHashes: hashes }], load);
    return hashes;
  }
}
