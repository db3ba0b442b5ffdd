#include "batch_plan.h"

#include <algorithm>

namespace conduit {
namespace cuda {

bool samples_on_device(const cd_batch& batch, int32_t seq) {
  if (batch.bitmask_rows != nullptr && batch.bitmask_rows[seq] >= 0) return false;
  if (batch.num_top_logprobs[seq] > 0) return false;
  if (batch.bias_starts[seq + 1] > batch.bias_starts[seq]) return false;
  const bool penalized = batch.repetition_penalties[seq] != 1.0f || batch.frequency_penalties[seq] != 0.0f ||
                         batch.presence_penalties[seq] != 0.0f;
  return !(penalized && batch.penalty_starts[seq + 1] > batch.penalty_starts[seq]);
}

int32_t graph_bucket(int32_t num_tokens) {
  static const int32_t kBuckets[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256};
  for (int32_t bucket : kBuckets) {
    if (num_tokens <= bucket) return bucket;
  }
  return 0;
}

int32_t chunk_bucket(int32_t num_chunks) {
  int32_t bucket = 1;
  while (bucket < num_chunks) bucket <<= 1;
  return bucket;
}

BatchPlan plan_batch(const cd_batch& batch, int32_t num_kv_groups, int32_t block_size_tokens, int32_t kv_chunk_tokens,
                     bool pad_to_graph_bucket) {
  BatchPlan plan;
  plan.num_tokens = batch.num_tokens;
  plan.decode_only = batch.num_tokens == batch.num_seqs;
  const int32_t bucket = pad_to_graph_bucket && plan.decode_only ? graph_bucket(batch.num_tokens) : 0;
  plan.padded_tokens = bucket > 0 ? bucket : batch.num_tokens;
  const size_t padded = size_t(plan.padded_tokens);
  plan.token_ids.assign(padded, 0);
  plan.positions.assign(padded, -1);
  plan.token_seqs.assign(padded, 0);
  plan.slots.assign(size_t(num_kv_groups) * padded, -1);
  int32_t max_position = 0;
  for (int32_t seq = 0; seq < batch.num_seqs; ++seq) {
    const int32_t begin = batch.query_starts[seq];
    const int32_t end = batch.query_starts[seq + 1];
    for (int32_t t = begin; t < end; ++t) {
      const int32_t position = batch.positions[t];
      plan.token_ids[size_t(t)] = batch.token_ids[t];
      plan.positions[size_t(t)] = position;
      plan.token_seqs[size_t(t)] = seq;
      max_position = std::max(max_position, position);
      for (int32_t group = 0; group < num_kv_groups; ++group) {
        const int32_t* table =
            batch.block_tables + (size_t(group) * batch.num_seqs + size_t(seq)) * size_t(batch.max_blocks_per_seq);
        plan.slots[size_t(group) * padded + size_t(t)] =
            table[position / block_size_tokens] * block_size_tokens + position % block_size_tokens;
      }
    }
    if (batch.seq_flags[seq] & (CD_SEQ_SAMPLE | CD_SEQ_RETURN_LOGITS)) {
      const int32_t row = int32_t(plan.output_tokens.size());
      plan.output_tokens.push_back(end - 1);
      plan.output_seqs.push_back(seq);
      const bool sampled = (batch.seq_flags[seq] & CD_SEQ_SAMPLE) != 0;
      if (sampled && samples_on_device(batch, seq)) plan.device_sampled_rows.push_back(row);
      if ((batch.seq_flags[seq] & CD_SEQ_RETURN_LOGITS) || (sampled && !samples_on_device(batch, seq))) {
        plan.host_rows.push_back(row);
      }
    }
    if (batch.seq_flags[seq] & CD_SEQ_PROMPT_LOGPROBS) {
      const int32_t reported_end = batch.prompt_next_token_ids[seq] >= 0 ? end : end - 1;
      for (int32_t t = begin; t < reported_end; ++t) plan.prompt_tokens.push_back(t);
    }
  }
  plan.num_chunks = (max_position + kv_chunk_tokens) / kv_chunk_tokens;
  if (bucket > 0) plan.num_chunks = chunk_bucket(plan.num_chunks);
  // Graph captures read the tables at a fixed stride: wide enough for the chunk bucket's span.
  const int32_t needed_stride = std::max(batch.max_blocks_per_seq, 1);
  plan.block_table_stride =
      bucket > 0 ? std::max(needed_stride, plan.num_chunks * kv_chunk_tokens / block_size_tokens) : needed_stride;
  plan.table_rows = bucket > 0 ? bucket : batch.num_seqs;
  plan.block_tables.assign(size_t(num_kv_groups) * size_t(plan.table_rows) * size_t(plan.block_table_stride), 0);
  for (int32_t group = 0; group < num_kv_groups; ++group) {
    for (int32_t seq = 0; seq < batch.num_seqs; ++seq) {
      const int32_t* source =
          batch.block_tables + (size_t(group) * batch.num_seqs + size_t(seq)) * size_t(batch.max_blocks_per_seq);
      int32_t* target =
          plan.block_tables.data() + (size_t(group) * plan.table_rows + size_t(seq)) * size_t(plan.block_table_stride);
      std::copy_n(source, batch.max_blocks_per_seq, target);
    }
  }
  return plan;
}

}  // namespace cuda
}  // namespace conduit
