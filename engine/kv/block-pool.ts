// The pool of paged KV-cache blocks and the prefix cache over them. A block holds
// blockSizeTokens tokens' K and V in every layer; a sequence's block table is the list of block
// ids it holds, in position order. A block is in use while some sequence holds it (refCount > 0)
// and free otherwise; a free block may still be cached (it keeps the hash of the full block of
// tokens whose KV it holds, until it is reused).
//
// Free blocks wait in one queue, a doubly linked list threaded through two arrays, so every
// operation is O(1): allocation takes the head; a freed block without a hash goes to the head
// (nothing is lost by reusing it), a freed cached block to the tail, so cached blocks are evicted
// least recently used first. Reusing a cached block evicts it: its hash leaves the cache and a
// `removed` event says so.
import type { KvEvent } from '../types.ts';
import type { BlockHash } from './block-hash.ts';

const NIL = -1;

function cacheKey(hash: BlockHash, group: number): string {
  return group === 0 ? hash : `${hash}/${group}`;
}

export class BlockPool {
  readonly numTotalBlocks: number;
  private readonly refCounts: Int32Array;
  private readonly hashes: (BlockHash | null)[];
  /** The group a cached block was named in (meaningless while its hash is null). */
  private readonly groups: Int32Array;
  /** By cacheKey(hash, group). */
  private readonly cached = new Map<string, number>();
  private readonly prev: Int32Array;
  private readonly next: Int32Array;
  private head = NIL;
  private tail = NIL;
  private numFree = 0;
  private events: KvEvent[] = [];

  constructor(numTotalBlocks: number) {
    if (!Number.isInteger(numTotalBlocks) || numTotalBlocks < 1) {
      throw new RangeError(`Expected a positive integer for numTotalBlocks but received ${numTotalBlocks}`);
    }
    this.numTotalBlocks = numTotalBlocks;
    this.refCounts = new Int32Array(numTotalBlocks);
    this.hashes = new Array<BlockHash | null>(numTotalBlocks).fill(null);
    this.groups = new Int32Array(numTotalBlocks);
    this.prev = new Int32Array(numTotalBlocks);
    this.next = new Int32Array(numTotalBlocks);
    for (let blockId = 0; blockId < numTotalBlocks; blockId++) this.pushTail(blockId);
  }

  /** Blocks no sequence holds, cached or not. */
  get numFreeBlocks(): number {
    return this.numFree;
  }

  /** Cached blocks of every group. */
  get numCachedBlocks(): number {
    return this.cached.size;
  }

  refCountOf(blockId: number): number {
    return this.refCounts[blockId];
  }

  hashOf(blockId: number): BlockHash | null {
    return this.hashes[blockId];
  }

  /** The block caching this hash in this group, or undefined. */
  cachedBlock(hash: BlockHash, group = 0): number | undefined {
    return this.cached.get(cacheKey(hash, group));
  }

  /** Every hash cached in group 0, for a snapshot of the cache. */
  cachedHashes(): BlockHash[] {
    const hashes: BlockHash[] = [];
    for (const [blockId, hash] of this.hashes.entries()) if (hash !== null && this.groups[blockId] === 0) hashes.push(hash);
    return hashes;
  }

  /** Takes one more reference to each block (a cache hit); a free one leaves the free queue. */
  touch(blockIds: readonly number[]): void {
    for (const blockId of blockIds) {
      if (this.refCounts[blockId]++ === 0) this.unlink(blockId);
    }
  }

  /**
   * Appends numBlocks free blocks to blockIds, each with one reference, and returns true; or
   * returns false and changes nothing. Cached blocks among them are evicted.
   */
  allocate(numBlocks: number, blockIds: number[]): boolean {
    if (numBlocks > this.numFree) return false;
    for (let i = 0; i < numBlocks; i++) {
      const blockId = this.head;
      this.unlink(blockId);
      this.refCounts[blockId] = 1;
      this.uncache(blockId);
      blockIds.push(blockId);
    }
    return true;
  }

  /**
   * Drops one reference to each block. A block nobody holds becomes free: a cached one at the
   * tail of the queue, walking blockIds backwards, so a sequence's last blocks are evicted before
   * its first (a later request is likelier to share a prefix than a tail).
   */
  free(blockIds: readonly number[]): void {
    for (let i = blockIds.length - 1; i >= 0; i--) {
      const blockId = blockIds[i];
      // A double free would hand one block to two sequences: their KV would overwrite each other.
      if (this.refCounts[blockId] <= 0) throw new Error(`KV block ${blockId} freed twice`);
      if (--this.refCounts[blockId] > 0) continue;
      if (this.hashes[blockId] === null) this.pushHead(blockId);
      else this.pushTail(blockId);
    }
  }

  /**
   * Names a held block by the hash of the full block of tokens whose KV it holds (or is being
   * computed into this step). False when another block caches that hash already: this one stays
   * unnamed, a duplicate freed without loss.
   */
  cache(blockId: number, hash: BlockHash, group = 0): boolean {
    const key = cacheKey(hash, group);
    if (this.hashes[blockId] !== null || this.cached.has(key)) return false;
    this.hashes[blockId] = hash;
    this.groups[blockId] = group;
    this.cached.set(key, blockId);
    if (group === 0) this.record('stored', hash);
    return true;
  }

  /** Forgets a block's hash (its KV is gone or was never written). */
  uncache(blockId: number): void {
    const hash = this.hashes[blockId];
    if (hash === null) return;
    this.hashes[blockId] = null;
    this.cached.delete(cacheKey(hash, this.groups[blockId]));
    if (this.groups[blockId] === 0) this.record('removed', hash);
  }

  /** The events since the last call, consecutive ones of a kind merged. */
  takeEvents(): KvEvent[] {
    const events = this.events;
    this.events = [];
    return events;
  }

  private record(kind: 'stored' | 'removed', hash: BlockHash): void {
    const last = this.events.at(-1);
    if (last !== undefined && last.kind === kind) last.blockHashes.push(hash);
    else this.events.push({ kind, blockHashes: [hash] });
  }

  private pushTail(blockId: number): void {
    this.prev[blockId] = this.tail;
    this.next[blockId] = NIL;
    if (this.tail === NIL) this.head = blockId;
    else this.next[this.tail] = blockId;
    this.tail = blockId;
    this.numFree++;
  }

  private pushHead(blockId: number): void {
    this.next[blockId] = this.head;
    this.prev[blockId] = NIL;
    if (this.head === NIL) this.tail = blockId;
    else this.prev[this.head] = blockId;
    this.head = blockId;
    this.numFree++;
  }

  private unlink(blockId: number): void {
    const before = this.prev[blockId];
    const after = this.next[blockId];
    if (before === NIL) this.head = after;
    else this.next[before] = after;
    if (after === NIL) this.tail = before;
    else this.prev[after] = before;
    this.numFree--;
  }
}
