// KV-cache groups with sliding windows (vLLM's hybrid allocator): a sliding group frees the
// blocks its window has left, so a long sequence holds only its window there; a prefix hit needs
// every block of the full groups and only the window's blocks of the sliding ones, and a hole
// inside a window (an evicted block the first computed token would read) rules that length out.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { rootHash } from '../kv/block-hash.ts';
import { KvCacheManager, NO_BLOCK, type KvGroup, type KvSequence } from '../kv/kv-cache-manager.ts';

const BLOCK_SIZE = 4;
const WINDOW = 6;
const HYBRID: KvGroup[] = [{ slidingWindowTokens: null }, { slidingWindowTokens: WINDOW }];

function sequenceOf(tokenIds: number[]): KvSequence & { tokenIds: number[] } {
  return { tokenIds, numComputedTokens: 0, blockTables: [[]], cacheRoot: rootHash({ model: 'm' }), blockHashes: [] };
}

/** Schedules numTokens more of a sequence (admitting it after its cached prefix first), as one step that runs. */
function step(kv: KvCacheManager, sequence: KvSequence, numTokens: number): boolean {
  const prefix = sequence.blockTables[0].length === 0 ? kv.findCachedPrefix(sequence) : undefined;
  if (!kv.allocateSlots(sequence, numTokens, prefix)) return false;
  kv.cacheScheduledBlocks(sequence, sequence.numComputedTokens + numTokens);
  kv.commitStep();
  sequence.numComputedTokens += numTokens;
  return true;
}

const held = (table: readonly number[]) => table.filter((blockId) => blockId !== NO_BLOCK).length;

test('a sliding group holds only its window as a sequence decodes; the full group holds every block', () => {
  const kv = new KvCacheManager(32, BLOCK_SIZE, HYBRID);
  const sequence = sequenceOf(Array.from({ length: 12 }, (_, i) => i));
  assert.ok(step(kv, sequence, 12));
  for (let position = 12; position < 64; position++) {
    sequence.tokenIds.push(1000 + position);
    assert.ok(step(kv, sequence, 1));
    const [full, sliding] = sequence.blockTables;
    assert.equal(held(full), Math.ceil((position + 1) / BLOCK_SIZE), `position ${position}: the full group holds every block`);
    // Blocks are freed when the sequence next allocates: the token just computed read back to
    // position + 1 - WINDOW, at most 3 blocks.
    assert.ok(held(sliding) <= Math.ceil(WINDOW / BLOCK_SIZE) + 1, `position ${position}: the sliding group holds ${held(sliding)} blocks`);
    const firstNeeded = Math.floor(Math.max(0, position - WINDOW + 1) / BLOCK_SIZE);
    sliding.forEach((blockId, block) => assert.equal(blockId === NO_BLOCK, block < firstNeeded, `position ${position}: block ${block} is ${blockId}`));
  }
  assert.equal(kv.numFreeBlocks, 32 - held(sequence.blockTables[0]) - held(sequence.blockTables[1]), 'freed sliding blocks are back in the pool');
  assert.equal(held(sequence.blockTables[1]), 2, 'positions 58..63: two blocks');
  kv.free(sequence);
  assert.equal(kv.numFreeBlocks, 32);
  // A 64-token sequence needs 16 + 3 blocks at most with 1-token steps, 16 + 5 with 8-token chunks.
  assert.equal(kv.maxBlocksFor(64, 1), 16 + 3);
  assert.equal(kv.maxBlocksFor(64, 8), 16 + 5);
});

/**
 * A finished 21-token sequence in a pool of 11 blocks: 20 tokens in one step (5 blocks in each
 * group), then one more, whose step freed the sliding group's first three blocks (out of its
 * window) and reused the first of them at once. The free queue is then: the two unhashed partial
 * blocks, sliding blocks 1 and 0, the full group's blocks 4 to 0, sliding blocks 4 and 3.
 */
