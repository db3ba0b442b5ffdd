// The exact prefix index: what each worker holds, from synthetic KV events with the engine's hashes.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BLOCK_HASH_WORDS, blockHashWords } from '../../engine/kv/block-hash.ts';
import type { KvEvent } from '../../engine/types.ts';
import { createRng } from '../../loadtest/random.ts';
import { testSeed } from '../../test/seed.ts';
import { PrefixIndex } from '../prefix-index.ts';
import { hashesOf, prompt } from './synthetic-worker.ts';

test('a worker matches the run of leading blocks it holds, nothing after its first miss', () => {
  const index = new PrefixIndex();
  const hashes = hashesOf(prompt(40), 10);
  index.apply(0, [{ kind: 'stored', blockHashes: hashes.slice(0, 6) }]);
  index.apply(1, [{ kind: 'stored', blockHashes: hashes.slice(0, 2) }]);
  // Worker 2 holds later blocks but not the first: no prefix of this prompt.
  index.apply(2, [{ kind: 'stored', blockHashes: hashes.slice(1, 10) }]);
  const matched = new Int32Array(4);
  assert.equal(index.match(hashes, matched), 6);
  assert.deepEqual([...matched], [6, 2, 0, 0]);
  assert.equal(index.numBlocks, 10, 'a block held by several workers counts once');
  assert.deepEqual([0, 1, 2, 3].map((slot) => index.numBlocksOf(slot)), [6, 2, 9, 0]);
});

test('a removed block ends the match at its place; stored again, it counts again', () => {
  const index = new PrefixIndex();
  const hashes = hashesOf(prompt(32), 8);
  index.apply(0, [{ kind: 'stored', blockHashes: hashes }, { kind: 'removed', blockHashes: [hashes[3]] }]);
  const matched = new Int32Array(1);
  assert.equal(index.match(hashes, matched), 3);
  index.apply(0, [{ kind: 'stored', blockHashes: [hashes[3]] }]);
  assert.equal(index.match(hashes, matched), 8);
  // Events are idempotent: storing a held block or removing an absent one changes nothing.
  index.apply(0, [{ kind: 'stored', blockHashes: [hashes[0]] }, { kind: 'removed', blockHashes: hashesOf(prompt(4, 9), 1) }]);
  assert.equal(index.numBlocksOf(0), 8);
});

test('cleared and clear forget one worker only; a shared block stays with its other holders', () => {
  const index = new PrefixIndex();
  const hashes = hashesOf(prompt(16), 4);
  index.apply(0, [{ kind: 'stored', blockHashes: hashes }]);
  index.apply(1, [{ kind: 'stored', blockHashes: hashes.slice(0, 2) }]);
  index.apply(0, [{ kind: 'cleared' }, { kind: 'stored', blockHashes: [hashes[0]] }]);
  const matched = new Int32Array(2);
  index.match(hashes, matched);
  assert.deepEqual([...matched], [1, 2]);
  index.clear(1);
  index.match(hashes, matched);
  assert.deepEqual([...matched], [1, 0]);
  assert.equal(index.numBlocks, 1);
  index.clear(0);
  assert.equal(index.numBlocks, 0);
  assert.equal(index.match(hashes, matched), 0);
});

test('slots beyond the lookup array are left out, and an empty prompt matches nothing', () => {
  const index = new PrefixIndex();
  const hashes = hashesOf(prompt(8), 2);
  index.apply(5, [{ kind: 'stored', blockHashes: hashes }]);
  const matched = new Int32Array(2).fill(7);
  assert.equal(index.match(hashes, matched), 0);
  assert.deepEqual([...matched], [0, 0]);
  assert.equal(index.match([], new Int32Array(8)), 0);
});

/** The obviously correct index: a set of holders per hash, a set of hashes per slot, a walk per slot. */
class ReferenceIndex {
  private readonly holders = new Map<string, Set<number>>();
  private readonly blocksBySlot = new Map<number, Set<string>>();

  get numBlocks(): number {
    return this.holders.size;
  }

  numBlocksOf(slot: number): number {
    return this.blocksBySlot.get(slot)?.size ?? 0;
  }

