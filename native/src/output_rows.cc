#include "output_rows.h"

#include <algorithm>

namespace conduit {

void list_output_rows(const cd_batch& batch, OutputRows& rows) {
  rows.tokens.clear();
  rows.seqs.clear();
  rows.first_rows.resize(size_t(batch.num_seqs));
  rows.returned_rows.clear();
  rows.sampling_seqs.clear();
  rows.prompt_tokens.clear();
  rows.sample_stride = 1;
  for (int32_t seq = 0; seq < batch.num_seqs; ++seq) {
    const int32_t begin = batch.query_starts[seq];
    const int32_t end = batch.query_starts[seq + 1];
    const uint32_t flags = uint32_t(batch.seq_flags[seq]);
    rows.first_rows[size_t(seq)] = int32_t(rows.tokens.size());
    if (flags & CD_SEQ_RETURN_LOGITS) rows.returned_rows.push_back(int32_t(rows.tokens.size()));
    if (flags & (CD_SEQ_SAMPLE | CD_SEQ_RETURN_LOGITS)) {
      const int32_t num_drafts = num_draft_tokens(batch, seq);
      rows.sample_stride = std::max(rows.sample_stride, num_drafts + 1);
      for (int32_t t = end - 1 - num_drafts; t < end; ++t) {
        rows.tokens.push_back(t);
        rows.seqs.push_back(seq);
      }
    }
    if (flags & CD_SEQ_SAMPLE) rows.sampling_seqs.push_back(seq);
    if (flags & CD_SEQ_PROMPT_LOGPROBS) {
      const int32_t reported_end = batch.prompt_next_token_ids[seq] >= 0 ? end : end - 1;
      for (int32_t t = begin; t < reported_end; ++t) rows.prompt_tokens.push_back(t);
    }
  }
}

}  // namespace conduit
