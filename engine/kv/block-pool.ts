// The pool of paged KV-cache blocks. A block holds blockSizeTokens tokens' K and V in every
// layer; a sequence's block table is the list of block ids it owns, in position order.
// Free blocks sit in a FIFO ring (allocate from the head, free to the tail), so the block
// freed longest ago is reused first: the order an LRU prefix cache needs.

export class BlockPool {
  readonly numTotalBlocks: number;
  private readonly refCounts: Int32Array;
  private readonly freeRing: Int32Array;
  private freeHead = 0;
  private numFree: number;

  constructor(numTotalBlocks: number) {
    if (!Number.isInteger(numTotalBlocks) || numTotalBlocks < 1) {
      throw new RangeError(`Expected a positive integer for numTotalBlocks but received ${numTotalBlocks}`);
    }
    this.numTotalBlocks = numTotalBlocks;
    this.refCounts = new Int32Array(numTotalBlocks);
    this.freeRing = new Int32Array(numTotalBlocks);
    for (let blockId = 0; blockId < numTotalBlocks; blockId++) this.freeRing[blockId] = blockId;
    this.numFree = numTotalBlocks;
  }

  get numFreeBlocks(): number {
    return this.numFree;
  }

  /** Appends numBlocks blocks to blockIds and returns true, or returns false and changes nothing. */
  allocate(numBlocks: number, blockIds: number[]): boolean {
    if (numBlocks > this.numFree) return false;
    for (let i = 0; i < numBlocks; i++) {
      const blockId = this.freeRing[this.freeHead];
      this.freeHead = this.freeHead + 1 === this.numTotalBlocks ? 0 : this.freeHead + 1;
      this.refCounts[blockId] = 1;
      blockIds.push(blockId);
    }
    this.numFree -= numBlocks;
    return true;
  }

  /** Drops one reference to each block; a block nobody references returns to the free ring. */
  free(blockIds: readonly number[]): void {
    for (const blockId of blockIds) {
      // A double free would hand one block to two sequences: their KV would overwrite each other.
      if (this.refCounts[blockId] <= 0) throw new Error(`KV block ${blockId} freed twice`);
      if (--this.refCounts[blockId] > 0) continue;
      const tail = (this.freeHead + this.numFree) % this.numTotalBlocks;
      this.freeRing[tail] = blockId;
      this.numFree++;
    }
  }
}
