#include "batch_plan.h"

#include <algorithm>
#include <limits>

namespace conduit {
namespace cuda {

bool samples_on_device(const cd_batch& batch, int32_t seq) {
  if (batch.bitmask_rows != nullptr && batch.bitmask_rows[seq] >= 0) return false;
  if (batch.num_top_logprobs[seq] > 0) return false;
  if (batch.bias_starts[seq + 1] > batch.bias_starts[seq]) return false;
  const bool penalized = batch.repetition_penalties[seq] != 1.0f || batch.frequency_penalties[seq] != 0.0f ||
                         batch.presence_penalties[seq] != 0.0f;
  return !(penalized && (batch.penalty_starts[seq + 1] > batch.penalty_starts[seq] || num_draft_tokens(batch, seq) > 0));
}

void settle_proposals(const cd_batch& batch, int32_t sample_stride, cd_forward_output& output) {
  if (batch.num_draft_tokens == nullptr) return;
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  for (int32_t seq = 0; seq < batch.num_seqs; ++seq) {
    if (output.num_accepted_tokens != nullptr) output.num_accepted_tokens[seq] = 0;
    if (!(batch.seq_flags[seq] & CD_SEQ_SAMPLE)) continue;
    const int32_t num_drafts = num_draft_tokens(batch, seq);
    const int32_t* drafts = batch.token_ids + batch.query_starts[seq + 1] - num_drafts;
    const size_t first_row = size_t(seq) * size_t(sample_stride);
    int32_t accepted = 0;
    while (accepted < num_drafts && output.sampled_token_ids[first_row + size_t(accepted)] == drafts[accepted]) ++accepted;
    if (output.num_accepted_tokens != nullptr) output.num_accepted_tokens[seq] = accepted;
    for (size_t row = first_row + size_t(accepted) + 1; row < first_row + size_t(sample_stride); ++row) {
      output.sampled_token_ids[row] = -1;
      output.sampled_logprobs[row] = 0.0f;
      std::fill_n(output.top_token_ids + row * CD_MAX_TOP_LOGPROBS, CD_MAX_TOP_LOGPROBS, -1);
      std::fill_n(output.top_logprobs + row * CD_MAX_TOP_LOGPROBS, CD_MAX_TOP_LOGPROBS, kNaN);
    }
  }
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
  }
  list_output_rows(batch, plan.outputs);
  for (size_t row = 0; row < plan.outputs.tokens.size(); ++row) {
    const int32_t seq = plan.outputs.seqs[row];
    const bool sampled = (batch.seq_flags[seq] & CD_SEQ_SAMPLE) != 0;
    if (sampled && samples_on_device(batch, seq)) plan.device_sampled_rows.push_back(int32_t(row));
    if ((batch.seq_flags[seq] & CD_SEQ_RETURN_LOGITS) || (sampled && !samples_on_device(batch, seq))) {
      plan.host_rows.push_back(int32_t(row));
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
