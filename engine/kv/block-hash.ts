// The one block hash: the worker's prefix cache and the router's index both name a full KV block
// by it, so a router can tell which worker holds a prompt's prefix from the worker's events.
//
// A full block's hash is H(parent block's hash, its token ids); the first block's parent is the
// root of its scope, H(scheme, model, cache salt), so the extra keys reach every block through
// the chain and two requests share a block only when everything before it is the same. H is
// SHA-256 over a fixed byte layout, truncated to 128 bits and written as 32 hex digits: the same
// in every process and language, and collision-free in practice. A change of the layout must
// change HASH_SCHEME, which both sides compare.
import { createHash } from 'node:crypto';
import { BLOCK_HASH_BYTES, chainBlockHashes } from '../../native/index.ts';

export type BlockHash = string;

export const HASH_SCHEME = 'conduit-kv-sha256-128-v1';

/** What besides the tokens decides whether two blocks may share KV. */
export interface HashScope {
  /** The served model's name: one model's KV means nothing to another. */
  model: string;
  /** A tenant's salt (OpenAI/vLLM `cache_salt`): only requests with the same salt share blocks. */
  cacheSalt?: string;
}

export function rootHash(scope: HashScope): BlockHash {
  const hasher = createHash('sha256');
  // Length-prefixed, so no two (model, salt) pairs write the same bytes.
  for (const part of [HASH_SCHEME, scope.model, scope.cacheSalt ?? '']) {
    const bytes = Buffer.from(part, 'utf8');
    const length = Buffer.alloc(4);
    length.writeUInt32LE(bytes.length);
    hasher.update(length).update(bytes);
  }
  return hasher.digest('hex').slice(0, 2 * BLOCK_HASH_BYTES);
}

// Hashing runs natively, a run of blocks per call, into scratch arrays reused across calls: the
// router hashes every prompt it routes, and a call per block through node:crypto cost about a
// microsecond a block (a Buffer and a hex string each).
let tokenScratch = new Int32Array(4096);
let hashScratch = new Uint8Array(BLOCK_HASH_BYTES * 256);
let hashScratchBytes = Buffer.from(hashScratch.buffer);
let hashScratchWords = new Uint32Array(hashScratch.buffer);
const parentScratch = Buffer.alloc(BLOCK_HASH_BYTES);

/** 32-bit words of one block hash in its numeric form (blockHashWords). */
export const BLOCK_HASH_WORDS = BLOCK_HASH_BYTES / 4;
/** Hex digits of one block hash. */
const HASH_HEX_DIGITS = 2 * BLOCK_HASH_BYTES;

/** Hashes blocks [firstBlock, firstBlock + numBlocks) of tokenIds into hashScratch, after parentScratch. */
function chainIntoScratch(tokenIds: ArrayLike<number>, firstBlock: number, numBlocks: number, blockSizeTokens: number): void {
  const numTokens = numBlocks * blockSizeTokens;
  if (tokenScratch.length < numTokens) tokenScratch = new Int32Array(Math.max(numTokens, 2 * tokenScratch.length));
  if (hashScratch.length < numBlocks * BLOCK_HASH_BYTES) {
    hashScratch = new Uint8Array(Math.max(numBlocks * BLOCK_HASH_BYTES, 2 * hashScratch.length));
    hashScratchBytes = Buffer.from(hashScratch.buffer);
    hashScratchWords = new Uint32Array(hashScratch.buffer);
  }
  const firstToken = firstBlock * blockSizeTokens;
  for (let i = 0; i < numTokens; i++) tokenScratch[i] = tokenIds[firstToken + i];
  chainBlockHashes(parentScratch, tokenScratch, blockSizeTokens, numBlocks, hashScratch);
}

/**
 * Appends to hashes the hashes of blocks [firstBlock, firstBlock + numBlocks) of tokenIds, the
 * first of which follows parent (the root for block 0), and returns hashes.
 */
