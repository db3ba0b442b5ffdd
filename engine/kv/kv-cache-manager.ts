// The KV manager between the scheduler and the block pool: the scheduler asks it for a
// sequence's cached prefix and for slots, and gets blocks or "no"; it never touches the pool.
//
// Prefix caching (vLLM's scheme): a sequence's full blocks are named by their chained hashes
// (block-hash.ts) as soon as their KV is scheduled, so a request admitted later, or later in the
// same step, reuses them (every layer's K and V are written before any attention reads them, so
// sharing within a step is sound). A new sequence starts after every cached full block of its
// known tokens, leaving at least its last token to compute (its logits are needed); a block in
// use is shared by reference count, and freed blocks stay cached until the pool reuses them.
import type { KvEvent } from '../types.ts';
import { extendBlockHashes, type BlockHash } from './block-hash.ts';
import { BlockPool } from './block-pool.ts';

/** What the manager reads and writes of a sequence. */
export interface KvSequence {
  /** Known tokens: prompt, then output. */
  readonly tokenIds: readonly number[];
  numComputedTokens: number;
  /** Position-ordered blocks: block i holds positions [i * blockSize, (i + 1) * blockSize). */
  readonly blockIds: number[];
  /** The root of the sequence's hash chain (its model and cache salt); null: never cached or shared. */
  readonly cacheRoot: BlockHash | null;
  /** Hashes of its first full blocks, extended as they fill. */
  readonly blockHashes: BlockHash[];
}

export interface KvCacheStats {
  /** Tokens looked up in the prefix cache at admission, and those found. */
  numQueriedTokens: number;
  numHitTokens: number;
}

export class KvCacheManager {
  readonly blockSizeTokens: number;
  readonly stats: KvCacheStats = { numQueriedTokens: 0, numHitTokens: 0 };
  private readonly pool: BlockPool;
  /** Blocks named this step, until the step is known to have run (see forgetStep). */
  private stepCachedBlocks: number[] = [];

  constructor(numTotalBlocks: number, blockSizeTokens: number) {
    this.pool = new BlockPool(numTotalBlocks);
    this.blockSizeTokens = blockSizeTokens;
  }

  get numTotalBlocks(): number {
    return this.pool.numTotalBlocks;
  }

  get numFreeBlocks(): number {
    return this.pool.numFreeBlocks;
  }

  get numCachedBlocks(): number {
    return this.pool.numCachedBlocks;
  }

  /** How many sequences hold the block (for checks: the scheduler never needs it). */
  refCountOf(blockId: number): number {
    return this.pool.refCountOf(blockId);
  }

  /** The block caching the hash, if any (for checks). */
  cachedBlock(hash: BlockHash): number | undefined {
    return this.pool.cachedBlock(hash);
  }

  /** Fraction of the blocks held by sequences. */
  get usage(): number {
    return 1 - this.pool.numFreeBlocks / this.pool.numTotalBlocks;
  }

  /**
   * The cached blocks a sequence without blocks can start from: its first full blocks whose
   * hashes are cached, up to the first miss, leaving its last known token to compute.
   */
  findCachedPrefix(sequence: KvSequence): number[] {
    if (sequence.cacheRoot === null) return [];
    const numTokens = sequence.tokenIds.length;
    const numBlocks = Math.floor((numTokens - 1) / this.blockSizeTokens);
    extendBlockHashes(sequence.blockHashes, sequence.cacheRoot, sequence.tokenIds, this.blockSizeTokens, numBlocks);
    const blockIds: number[] = [];
    for (let block = 0; block < numBlocks; block++) {
      const blockId = this.pool.cachedBlock(sequence.blockHashes[block]);
      if (blockId === undefined) break;
      blockIds.push(blockId);
    }
    return blockIds;
  }

  /**
   * Counts a lookup whose sequence was admitted (a lookup repeated while a request waits for
   * blocks would count its hits again: vllm #43736).
   */
  recordLookup(numQueriedTokens: number, numHitTokens: number): void {
    this.stats.numQueriedTokens += numQueriedTokens;
    this.stats.numHitTokens += numHitTokens;
  }

  /**
   * Gives a sequence blocks up to position numComputedTokens + numNewTokens, taking the cached
   * prefix blocks first (for a sequence without blocks, from findCachedPrefix; its
   * numComputedTokens then starts after them), and returns true; or changes nothing and returns
   * false.
   */
  allocateSlots(sequence: KvSequence, numNewTokens: number, prefixBlockIds: readonly number[] = []): boolean {
    const numPrefixTokens = prefixBlockIds.length * this.blockSizeTokens;
    const numComputedTokens = sequence.blockIds.length === 0 ? numPrefixTokens : sequence.numComputedTokens;
    const numBlocksNeeded = Math.ceil((numComputedTokens + numNewTokens) / this.blockSizeTokens);
    const numNewBlocks = numBlocksNeeded - sequence.blockIds.length - prefixBlockIds.length;
    // Prefix blocks nobody holds are counted free; taking them leaves fewer for the new blocks.
    let numFreePrefixBlocks = 0;
    for (const blockId of prefixBlockIds) if (this.pool.refCountOf(blockId) === 0) numFreePrefixBlocks++;
    if (numNewBlocks > this.pool.numFreeBlocks - numFreePrefixBlocks) return false;
    this.pool.touch(prefixBlockIds);
    sequence.blockIds.push(...prefixBlockIds);
    if (numNewBlocks > 0) this.pool.allocate(numNewBlocks, sequence.blockIds);
    sequence.numComputedTokens = numComputedTokens;
    return true;
  }

  /** Names the sequence's blocks that this step fills: numTokensAfterStep of its tokens will have KV. */
  cacheScheduledBlocks(sequence: KvSequence, numTokensAfterStep: number): void {
    if (sequence.cacheRoot === null) return;
    const numBlocks = Math.floor(numTokensAfterStep / this.blockSizeTokens);
    const firstNew = Math.floor(sequence.numComputedTokens / this.blockSizeTokens);
    if (firstNew >= numBlocks) return;
    extendBlockHashes(sequence.blockHashes, sequence.cacheRoot, sequence.tokenIds, this.blockSizeTokens, numBlocks);
    for (let block = firstNew; block < numBlocks; block++) {
      const blockId = sequence.blockIds[block];
      if (this.pool.cache(blockId, sequence.blockHashes[block])) this.stepCachedBlocks.push(blockId);
    }
  }

  /** The step ran: what it named holds real KV. */
  commitStep(): void {
    this.stepCachedBlocks.length = 0;
  }

  /** The step failed: the blocks it named hold no KV, and must not be found. */
  forgetStep(): void {
    for (const blockId of this.stepCachedBlocks) this.pool.uncache(blockId);
    this.stepCachedBlocks.length = 0;
  }

  /** Returns the sequence's blocks to the pool (cached ones stay cached) and clears its table. */
  free(sequence: KvSequence): void {
    this.pool.free(sequence.blockIds);
    sequence.blockIds.length = 0;
  }

  takeEvents(): KvEvent[] {
    return this.pool.takeEvents();
  }

  /** The whole cache as events: a new listener's starting point. */
  snapshot(): KvEvent[] {
    const hashes = this.pool.cachedHashes();
    return hashes.length === 0 ? [{ kind: 'cleared' }] : [{ kind: 'cleared' }, { kind: 'stored', blockHashes: hashes }];
  }
}
