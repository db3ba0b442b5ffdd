// The KV manager: prefix hits, sharing by reference count, eviction, failed steps, and a
// property test over thousands of random operations against a simulated cache that checks what
// every block holds.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { appendBlockHashes, extendBlockHashes, rootHash, type BlockHash } from '../kv/block-hash.ts';
import { KvCacheManager, type KvSequence } from '../kv/kv-cache-manager.ts';
import { testSeed } from '../../test/seed.ts';

const BLOCK_SIZE = 4;

type TestSequence = KvSequence & { tokenIds: number[] };

function sequenceOf(tokenIds: number[], cacheSalt?: string): TestSequence {
  return { tokenIds, numComputedTokens: 0, blockTables: [[]], cacheRoot: rootHash({ model: 'm', cacheSalt }), blockHashes: [] };
}

/** Admits a sequence after its cached prefix and computes `numTokens` of it (default all but none left). */
function admit(kv: KvCacheManager, sequence: KvSequence, numNewTokens?: number): boolean {
  const prefix = kv.findCachedPrefix(sequence);
  const numToCompute = sequence.tokenIds.length - prefix.numBlocks * BLOCK_SIZE;
  const numTokens = numNewTokens ?? numToCompute;
  if (!kv.allocateSlots(sequence, numTokens, prefix)) return false;
  kv.cacheScheduledBlocks(sequence, sequence.numComputedTokens + numTokens);
  kv.commitStep();
  sequence.numComputedTokens += numTokens;
  return true;
}

/** The layout written out, one node:crypto SHA-256 per block: what the native chain must equal. */
function referenceBlockHash(parent: BlockHash, tokenIds: readonly number[], start: number, blockSizeTokens: number): BlockHash {
  const bytes = Buffer.alloc(16 + 4 * blockSizeTokens);
  bytes.write(parent, 0, 16, 'hex');
  for (let i = 0; i < blockSizeTokens; i++) bytes.writeInt32LE(tokenIds[start + i], 16 + 4 * i);
  return createHash('sha256').update(bytes).digest('hex').slice(0, 32);
}

function blockHash(parent: BlockHash, tokenIds: readonly number[], start: number, blockSizeTokens: number): BlockHash {
  return appendBlockHashes([], parent, tokenIds, start / blockSizeTokens, 1, blockSizeTokens)[0];
}

test('the native chain of block hashes equals node:crypto SHA-256 over the layout, on random tokens', (t) => {
  const seed = testSeed(t);
  const random = rng(seed);
  for (let trial = 0; trial < 50; trial++) {
    const blockSizeTokens = 1 + Math.floor(random() * 64);
    const numBlocks = Math.floor(random() * 40);
    const firstBlock = Math.floor(random() * 4);
    const tokenIds = Array.from({ length: (firstBlock + numBlocks) * blockSizeTokens }, () => Math.floor(random() * 2 ** 31) * (random() < 0.5 ? -1 : 1));
    const parent = rootHash({ model: `m${trial}` });
    const expected: BlockHash[] = [];
    for (let block = firstBlock, previous = parent; block < firstBlock + numBlocks; block++) {
      previous = referenceBlockHash(previous, tokenIds, block * blockSizeTokens, blockSizeTokens);
      expected.push(previous);
    }
    assert.deepEqual(appendBlockHashes(['kept'], parent, tokenIds, firstBlock, numBlocks, blockSizeTokens), ['kept', ...expected]);
  }
});

test('block hashes chain: the same block after a different prefix, model or salt hashes differently', () => {
  const root = rootHash({ model: 'm' });
  const tokens = [1, 2, 3, 4, 5, 6, 7, 8];
  const first = blockHash(root, tokens, 0, 4);
  assert.match(first, /^[0-9a-f]{32}$/);
  assert.equal(blockHash(root, tokens, 0, 4), first, 'deterministic');
  assert.notEqual(blockHash(first, tokens, 4, 4), blockHash(blockHash(root, [9, 2, 3, 4], 0, 4), tokens, 4, 4));
  assert.notEqual(rootHash({ model: 'm' }), rootHash({ model: 'n' }));
  assert.notEqual(rootHash({ model: 'm' }), rootHash({ model: 'm', cacheSalt: 'tenant' }));
  // Length-prefixed parts: moving a character between model and salt changes the root.
  assert.notEqual(rootHash({ model: 'ab', cacheSalt: 'c' }), rootHash({ model: 'a', cacheSalt: 'bc' }));
});

