// Which tokens of a batch the LM head runs on and where each sequence's samples go: one
// bookkeeping for the CPU pass (forward.cc) and the CUDA plugin's batch plan
// (cuda/batch_plan.cc), so the two devices read the same rows for the same batch.
#pragma once

#include <cstdint>
#include <vector>

#include "conduit.h"

namespace conduit {

struct OutputRows {
  // The LM head's rows: per sequence flagged SAMPLE or RETURN_LOGITS its last token, or its last
  // k + 1 with k proposals, in batch order; and each row's sequence.
  std::vector<int32_t> tokens, seqs;
  std::vector<int32_t> first_rows;     // [num_seqs] each sequence's first row
  std::vector<int32_t> returned_rows;  // rows whose logits are returned, in cd_forward_output.logits order
  std::vector<int32_t> sampling_seqs;  // sequences that sample, batch order
  std::vector<int32_t> prompt_tokens;  // tokens reporting the next token's prompt logprob, batch order
  // Rows of the sampled outputs per sequence: 1 + the most proposals a sequence carries.
  int32_t sample_stride = 1;
};

inline int32_t num_draft_tokens(const cd_batch& batch, int32_t seq) {
  return batch.num_draft_tokens == nullptr ? 0 : batch.num_draft_tokens[seq];
}

// Refills rows for batch (the vectors keep their capacity).
void list_output_rows(const cd_batch& batch, OutputRows& rows);

// The token whose prompt logprob `token` (of sequence seq) reports: the next in the chunk, or the
// one after the chunk at its last token.
inline int32_t prompt_next_token(const cd_batch& batch, int32_t seq, int32_t token) {
  return token + 1 == batch.query_starts[seq + 1] ? batch.prompt_next_token_ids[seq] : batch.token_ids[token + 1];
}

}  // namespace conduit
