// The exact prefix index: what each worker holds, from synthetic KV events with the engine's hashes.
import { test } from 'node:test';
import assert from 'node:assert/strict';
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