test('a second sequence reuses the full prompt blocks of the first and computes only the rest', () => {
  const kv = new KvCacheManager(16, BLOCK_SIZE);
  const first = sequenceOf([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
  assert.ok(admit(kv, first));
  const second = sequenceOf([1, 2, 3, 4, 5, 6, 7, 8, 42]);
  assert.ok(admit(kv, second));
  assert.deepEqual(second.blockTables[0].slice(0, 2), first.blockTables[0].slice(0, 2));
  assert.equal(kv.refCountOf(first.blockTables[0][0]), 2);
  assert.equal(kv.refCountOf(first.blockTables[0][2]), 1, 'the partial block is not shared');
  // Before admit() computed 1 token, the prefix covered 8 of 9.
  assert.equal(second.numComputedTokens, 9);
});

test('a prompt entirely in the cache still computes its last token', () => {
  const kv = new KvCacheManager(16, BLOCK_SIZE);
  const tokens = [1, 2, 3, 4, 5, 6, 7, 8];
  assert.ok(admit(kv, sequenceOf(tokens)));
  const again = sequenceOf(tokens);
  const prefix = kv.findCachedPrefix(again);
  assert.equal(prefix.numBlocks, 1, 'the block holding the last token is recomputed');
});

test('a cache salt isolates tenants', () => {
  const kv = new KvCacheManager(16, BLOCK_SIZE);
  assert.ok(admit(kv, sequenceOf([1, 2, 3, 4, 5], 'a')));
  assert.equal(kv.findCachedPrefix(sequenceOf([1, 2, 3, 4, 5], 'b')).numBlocks, 0);
  assert.equal(kv.findCachedPrefix(sequenceOf([1, 2, 3, 4, 5])).numBlocks, 0);
  assert.equal(kv.findCachedPrefix(sequenceOf([1, 2, 3, 4, 5], 'a')).numBlocks, 1);
});

test('freed blocks stay cached until reused; the least recently freed go first', () => {
  const kv = new KvCacheManager(4, BLOCK_SIZE);
  const old = sequenceOf([1, 2, 3, 4, 5]);
  const recent = sequenceOf([6, 7, 8, 9, 10]);
  assert.ok(admit(kv, old));
  assert.ok(admit(kv, recent));
  kv.free(old);
  kv.free(recent);
  assert.equal(kv.numFreeBlocks, 4);
  assert.equal(kv.numCachedBlocks, 2);
  // Two blocks: the unhashed partial blocks go first, so both prefixes survive.
  const filler = sequenceOf([11, 12, 13]);
  assert.ok(admit(kv, filler));
  assert.equal(kv.findCachedPrefix(sequenceOf([1, 2, 3, 4, 0])).numBlocks, 1);
  // Two more blocks: the free unhashed one, then the least recently freed cached one.
  const big = sequenceOf(Array.from({ length: 12 }, (_, i) => 100 + i));
  assert.ok(admit(kv, big, 5));
  assert.equal(kv.findCachedPrefix(sequenceOf([1, 2, 3, 4, 0])).numBlocks, 0);
  assert.equal(kv.findCachedPrefix(sequenceOf([6, 7, 8, 9, 0])).numBlocks, 1);
  const [oldHash, recentHash] = [old.blockHashes[0], recent.blockHashes[0]];
  assert.deepEqual(kv.takeEvents(), [
    { kind: 'stored', blockHashes: [oldHash, recentHash] },
    { kind: 'removed', blockHashes: [oldHash] },
    { kind: 'stored', blockHashes: [big.blockHashes[0]] },
  ]);
});

test('a failed step forgets the blocks it named; earlier blocks stay cached', () => {
  const kv = new KvCacheManager(8, BLOCK_SIZE);
  const sequence = sequenceOf([1, 2, 3, 4, 5, 6, 7, 8, 9]);
  assert.ok(admit(kv, sequence, 4));
  assert.ok(kv.allocateSlots(sequence, 4));
  kv.cacheScheduledBlocks(sequence, 8);
  kv.forgetStep();
  kv.free(sequence);
  const again = sequenceOf([1, 2, 3, 4, 5, 6, 7, 8, 9]);
  assert.equal(kv.findCachedPrefix(again).numBlocks, 1);
});

test('allocation counts free cached prefix blocks it takes and changes nothing when short', () => {
  const kv = new KvCacheManager(3, BLOCK_SIZE);
  const first = sequenceOf([1, 2, 3, 4, 5, 6, 7, 8, 9]);
  assert.ok(admit(kv, first));
  kv.free(first);
  // 3 free blocks, 2 of them cached prefix blocks of the newcomer: it needs 2 more for 8 tokens.
  const newcomer = sequenceOf([1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0, 0]);
  const prefix = kv.findCachedPrefix(newcomer);
  assert.equal(prefix.numBlocks, 2);
  assert.equal(kv.allocateSlots(newcomer, 8, prefix), false);
  assert.deepEqual(newcomer.blockTables[0], []);
  assert.equal(kv.numFreeBlocks, 3);
  assert.equal(kv.allocateSlots(newcomer, 4, prefix), true);
  assert.equal(kv.numFreeBlocks, 0);
});

/** Tiny deterministic PRNG, so a failing seed replays. */
function rng(seed: number): () => number {
  let state = seed >>> 0 || 1;
  return () => {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    return (state >>> 0) / 2 ** 32;
  };
}

test('10,000 random operations keep every block free or held, held blocks counted exactly, and cached KV right', (t) => {
  const seed = testSeed(t);
  const random = rng(seed);
  const pick = <T>(items: readonly T[]): T => items[Math.floor(random() * items.length)];
  const numBlocks = 24;
  const kv = new KvCacheManager(numBlocks, BLOCK_SIZE);
  /** What each slot holds: the token id whose KV a step computed into it. */
  const slots = new Int32Array(numBlocks * BLOCK_SIZE).fill(-1);
  /** The token ids a hash names, recorded when a block is cached under it. */
  const contents = new Map<BlockHash, number[]>();
  const prefixes = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9], [7, 7, 7, 7, 7]];
  const live: TestSequence[] = [];
  const label = () => `seed ${seed}`;

  const write = (sequence: KvSequence, from: number, to: number) => {
    for (let position = from; position < to; position++) {
      slots[sequence.blockTables[0][Math.floor(position / BLOCK_SIZE)] * BLOCK_SIZE + (position % BLOCK_SIZE)] = sequence.tokenIds[position];
    }
  };
  const schedule = (sequence: KvSequence, numNewTokens: number, fails: boolean): void => {
    const from = sequence.numComputedTokens;
    kv.cacheScheduledBlocks(sequence, from + numNewTokens);
    for (let block = Math.floor(from / BLOCK_SIZE); block < Math.floor((from + numNewTokens) / BLOCK_SIZE); block++) {
      const hash = sequence.blockHashes[block];
      if (kv.cachedBlock(hash) === sequence.blockTables[0][block]) contents.set(hash, sequence.tokenIds.slice(block * BLOCK_SIZE, (block + 1) * BLOCK_SIZE));
    }
    if (fails) {
      kv.forgetStep();
      return;
    }
    write(sequence, from, from + numNewTokens);
    kv.commitStep();
    sequence.numComputedTokens += numNewTokens;
  };
  const release = (sequence: TestSequence) => {
    kv.free(sequence);
    live.splice(live.indexOf(sequence), 1);
  };

  for (let operation = 0; operation < 10_000; operation++) {
    const choice = random();
    if (choice < 0.3 || live.length === 0) {
      const tokenIds = [...pick(prefixes), ...Array.from({ length: Math.floor(random() * 10) }, () => Math.floor(random() * 5))];
      const sequence = sequenceOf(tokenIds, random() < 0.2 ? 'salt' : undefined);
      const prefix = kv.findCachedPrefix(sequence);
      const numToCompute = tokenIds.length - prefix.numBlocks * BLOCK_SIZE;
      const numNewTokens = 1 + Math.floor(random() * numToCompute);
      if (kv.allocateSlots(sequence, numNewTokens, prefix)) {
        live.push(sequence);
        schedule(sequence, numNewTokens, false);
      }
    } else if (choice < 0.75) {
      const sequence = pick(live);
      if (sequence.numComputedTokens === sequence.tokenIds.length) {
        if (sequence.tokenIds.length >= 40) {
          release(sequence);
          continue;
        }
        sequence.tokenIds.push(Math.floor(random() * 5));  // a decode step's sampled token
      }
      const numNewTokens = 1 + Math.floor(random() * (sequence.tokenIds.length - sequence.numComputedTokens));
      if (!kv.allocateSlots(sequence, numNewTokens)) {
        // Preempt a random sequence by recompute: its blocks go back, cached ones stay cached.
        const victim = pick(live);
        kv.free(victim);
        victim.numComputedTokens = 0;
        live.splice(live.indexOf(victim), 1);
        continue;
      }
      const fails = random() < 0.02;
      schedule(sequence, numNewTokens, fails);
      if (fails) release(sequence);
    } else {
      release(pick(live));  // finished or aborted
    }

    // Every block is held exactly by the sequences whose tables list it, and no table lists a block twice.
    const holders = new Int32Array(numBlocks);
    for (const sequence of live) {
      assert.equal(new Set(sequence.blockTables[0]).size, sequence.blockTables[0].length, `${label()}: a table lists a block twice`);
      for (const blockId of sequence.blockTables[0]) holders[blockId]++;
    }
    let numFree = 0;
    for (let blockId = 0; blockId < numBlocks; blockId++) {
      assert.equal(kv.refCountOf(blockId), holders[blockId], `${label()}, operation ${operation}: block ${blockId}'s count`);
      if (holders[blockId] === 0) numFree++;
    }
    assert.equal(kv.numFreeBlocks, numFree, `${label()}: free count`);
    // A sequence reads its computed tokens back through its table, shared blocks included.
    for (const sequence of live) {
      for (let position = 0; position < sequence.numComputedTokens; position++) {
        const slot = sequence.blockTables[0][Math.floor(position / BLOCK_SIZE)] * BLOCK_SIZE + (position % BLOCK_SIZE);
        assert.equal(slots[slot], sequence.tokenIds[position], `${label()}, operation ${operation}: KV of a position`);
      }
    }
  }
  // Every cached hash names a block holding exactly the tokens it was cached for.
  for (const [hash, tokens] of contents) {
    const blockId = kv.cachedBlock(hash);
    if (blockId === undefined) continue;
    assert.deepEqual(Array.from(slots.subarray(blockId * BLOCK_SIZE, (blockId + 1) * BLOCK_SIZE)), tokens, `${label()}: cached block content`);
  }
  for (const sequence of [...live]) release(sequence);
  assert.equal(kv.numFreeBlocks, numBlocks, `${label()}: every block ends free`);
  for (let blockId = 0; blockId < numBlocks; blockId++) assert.equal(kv.refCountOf(blockId), 0);
});

