// The numeric form of a block hash (the router's index keys): the same 128 bits as the hex name
// the engine's events carry, whether read off the native hasher or parsed from hex.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { appendBlockHashes, BLOCK_HASH_WORDS, blockHashWords, chainBlockHashWords, rootHash } from '../kv/block-hash.ts';
import { createRng } from '../../loadtest/random.ts';
import { testSeed } from '../../test/seed.ts';

function wordsOf(hash: string): number[] {
  const words = new Uint32Array(BLOCK_HASH_WORDS);
  assert.ok(blockHashWords(hash, words, 0), `${hash} parses`);
  return [...words];
}

test('a hash\'s words are its bytes as little-endian 32-bit words', () => {
  assert.deepEqual(wordsOf('0123456789abcdef00ff7f80feffffff'), [0x67452301, 0xefcdab89, 0x807fff00, 0xfffffffe]);
  // The pinned root of conduit-tiny (engine/test/kv-cache-manager.test.ts).
  assert.deepEqual(wordsOf(rootHash({ model: 'conduit-tiny' })), [0x398d66fe, 0xfd8a522c, 0xe418395b, 0xd7e23b46]);
});

test('a name that is not 32 lowercase hex digits has no words: no block is named so', () => {
  const words = new Uint32Array(BLOCK_HASH_WORDS);
  for (const bad of ['', 'abc', '0123456789abcdef0123456789abcde', '0123456789abcdef0123456789abcdef0', '0123456789ABCDEF0123456789abcdef', 'g123456789abcdef0123456789abcdef', '0123456789abcdef0123456789abcde-']) {
    assert.equal(blockHashWords(bad, words, 0), false, `'${bad}'`);
  }
});

test('the native chain in words equals the hex chain parsed, run after run, on random tokens', (t) => {
  const random = createRng(testSeed(t));
  for (let trial = 0; trial < 40; trial++) {
    const blockSizeTokens = 1 + Math.floor(random() * 32);
    const numBlocks = 1 + Math.floor(random() * 300);
    const tokenIds = Array.from({ length: numBlocks * blockSizeTokens }, () => Math.floor(random() * 2 ** 31) * (random() < 0.5 ? -1 : 1));
    const root = rootHash({ model: `m${trial}`, cacheSalt: trial % 2 === 0 ? undefined : `salt${trial}` });
    const hex = appendBlockHashes([], root, tokenIds, 0, numBlocks, blockSizeTokens);
    // In runs of random length, each run's parent the last hash of the one before: as the router walks.
    let parent: Uint32Array = new Uint32Array(wordsOf(root));
    let parentOffset = 0;
    for (let firstBlock = 0; firstBlock < numBlocks;) {
      const numRunBlocks = Math.min(numBlocks - firstBlock, 1 + Math.floor(random() * 70));
      const words = chainBlockHashWords(parent, parentOffset, tokenIds, firstBlock, numRunBlocks, blockSizeTokens);
      for (let block = 0; block < numRunBlocks; block++) {
        const at = block * BLOCK_HASH_WORDS;
        assert.deepEqual([...words.subarray(at, at + BLOCK_HASH_WORDS)], wordsOf(hex[firstBlock + block]), `trial ${trial}, block ${firstBlock + block}`);
      }
      parent = words;
      parentOffset = (numRunBlocks - 1) * BLOCK_HASH_WORDS;
      firstBlock += numRunBlocks;
    }
  }
});