export function appendBlockHashes(
  hashes: BlockHash[],
  parent: BlockHash,
  tokenIds: ArrayLike<number>,
  firstBlock: number,
  numBlocks: number,
  blockSizeTokens: number,
): BlockHash[] {
  parentScratch.write(parent, 0, BLOCK_HASH_BYTES, 'hex');
  chainIntoScratch(tokenIds, firstBlock, numBlocks, blockSizeTokens);
  // One hex string for the run, sliced per block: a toString per block costs more than its hash.
  const hex = hashScratchBytes.toString('hex', 0, numBlocks * BLOCK_HASH_BYTES);
  for (let block = 0; block < numBlocks; block++) hashes.push(hex.slice(HASH_HEX_DIGITS * block, HASH_HEX_DIGITS * (block + 1)));
  return hashes;
}

// The numeric form: a hash's 16 bytes as 4 little-endian 32-bit words (the native side asserts a
// little-endian machine, so a Uint32Array over the hash bytes reads them), for the router's index,
// which compares and buckets numbers where a Map of hex strings would hash every string and
// chase a pointer per lookup. It is the same 128 bits as the hex string, so it names blocks
// exactly as the engine's events do.

/**
 * Writes hash's BLOCK_HASH_WORDS words into words at offset. False (words unspecified) when hash
 * is not 2 × BLOCK_HASH_BYTES lowercase hex digits, as hashes are written: no block has that name.
 */
export function blockHashWords(hash: BlockHash, words: Uint32Array, offset: number): boolean {
  if (hash.length !== HASH_HEX_DIGITS) return false;
  let invalid = 0;
  for (let word = 0; word < BLOCK_HASH_WORDS; word++) {
    // Byte 0 of the word is its low byte (little endian); each byte is two hex digits, high first.
    let value = 0;
    for (let at = 8 * word + 6; at >= 8 * word; at -= 2) {
      const high = hexValue(hash.charCodeAt(at));
      const low = hexValue(hash.charCodeAt(at + 1));
      invalid |= high | low;
      value = (value << 8) | (high << 4) | low;
    }
    words[offset + word] = value;
  }
  return invalid >= 0;
}

/** Per character code below 128: its value as a lowercase hex digit, or -1. */
const HEX_VALUES = Int8Array.from({ length: 128 }, (_, code) =>
  code >= 48 && code <= 57 ? code - 48 : code >= 97 && code <= 102 ? code - 87 : -1);

function hexValue(code: number): number {
  return code < 128 ? HEX_VALUES[code] : -1;
}

/**
 * The words of blocks [firstBlock, firstBlock + numBlocks) of tokenIds, the first of which
 * follows parentWords[parentOffset..] (the root's words for block 0): block i's at
 * BLOCK_HASH_WORDS × i. A scratch array that the next call overwrites: read it before then.
 */
export function chainBlockHashWords(
  parentWords: Uint32Array,
  parentOffset: number,
  tokenIds: ArrayLike<number>,
  firstBlock: number,
  numBlocks: number,
  blockSizeTokens: number,
): Uint32Array {
  for (let word = 0; word < BLOCK_HASH_WORDS; word++) parentScratch.writeUInt32LE(parentWords[parentOffset + word], 4 * word);
  chainIntoScratch(tokenIds, firstBlock, numBlocks, blockSizeTokens);
  return hashScratchWords;
}

/**
 * Extends hashes (the chain of the first hashes.length blocks of tokenIds) to its first
 * numBlocks blocks, each of which tokenIds must fill, and returns it.
 */
export function extendBlockHashes(
  hashes: BlockHash[],
  root: BlockHash,
  tokenIds: ArrayLike<number>,
  blockSizeTokens: number,
  numBlocks: number,
): BlockHash[] {
  if (numBlocks * blockSizeTokens > tokenIds.length) {
    throw new RangeError(`${numBlocks} blocks of ${blockSizeTokens} tokens need more than the ${tokenIds.length} tokens given`);
  }
  if (hashes.length >= numBlocks) return hashes;
  return appendBlockHashes(hashes, hashes.at(-1) ?? root, tokenIds, hashes.length, numBlocks - hashes.length, blockSizeTokens);
}
