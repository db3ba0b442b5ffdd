import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BlockPool } from '../kv/block-pool.ts';

test('allocate appends distinct blocks and counts them out of the pool', () => {
  const pool = new BlockPool(4);
  const blockIds: number[] = [];
  assert.equal(pool.allocate(3, blockIds), true);
  assert.equal(new Set(blockIds).size, 3);
  assert.equal(pool.numFreeBlocks, 1);
});

test('an allocation that does not fit changes nothing', () => {
  const pool = new BlockPool(4);
  const blockIds = [99];
  assert.equal(pool.allocate(5, blockIds), false);
  assert.deepEqual(blockIds, [99]);
  assert.equal(pool.numFreeBlocks, 4);
});

test('a freed block without a hash is reused first, a cached one last, the tail of a sequence before its head', () => {
  const pool = new BlockPool(6);
  const cachedSequence: number[] = [];
  pool.allocate(3, cachedSequence);
  cachedSequence.forEach((blockId, i) => pool.cache(blockId, `hash${i}`));
  const plain: number[] = [];
  pool.allocate(2, plain);
  pool.free(cachedSequence);
  pool.free(plain);
  const next: number[] = [];
  pool.allocate(6, next);
  // The unhashed ones at the head, then the never-used block, then the cached ones, tail to head.
  assert.deepEqual(next, [plain[0], plain[1], 5, cachedSequence[2], cachedSequence[1], cachedSequence[0]]);
});

test('reusing a cached block evicts it, and the cache says so in events', () => {
  const pool = new BlockPool(2);
  const blockIds: number[] = [];
  pool.allocate(2, blockIds);
  assert.equal(pool.cache(blockIds[0], 'a'), true);
  assert.equal(pool.cache(blockIds[1], 'a'), false, 'a second block for the same hash stays unnamed');
  assert.equal(pool.cache(blockIds[1], 'b'), true);
  assert.equal(pool.cachedBlock('a'), blockIds[0]);
  pool.free(blockIds);
  assert.equal(pool.numCachedBlocks, 2);
  const reused: number[] = [];
  pool.allocate(1, reused);
  assert.equal(reused[0], blockIds[1], 'the tail goes first');
  assert.equal(pool.cachedBlock('b'), undefined);
  assert.deepEqual(pool.takeEvents(), [
    { kind: 'stored', blockHashes: ['a', 'b'] },
    { kind: 'removed', blockHashes: ['b'] },
  ]);
  assert.deepEqual(pool.takeEvents(), []);
});

test('touching a cached free block takes it out of the free queue; the last holder returns it', () => {
  const pool = new BlockPool(3);
  const first: number[] = [];
  pool.allocate(1, first);
  pool.cache(first[0], 'x');
  pool.free(first);
  assert.equal(pool.numFreeBlocks, 3);
  pool.touch(first);
  pool.touch(first);
  assert.equal(pool.numFreeBlocks, 2);
  assert.equal(pool.refCountOf(first[0]), 2);
  pool.free(first);
  assert.equal(pool.numFreeBlocks, 2);
  pool.free(first);
  assert.equal(pool.numFreeBlocks, 3);
  assert.equal(pool.cachedBlock('x'), first[0]);
});

test('freeing a block twice is a bug caught at once', () => {
  const pool = new BlockPool(2);
  const blockIds: number[] = [];
  pool.allocate(1, blockIds);
  pool.free(blockIds);
  assert.throws(() => pool.free(blockIds), /freed twice/);
  assert.equal(pool.numFreeBlocks, 2);
});

test('a pool needs at least one block', () => {
  assert.throws(() => new BlockPool(0), /positive integer for numTotalBlocks/);
});