function finishedSequence(kv: KvCacheManager): KvSequence & { tokenIds: number[] } {
  const sequence = sequenceOf(Array.from({ length: 20 }, (_, i) => 10 + i));
  assert.ok(step(kv, sequence, 20));
  sequence.tokenIds.push(99);
  assert.ok(step(kv, sequence, 1));
  assert.deepEqual(sequence.blockTables[1].slice(0, 3), [NO_BLOCK, NO_BLOCK, NO_BLOCK]);
  kv.free(sequence);
  return sequence;
}

test('a prefix hit needs only the blocks a window reaches: early sliding blocks may be evicted', () => {
  const kv = new KvCacheManager(11, BLOCK_SIZE, HYBRID);
  const first = finishedSequence(kv);
  // Two blocks per group: the unhashed ones, then sliding blocks 1 and 0.
  const filler = sequenceOf(Array.from({ length: 9 }, (_, i) => 500 + i));
  assert.ok(kv.allocateSlots(filler, 5));
  for (let block = 0; block < 3; block++) assert.equal(kv.cachedBlock(first.blockHashes[block], 1), undefined, `sliding block ${block} evicted`);
  for (let block = 0; block < 5; block++) assert.notEqual(kv.cachedBlock(first.blockHashes[block], 0), undefined, `full block ${block} cached`);
  // 24 tokens: 5 full blocks may be cached (the last token is computed). The first computed
  // token, at 20, reads 15..19: sliding blocks 3 and 4, both cached.
  const second = sequenceOf([...first.tokenIds.slice(0, 20), 1, 2, 3, 4]);
  const prefix = kv.findCachedPrefix(second);
  assert.equal(prefix.numBlocks, 5);
  assert.deepEqual(prefix.blockTables[0], first.blockHashes.slice(0, 5).map((hash) => kv.cachedBlock(hash, 0)));
  assert.deepEqual(prefix.blockTables[1], [NO_BLOCK, NO_BLOCK, NO_BLOCK, kv.cachedBlock(first.blockHashes[3], 1), kv.cachedBlock(first.blockHashes[4], 1)]);
  kv.free(filler);
  assert.ok(step(kv, second, 4));
  assert.equal(second.numComputedTokens, 24);
});

test('a hole inside the window rules out every length whose first token would read it', () => {
  const kv = new KvCacheManager(11, BLOCK_SIZE, HYBRID);
  const first = finishedSequence(kv);
  // Three blocks per group: the unhashed ones, sliding blocks 1 and 0, full blocks 4 and 3.
  const filler = sequenceOf(Array.from({ length: 12 }, (_, i) => 500 + i));
  assert.ok(kv.allocateSlots(filler, 9));
  for (const block of [3, 4]) assert.equal(kv.cachedBlock(first.blockHashes[block], 0), undefined);
  for (const block of [0, 1, 2]) assert.notEqual(kv.cachedBlock(first.blockHashes[block], 0), undefined);
  for (const block of [3, 4]) assert.notEqual(kv.cachedBlock(first.blockHashes[block], 1), undefined);
  // The full group caps the hit at 3 blocks; at 3 the first computed token (12) reads 7..11,
  // sliding blocks 1 and 2, all gone, as are the blocks shorter hits read. No hit at all, though
  // the full group alone would give 3 blocks.
  const second = sequenceOf([...first.tokenIds.slice(0, 20), 1, 2, 3, 4]);
  assert.equal(kv.findCachedPrefix(second).numBlocks, 0);
});

test('a window shorter than a block: the hit reads only the last block before it', () => {
  const kv = new KvCacheManager(16, BLOCK_SIZE, [{ slidingWindowTokens: 2 }]);
  const first = sequenceOf(Array.from({ length: 16 }, (_, i) => 40 + i));
  assert.ok(step(kv, first, 16));
  kv.free(first);
  const second = sequenceOf([...first.tokenIds, 7]);
  const prefix = kv.findCachedPrefix(second);
  assert.equal(prefix.numBlocks, 4);
  assert.deepEqual(prefix.blockTables[0].map((blockId) => blockId !== NO_BLOCK), [false, false, false, true]);
});
