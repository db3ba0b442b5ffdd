// The KV manager between the scheduler and the block pool: the scheduler asks it for a
// sequence's cached prefix and for slots, and gets blocks or "no"; it never touches the pool.
//
// Prefix caching (vLLM's scheme): a sequence's full blocks are named by their chained hashes
// (block-hash.ts) as soon as their KV is scheduled, so a request admitted later, or later in the
// same step, reuses them (every layer's K and V are written before any attention reads them, so
// sharing within a step is sound). A new sequence starts after every cached full block of its
// known tokens, leaving at least its last token to compute (its logits are needed); a block in
// use is shared by reference count, and freed blocks stay cached until the pool reuses them.
//
// KV-cache groups (vLLM's hybrid allocator): a model whose layers see different spans (Gemma 3's
// local and global layers, gpt-oss's alternating ones, or a window on every layer) keeps one block
// table per group, every group drawing equal blocks from the one pool. A group whose layers slide
// over a window frees each block once no future token can see it: a long conversation then holds
// only its window on those layers. Such a freed block keeps its hash and KV until the pool reuses
// it, like any freed block.
//
// A prefix hit must give every layer what the first computed token attends to. A full-attention
// group needs every block of the prefix; a sliding group only the blocks its window reaches from
// the first computed position, P - window + 1 to P - 1: earlier blocks may be long evicted and are
// not needed, while a hole inside the window, even one block, makes the prefix unusable at that
// length. The hit is the longest prefix that satisfies every group at once (its table holds -1
// for the blocks its window no longer needs).
import type { KvEvent } from '../types.ts';
import { extendBlockHashes, type BlockHash } from './block-hash.ts';
import { BlockPool } from './block-pool.ts';

/** A block table entry no layer of the group reads any more (the runtime never touches it). */
export const NO_BLOCK = -1;

export interface KvGroup {
  /** Tokens each query of the group's layers looks back, itself included; null when unlimited. */
  slidingWindowTokens: number | null;
}

/** What the manager reads and writes of a sequence. */
export interface KvSequence {
  /** Known tokens: prompt, then output. */
  readonly tokenIds: readonly number[];
  numComputedTokens: number;
  /**
   * One table per KV-cache group, position-ordered: entry i holds positions [i * blockSize,
   * (i + 1) * blockSize), NO_BLOCK where the group's window has left it. Empty tables until the
   * first allocation.
   */
  readonly blockTables: number[][];
  /** The root of the sequence's hash chain (its model and cache salt); null: never cached or shared. */
  readonly cacheRoot: BlockHash | null;
  /** Hashes of its first full blocks, extended as they fill. */
  readonly blockHashes: BlockHash[];
}

/** The cached blocks a sequence without blocks can start from (findCachedPrefix). */
export interface CachedPrefix {
  /** Full blocks of the prefix: numBlocks * blockSizeTokens tokens need no computing. */
  readonly numBlocks: number;
  /** Per group, its table for them (NO_BLOCK before a window's reach). */
  readonly blockTables: readonly (readonly number[])[];
}

export interface KvCacheStats {
  /** Tokens looked up in the prefix cache at admission, and those found. */
  numQueriedTokens: number;
  numHitTokens: number;
}

const FULL_ATTENTION: readonly KvGroup[] = [{ slidingWindowTokens: null }];

/** The longest sequence that numBlocks can ever hold (maxBlocksFor, inverted): a cache's context length. */
export function maxTokensWithin(numBlocks: number, blockSizeTokens: number, groups: readonly KvGroup[], maxNumNewTokens: number): number {
  const kv = new KvCacheManager(1, blockSizeTokens, groups);
  let low = 0;
  let high = numBlocks * blockSizeTokens;
  // With a sliding group, a long enough sequence needs no more blocks than a shorter one: the
  // full groups decide; with none, any length fits a cache that holds the windows.
  if (kv.maxBlocksFor(Number.MAX_SAFE_INTEGER, maxNumNewTokens) <= numBlocks) return Number.MAX_SAFE_INTEGER;
  while (low < high) {
    const middle = Math.ceil((low + high) / 2);
    if (kv.maxBlocksFor(middle, maxNumNewTokens) <= numBlocks) low = middle;
    else high = middle - 1;
  }
  return low;
}

export class KvCacheManager {
  readonly blockSizeTokens: number;
  readonly groups: readonly KvGroup[];
  readonly stats: KvCacheStats = { numQueriedTokens: 0, numHitTokens: 0 };
  private readonly pool: BlockPool;
  /** Blocks named this step, until the step is known to have run (see forgetStep). */
  private stepCachedBlocks: number[] = [];