  apply(slot: number, events: readonly KvEvent[]): void {
    const blocks = this.blocksBySlot.get(slot) ?? new Set<string>();
    this.blocksBySlot.set(slot, blocks);
    for (const event of events) {
      const hashes = event.kind === 'cleared' ? [...blocks] : event.blockHashes;
      for (const hash of hashes) {
        if (event.kind === 'stored') {
          blocks.add(hash);
          this.holders.set(hash, (this.holders.get(hash) ?? new Set()).add(slot));
        } else if (blocks.delete(hash)) {
          const slots = this.holders.get(hash)!;
          slots.delete(slot);
          if (slots.size === 0) this.holders.delete(hash);
        }
      }
    }
  }

  match(hashes: readonly string[], numSlots: number): number[] {
    return Array.from({ length: numSlots }, (_, slot) => {
      let numMatched = 0;
      while (numMatched < hashes.length && this.holders.get(hashes[numMatched])?.has(slot)) numMatched++;
      return numMatched;
    });
  }
}

/** A random 128-bit name; with a prefix, one whose first 64 bits are the prefix's (so it shares a bucket with its kind). */
function randomHash(random: () => number, prefix = ''): string {
  let hex = prefix;
  while (hex.length < 32) hex += Math.floor(random() * 16).toString(16);
  return hex;
}

test('random events on up to 100 slots: the table agrees with a reference map through growth, deletes and clears', (t) => {
  const random = createRng(testSeed(t));
  const index = new PrefixIndex({ bucketSeed: Math.floor(random() * 2 ** 32) });
  const reference = new ReferenceIndex();
  // Chains (prompts, with shared starts) to match, and groups of names alike in their first 64
  // bits: each group lands in one bucket, so probe runs grow long, wrap and close up on deletes.
  const chains = Array.from({ length: 12 }, (_, i) => hashesOf(prompt(4 * 60, i % 4 === 0 ? 0 : i), 60));
  const collidingPrefixes = Array.from({ length: 40 }, () => randomHash(random).slice(0, 16));
  const pool = [...chains.flat(), ...Array.from({ length: 1500 }, (_, i) => randomHash(random, i % 2 === 0 ? collidingPrefixes[i % 40] : ''))];
  const pick = () => pool[Math.floor(random() * pool.length)];
  let numSlots = 8;
  let maxBlocks = 0;
  for (let step = 0; step < 3000; step++) {
    // Slots open up as the run goes on (the masks widen past 32 and 64), and come back after clears.
    if (step % 300 === 299) numSlots = Math.min(100, numSlots + 23);
    const slot = Math.floor(random() * numSlots);
    const events: KvEvent[] = [];
    const draw = random();
    if (draw < 0.03) events.push({ kind: 'cleared' });
    else if (draw < 0.55) {
      const chain = chains[Math.floor(random() * chains.length)];
      events.push({ kind: 'stored', blockHashes: random() < 0.5 ? chain.slice(0, Math.floor(random() * 61)) : Array.from({ length: 1 + Math.floor(random() * 40) }, pick) });
    } else events.push({ kind: 'removed', blockHashes: Array.from({ length: 1 + Math.floor(random() * 40) }, pick) });
    if (random() < 0.2) events.push({ kind: 'stored', blockHashes: Array.from({ length: 1 + Math.floor(random() * 10) }, pick) });
    // Sometimes the router's own clear instead of a cleared event.
    if (draw > 0.995) index.clear(slot);
    else index.apply(slot, events);
    reference.apply(slot, draw > 0.995 ? [{ kind: 'cleared' }] : events);
    maxBlocks = Math.max(maxBlocks, reference.numBlocks);

    assert.equal(index.numBlocks, reference.numBlocks, `step ${step}: distinct blocks`);
    assert.equal(index.numBlocksOf(slot), reference.numBlocksOf(slot), `step ${step}: blocks of slot ${slot}`);
    if (step % 10 === 0) {
      for (let s = 0; s < 100; s++) assert.equal(index.numBlocksOf(s), reference.numBlocksOf(s), `step ${step}: blocks of slot ${s}`);
      const lookupSlots = 1 + Math.floor(random() * 110);
      const matched = new Int32Array(lookupSlots);
      // Every name in the pool is found exactly when held.
      if (step % 50 === 0) {
        for (const hash of pool) {
          index.match([hash], matched);
          assert.deepEqual([...matched], reference.match([hash], lookupSlots), `step ${step}: holders of ${hash}`);
        }
      }
      for (const chain of chains) {
        const expected = reference.match(chain, lookupSlots);
        assert.equal(index.match(chain, matched), Math.max(0, ...expected), `step ${step}: most matched`);
        assert.deepEqual([...matched], expected, `step ${step}: prefix per slot`);
      }
    }
  }
  assert.ok(maxBlocks > 1024, `the table grew past its first size (${maxBlocks} blocks at most)`);
});

