// Chained block hashes for the prefix cache and the router (engine/kv/block-hash.ts): a block's
// hash is the first 16 bytes of SHA-256 over its parent's hash and its token ids (int32, little
// endian). SHA-256 is the OpenSSL inside the running Node, which exports it for addons, so a
// hash here is byte for byte node:crypto's. Its low-level SHA256_* calls run the SHA-256 code
// directly (SHA-NI where the CPU has it); the one-shot and EVP calls look the algorithm up on every
// call, which costs more than hashing a block. One call hashes a run of blocks, where node:crypto
// costs a call, a Buffer and a hex string per block.
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>

#include "block_hash.h"

#include <cstring>
#include <vector>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token ids are hashed as little-endian int32");

void cd_chain_block_hashes(const uint8_t* parent_hash, const int32_t* token_ids, int32_t block_size_tokens,
                           int32_t num_blocks, uint8_t* hashes) {
  const size_t num_token_bytes = sizeof(int32_t) * size_t(block_size_tokens);
  std::vector<uint8_t> message(CD_BLOCK_HASH_BYTES + num_token_bytes);
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256_CTX context;
  const uint8_t* parent = parent_hash;
  for (int32_t block = 0; block < num_blocks; block++) {
    std::memcpy(message.data(), parent, CD_BLOCK_HASH_BYTES);
    std::memcpy(message.data() + CD_BLOCK_HASH_BYTES, token_ids + size_t(block) * block_size_tokens, num_token_bytes);
    SHA256_Init(&context);
    SHA256_Update(&context, message.data(), message.size());
    SHA256_Final(digest, &context);
    uint8_t* hash = hashes + size_t(block) * CD_BLOCK_HASH_BYTES;
    std::memcpy(hash, digest, CD_BLOCK_HASH_BYTES);
    parent = hash;
  }
}
