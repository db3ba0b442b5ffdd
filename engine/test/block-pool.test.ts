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

test('freed blocks are reused after the blocks that were free longer', () => {
  const pool = new BlockPool(4);
  const first: number[] = [];
  pool.allocate(2, first);
  pool.free(first);
  const next: number[] = [];
  pool.allocate(4, next);
  assert.deepEqual(next, [2, 3, ...first]);
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