  constructor(numTotalBlocks: number, blockSizeTokens: number, groups: readonly KvGroup[] = FULL_ATTENTION) {
    if (groups.length === 0) throw new RangeError('KvCacheManager: a model has at least one KV-cache group');
    this.pool = new BlockPool(numTotalBlocks);
    this.blockSizeTokens = blockSizeTokens;
    this.groups = groups;
  }

  /** Some group's layers slide over a window (its blocks are freed as sequences advance). */
  get hasSlidingWindows(): boolean {
    return this.groups.some((group) => group.slidingWindowTokens !== null);
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

  /** The block caching the hash in a group, if any (for checks). */
  cachedBlock(hash: BlockHash, group = 0): number | undefined {
    return this.pool.cachedBlock(hash, group);
  }

  /** Fraction of the blocks held by sequences. */
  get usage(): number {
    return 1 - this.pool.numFreeBlocks / this.pool.numTotalBlocks;
  }

  /**
   * The most blocks a sequence of numTokens holds at once when at most maxNumNewTokens are
   * computed per step: a full group holds one per block of tokens, a sliding group its window's
   * blocks plus a step's.
   */
  maxBlocksFor(numTokens: number, maxNumNewTokens: number): number {
    const all = Math.ceil(numTokens / this.blockSizeTokens);
    let total = 0;
    for (const { slidingWindowTokens: window } of this.groups) {
      total += window === null ? all : Math.min(all, Math.ceil((window - 1 + maxNumNewTokens) / this.blockSizeTokens) + 1);
    }
    return total;
  }

  /**
   * The cached blocks a sequence without blocks can start from: the longest prefix of its full
   * blocks (leaving its last known token to compute) for which every group has what the first
   * computed token reads.
   */
  findCachedPrefix(sequence: KvSequence): CachedPrefix {
    if (sequence.cacheRoot === null) return this.noPrefix();
    const numTokens = sequence.tokenIds.length;
    const numBlocks = Math.floor((numTokens - 1) / this.blockSizeTokens);
    extendBlockHashes(sequence.blockHashes, sequence.cacheRoot, sequence.tokenIds, this.blockSizeTokens, numBlocks);
    // A full group caps the prefix at its first miss; a sliding group's blocks are looked up
    // within that cap (any of them may be the start of its window).
    let length = numBlocks;
    const found: number[][] = this.groups.map(() => []);
    this.groups.forEach(({ slidingWindowTokens }, group) => {
      if (slidingWindowTokens !== null) return;
      for (let block = 0; block < length; block++) {
        const blockId = this.pool.cachedBlock(sequence.blockHashes[block], group);
        if (blockId === undefined) length = block;
        else found[group].push(blockId);
      }
    });
    this.groups.forEach(({ slidingWindowTokens }, group) => {
      if (slidingWindowTokens === null) return;
      for (let block = 0; block < length; block++) found[group].push(this.pool.cachedBlock(sequence.blockHashes[block], group) ?? NO_BLOCK);
    });
    for (; length > 0; length--) {
      if (this.groups.every((_, group) => this.covers(found[group], group, length))) break;
    }
    if (length === 0) return this.noPrefix();
    return {
      numBlocks: length,
      blockTables: this.groups.map((_, group) => {
        const first = this.firstNeededBlock(group, length * this.blockSizeTokens);
        return found[group].slice(0, length).map((blockId, block) => (block < first ? NO_BLOCK : blockId));
      }),
    };
  }

  /** Whether a group holds every block the first token after `numBlocks` cached blocks reads. */
  private covers(found: readonly number[], group: number, numBlocks: number): boolean {
    for (let block = this.firstNeededBlock(group, numBlocks * this.blockSizeTokens); block < numBlocks; block++) {
      if (found[block] === NO_BLOCK) return false;
    }
    return true;
  }

  /** The first block a token at `position` or later reads in this group. */
  private firstNeededBlock(group: number, position: number): number {
    const window = this.groups[group].slidingWindowTokens;
    return window === null ? 0 : Math.floor(Math.max(0, position - window + 1) / this.blockSizeTokens);
  }

  private noPrefix(): CachedPrefix {
    return { numBlocks: 0, blockTables: this.groups.map(() => []) };
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
   * Gives a sequence blocks up to position numComputedTokens + numNewTokens in every group, taking
   * the cached prefix blocks first (for a sequence without blocks, from findCachedPrefix; its
   * numComputedTokens then starts after them), and returns true; or returns false, having changed
   * nothing but freed the blocks its windows have left (which it would free anyway).
   */
  allocateSlots(sequence: KvSequence, numNewTokens: number, prefix?: CachedPrefix): boolean {
    const tables = sequence.blockTables;
    while (tables.length < this.groups.length) tables.push([]);
    const fresh = tables[0].length === 0;
    const numComputedTokens = fresh ? (prefix?.numBlocks ?? 0) * this.blockSizeTokens : sequence.numComputedTokens;
    if (!fresh) this.freeBlocksOutOfWindow(sequence, numComputedTokens);
    const numBlocksNeeded = Math.ceil((numComputedTokens + numNewTokens) / this.blockSizeTokens);
    const prefixBlocks = fresh ? (prefix?.numBlocks ?? 0) : 0;
    let numNewBlocks = 0;
    // Prefix blocks nobody holds are counted free; taking them leaves fewer for the new blocks.
    let numFreePrefixBlocks = 0;
    for (let group = 0; group < this.groups.length; group++) {
      numNewBlocks += Math.max(0, numBlocksNeeded - tables[group].length - prefixBlocks);
      for (const blockId of prefix?.blockTables[group] ?? []) if (fresh && blockId !== NO_BLOCK && this.pool.refCountOf(blockId) === 0) numFreePrefixBlocks++;
    }
    if (numNewBlocks > this.pool.numFreeBlocks - numFreePrefixBlocks) return false;
    // Every group's prefix blocks leave the free queue before any group allocates, or one group's
    // new block could be another's prefix block.
    if (fresh && prefix !== undefined) {
      for (let group = 0; group < this.groups.length; group++) {
        this.pool.touch(prefix.blockTables[group].filter((blockId) => blockId !== NO_BLOCK));
        tables[group].push(...prefix.blockTables[group]);
      }
    }
    for (const table of tables) {
      const count = numBlocksNeeded - table.length;
      if (count > 0) this.pool.allocate(count, table);
    }
    sequence.numComputedTokens = numComputedTokens;
    return true;
  }

  /** Returns to the pool every block no token from `position` on reads, in each sliding group. */
  private freeBlocksOutOfWindow(sequence: KvSequence, position: number): void {
    this.groups.forEach((_, group) => {
      const table = sequence.blockTables[group];
      const first = Math.min(this.firstNeededBlock(group, position), table.length);
      // Freed last to first, as free() does, so a prompt's head outlives its tail in the cache.
      for (let block = first - 1; block >= 0; block--) {
        if (table[block] === NO_BLOCK) break;
        this.pool.free([table[block]]);
        table[block] = NO_BLOCK;
      }
    });
  }

  /** Names the sequence's blocks that this step fills: numTokensAfterStep of its tokens will have KV. */
  cacheScheduledBlocks(sequence: KvSequence, numTokensAfterStep: number): void {
    if (sequence.cacheRoot === null) return;
    const numBlocks = Math.floor(numTokensAfterStep / this.blockSizeTokens);
    const firstNew = Math.floor(sequence.numComputedTokens / this.blockSizeTokens);
    if (firstNew >= numBlocks) return;
    extendBlockHashes(sequence.blockHashes, sequence.cacheRoot, sequence.tokenIds, this.blockSizeTokens, numBlocks);
    sequence.blockTables.forEach((table, group) => {
      for (let block = firstNew; block < numBlocks; block++) {
        const blockId = table[block];
        if (blockId !== NO_BLOCK && this.pool.cache(blockId, sequence.blockHashes[block], group)) this.stepCachedBlocks.push(blockId);
      }
    });
  }

  /**
   * Returns to the pool each group's blocks past the first numTokens positions (speculative
   * decoding's rejected proposals, never named, so they are reused first).
   */
  trimSlots(sequence: KvSequence, numTokens: number): void {
    const numBlocksKept = Math.ceil(numTokens / this.blockSizeTokens);
    for (const table of sequence.blockTables) {
      if (table.length <= numBlocksKept) continue;
      this.pool.free(table.slice(numBlocksKept));
      table.length = numBlocksKept;
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

  /** Returns the sequence's blocks to the pool (cached ones stay cached) and clears its tables. */
  free(sequence: KvSequence): void {
    for (const table of sequence.blockTables) {
      this.pool.free(table.filter((blockId) => blockId !== NO_BLOCK));
      table.length = 0;
    }
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
