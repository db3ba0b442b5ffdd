// Which worker holds which KV block, exactly: built from the workers' own KV events (blocks
// stored, removed, all cleared), named by the engine's block hash. A block's hash chains over
// everything before it, so a prompt's cached prefix on a worker is the run of its leading block
// hashes that the worker holds, and one map from hash to holders answers for every worker at once.
//
// Workers are small integer slots that the router hands out (and reuses after a worker leaves),
// so a lookup writes into a typed array instead of building a map per request.
import type { BlockHash } from '../engine/kv/block-hash.ts';
import type { KvEvent } from '../engine/types.ts';

export class PrefixIndex {
  /** Block hash -> the slots that hold it (a handful: a block lives on the workers that computed it). */
  private readonly holders = new Map<BlockHash, number[]>();
  /** Slot -> its blocks, to clear a worker without scanning every hash. */
  private readonly blocksBySlot: Set<BlockHash>[] = [];

  /** Distinct blocks held by any worker. */
  get numBlocks(): number {
    return this.holders.size;
  }

  /** Blocks the worker in slot holds, as its events told. */
  numBlocksOf(slot: number): number {
    return this.blocksBySlot[slot]?.size ?? 0;
  }

  /** Applies one report's events from the worker in slot, in order. */
  apply(slot: number, events: readonly KvEvent[]): void {
    for (const event of events) {
      if (event.kind === 'cleared') this.clear(slot);
      else if (event.kind === 'stored') for (const hash of event.blockHashes) this.store(slot, hash);
      else for (const hash of event.blockHashes) this.remove(slot, hash);
    }
  }

  /** Forgets every block of the worker in slot (it left, restarted or lost its stream). */
  clear(slot: number): void {
    const blocks = this.blocksBySlot[slot];
    if (blocks === undefined) return;
    for (const hash of blocks) this.dropHolder(hash, slot);
    blocks.clear();
  }

  /**
   * For each slot below matchedBlocks.length, writes how many leading blocks of hashes it holds
   * (a block counts only after every block before it), and returns the most.
   */
  match(hashes: readonly BlockHash[], matchedBlocks: Int32Array): number {
    matchedBlocks.fill(0);
    let numMatched = 0;
    while (numMatched < hashes.length && this.matchNext(hashes[numMatched], numMatched, matchedBlocks)) numMatched++;
    return numMatched;
  }

  /**
   * One step of match, for a caller that hashes block by block and stops at the first block no
   * worker holds: advances every slot that holds blocks 0..block-1 and this one (matchedBlocks
   * zeroed before block 0). False when none does: no later block can match.
   */
  matchNext(hash: BlockHash, block: number, matchedBlocks: Int32Array): boolean {
    const slots = this.holders.get(hash);
    if (slots === undefined) return false;
    let numAdvanced = 0;
    for (let i = 0; i < slots.length; i++) {
      const slot = slots[i];
      if (slot < matchedBlocks.length && matchedBlocks[slot] === block) {
        matchedBlocks[slot] = block + 1;
        numAdvanced++;
      }
    }
    return numAdvanced > 0;
  }

  private store(slot: number, hash: BlockHash): void {
    const blocks = (this.blocksBySlot[slot] ??= new Set());
    if (blocks.has(hash)) return;
    blocks.add(hash);
    const slots = this.holders.get(hash);
    if (slots === undefined) this.holders.set(hash, [slot]);
    else slots.push(slot);
  }

  private remove(slot: number, hash: BlockHash): void {
    if (this.blocksBySlot[slot]?.delete(hash)) this.dropHolder(hash, slot);
  }

  private dropHolder(hash: BlockHash, slot: number): void {
    const slots = this.holders.get(hash)!;
    if (slots.length === 1) {
      this.holders.delete(hash);
      return;
    }
    const i = slots.indexOf(slot);
    slots[i] = slots[slots.length - 1];
    slots.pop();
  }
}
