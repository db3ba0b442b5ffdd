// The one block hash: the worker's prefix cache and the router's index both name a full KV block
// by it, so a router can tell which worker holds a prompt's prefix from the worker's events.
//
// A full block's hash is H(parent block's hash, its token ids); the first block's parent is the
// root of its scope, H(scheme, model, cache salt), so the extra keys reach every block through
// the chain and two requests share a block only when everything before it is the same. H is
// SHA-256 over a fixed byte layout, truncated to 128 bits and written as 32 hex digits: the same
// in every process and language, and collision-free in practice. A change of the layout must
// change HASH_SCHEME, which both sides compare.
import { createHash, hash } from 'node:crypto';

export type BlockHash = string;

export const HASH_SCHEME = 'conduit-kv-sha256-128-v1';

const HASH_BYTES = 16;

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
  return hasher.digest('hex').slice(0, 2 * HASH_BYTES);
}

// The parent's bytes, then the block's token ids: one scratch buffer, hashed in one call (the
// router hashes every prompt it routes, so a block costs one SHA-256 and no allocation here).
const PARENT_BYTES = HASH_BYTES;
let scratch = Buffer.alloc(PARENT_BYTES + 4 * 256);

/** The hash of the block holding tokenIds[start, start + blockSizeTokens) after parent. */
export function blockHash(parent: BlockHash, tokenIds: ArrayLike<number>, start: number, blockSizeTokens: number): BlockHash {
  const numBytes = PARENT_BYTES + 4 * blockSizeTokens;
  if (scratch.length < numBytes) scratch = Buffer.alloc(numBytes);
  scratch.write(parent, 0, PARENT_BYTES, 'hex');
  for (let i = 0; i < blockSizeTokens; i++) scratch.writeInt32LE(tokenIds[start + i], PARENT_BYTES + 4 * i);
  return hash('sha256', scratch.subarray(0, numBytes), 'hex').slice(0, 2 * HASH_BYTES);
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
  for (let block = hashes.length; block < numBlocks; block++) {
    const parent = block === 0 ? root : hashes[block - 1];
    hashes.push(blockHash(parent, tokenIds, block * blockSizeTokens, blockSizeTokens));
  }
  return hashes;
}