test('block hashes are pinned: the same bytes in every process, version and language', () => {
  // Values of the reference layout (scheme, model and salt length-prefixed; parent bytes, then
  // int32 little-endian token ids; SHA-256 truncated to 128 bits). A change here is a new HASH_SCHEME.
  const root = rootHash({ model: 'conduit-tiny' });
  assert.equal(root, 'fe668d392c528afd5b3918e4463be2d7');
  const salted = rootHash({ model: 'conduit-tiny', cacheSalt: 'tenant-a' });
  assert.equal(salted, '9af245fcf03c5b967a0829d3776b5abe');
  const tokens = Array.from({ length: 48 }, (_, i) => (i * 7919) % 32000);
  assert.deepEqual(extendBlockHashes([], root, tokens, 16, 3), [
    'a641be64ba64c4578be04e39bcd9f583', 'f076e073d331af986d01079a929f14e2', '36c159306ed62cae5823a104d3b8ff4e',
  ]);
  assert.equal(blockHash(salted, [0, 1, 2, 3], 0, 4), '14417dedcb86cee80d7945f4be7c0cf0');
  // A block larger than the scratch buffer's first size.
  assert.equal(blockHash(root, Array.from({ length: 2048 }, (_, i) => i), 0, 1024), '65ee5aac2c8eb7e8f3ddcb2325cfba72');
});
