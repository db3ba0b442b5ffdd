#pragma once
#include <cstdint>

// Bytes of a block hash: SHA-256 truncated to 128 bits.
constexpr int CD_BLOCK_HASH_BYTES = 16;

// Writes num_blocks hashes to hashes (CD_BLOCK_HASH_BYTES each): block i holds token_ids[i *
// block_size_tokens, (i + 1) * block_size_tokens) and follows block i - 1, the first parent_hash.
void cd_chain_block_hashes(const uint8_t* parent_hash, const int32_t* token_ids, int32_t block_size_tokens,
                           int32_t num_blocks, uint8_t* hashes);