test('a walk in runs (as the router hashes a prompt) ends where one walk over the whole prompt ends', (t) => {
  const random = createRng(testSeed(t));
  const index = new PrefixIndex();
  const chain = hashesOf(prompt(4 * 200), 200);
  const words = new Uint32Array(200 * BLOCK_HASH_WORDS);
  chain.forEach((hash, block) => blockHashWords(hash, words, block * BLOCK_HASH_WORDS));
  for (let slot = 0; slot < 70; slot++) index.apply(slot, [{ kind: 'stored', blockHashes: chain.slice(0, Math.floor(random() * 201)) }]);
  // A hole in a slot's chain: its prefix ends there even though later blocks are held.
  index.apply(3, [{ kind: 'stored', blockHashes: chain }, { kind: 'removed', blockHashes: [chain[77]] }]);
  const whole = new Int32Array(70);
  index.match(chain, whole);
  assert.equal(whole[3], 77);
  for (let trial = 0; trial < 50; trial++) {
    const matched = new Int32Array(70);
    for (let firstBlock = 0; firstBlock < 200;) {
      const numBlocks = Math.min(200 - firstBlock, 1 + Math.floor(random() * 50));
      const more = index.matchRun(words.subarray(firstBlock * BLOCK_HASH_WORDS), firstBlock, numBlocks, matched);
      firstBlock += numBlocks;
      if (!more) break;
    }
    assert.deepEqual([...matched], [...whole], `trial ${trial}`);
  }
});

test('malformed names in events are skipped; they name no block', () => {
  const index = new PrefixIndex();
  const hashes = hashesOf(prompt(8), 2);
  index.apply(0, [{ kind: 'stored', blockHashes: ['not-a-hash', hashes[0], hashes[1].toUpperCase(), hashes[1]] }]);
  assert.equal(index.numBlocksOf(0), 2);
  assert.equal(index.match(hashes, new Int32Array(1)), 2);
});

test('names alike in their first 64 bits share a bucket: their probe run wraps the table\'s end and closes up on deletes', (t) => {
  const random = createRng(testSeed(t));
  const index = new PrefixIndex({ bucketSeed: Math.floor(random() * 2 ** 32) });
  const matched = new Int32Array(2);
  // 600 names from 16 home buckets fill more than half of the first table (1,024 buckets) in
  // runs that merge, so over 20 rounds a run crosses the end with names of several homes on
  // either side (all but certainly); slot 1 holds some of them too.
  for (let round = 0; round < 20; round++) {
    const prefixes = Array.from({ length: 16 }, () => randomHash(random).slice(0, 16));
    const names = Array.from({ length: 600 }, (_, i) => randomHash(random, prefixes[i % 16]));
    index.apply(0, [{ kind: 'stored', blockHashes: names }]);
    index.apply(1, [{ kind: 'stored', blockHashes: names.filter((_, i) => i % 3 === 0) }]);
    const held = new Set(names);
    for (let i = names.length - 1; i > 0; i--) {
      const j = Math.floor(random() * (i + 1));
      [names[i], names[j]] = [names[j], names[i]];
    }
    for (const [position, name] of names.entries()) {
      index.apply(0, [{ kind: 'removed', blockHashes: [name] }]);
      held.delete(name);
      if (position % 40 !== 0) continue;
      for (const other of names) {
        index.match([other], matched);
        assert.equal(matched[0], held.has(other) ? 1 : 0, `round ${round}, after ${position + 1} deletes: ${other} on slot 0`);
      }
    }
    assert.equal(index.numBlocksOf(0), 0);
    assert.equal(index.numBlocks, 200, 'slot 1 keeps its share');
    index.clear(1);
    assert.equal(index.numBlocks, 0);
  }
});
