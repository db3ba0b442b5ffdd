#include "batch_broadcast.h"

#include <algorithm>

namespace conduit {

namespace {

// [kind, num_seqs, num_tokens, max_blocks_per_seq], kind 1 for a batch, 0 to stop.
constexpr int32_t kHeaderValues = 4;

size_t payload_values(int32_t num_seqs, int32_t num_tokens, int32_t max_blocks, int32_t num_kv_groups) {
  // token ids, positions, query starts, block tables, seq flags, prompt next token ids, draft
  // token counts (which rows the LM head computes, so every rank takes part in the same ones)
  return size_t(num_tokens) * 2 + size_t(num_seqs + 1) + size_t(num_kv_groups) * size_t(num_seqs) * size_t(max_blocks) +
         size_t(num_seqs) * 3;
}

}  // namespace

void send_batch(Communicator& comm, const cd_batch& batch, int32_t num_kv_groups, std::vector<int32_t>& values) {
  int32_t header[kHeaderValues] = {1, batch.num_seqs, batch.num_tokens, batch.max_blocks_per_seq};
  comm.broadcast(header, sizeof header, 0);
  values.clear();
  values.reserve(payload_values(batch.num_seqs, batch.num_tokens, batch.max_blocks_per_seq, num_kv_groups));
  values.insert(values.end(), batch.token_ids, batch.token_ids + batch.num_tokens);
  values.insert(values.end(), batch.positions, batch.positions + batch.num_tokens);
  values.insert(values.end(), batch.query_starts, batch.query_starts + batch.num_seqs + 1);
  values.insert(values.end(), batch.block_tables,
                batch.block_tables + size_t(num_kv_groups) * size_t(batch.num_seqs) * size_t(batch.max_blocks_per_seq));
  values.insert(values.end(), batch.seq_flags, batch.seq_flags + batch.num_seqs);
  for (int32_t seq = 0; seq < batch.num_seqs; ++seq) {
    values.push_back(batch.prompt_next_token_ids != nullptr ? batch.prompt_next_token_ids[seq] : -1);
  }
  for (int32_t seq = 0; seq < batch.num_seqs; ++seq) {
    values.push_back(batch.num_draft_tokens != nullptr ? batch.num_draft_tokens[seq] : 0);
  }
  comm.broadcast(values.data(), values.size() * sizeof(int32_t), 0);
}

void send_stop(Communicator& comm) {
  int32_t header[kHeaderValues] = {0, 0, 0, 0};
  comm.broadcast(header, sizeof header, 0);
}

bool receive_batch(Communicator& comm, int32_t num_kv_groups, ReceivedBatch& received) {
  int32_t header[kHeaderValues] = {};
  comm.broadcast(header, sizeof header, 0);
  if (header[0] == 0) return false;
  const int32_t num_seqs = header[1], num_tokens = header[2], max_blocks = header[3];
  received.values.resize(payload_values(num_seqs, num_tokens, max_blocks, num_kv_groups));
  comm.broadcast(received.values.data(), received.values.size() * sizeof(int32_t), 0);
  const int32_t* next = received.values.data();
  const auto take = [&next](size_t count) {
    const int32_t* begin = next;
    next += count;
    return begin;
  };
  cd_batch& batch = received.batch;
  batch = cd_batch{};
  batch.num_seqs = num_seqs;
  batch.num_tokens = num_tokens;
  batch.max_blocks_per_seq = max_blocks;
  batch.token_ids = take(size_t(num_tokens));
  batch.positions = take(size_t(num_tokens));
  batch.query_starts = take(size_t(num_seqs) + 1);
  batch.block_tables = take(size_t(num_kv_groups) * size_t(num_seqs) * size_t(max_blocks));
  const int32_t* flags = take(size_t(num_seqs));
  received.seq_flags.assign(flags, flags + num_seqs);
  batch.seq_flags = received.seq_flags.data();
  batch.prompt_next_token_ids = take(size_t(num_seqs));
  batch.num_draft_tokens = take(size_t(num_seqs));
  return true;
}

}  // namespace conduit
