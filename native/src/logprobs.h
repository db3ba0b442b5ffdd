// Log-probabilities under one row of raw logits: the log-softmax at chosen ids (sampled and
// prompt logprobs) and the most likely tokens (top logprobs).
#pragma once

#include <cstdint>

#include "kernels.h"

namespace conduit {

// The row's log-softmax, log p(id) = logit - max - log(sum e^(logit - max)).
struct LogSoftmax {
  ArgMax best;    // the largest logit, its lowest id
  double log_sum; // log(sum_j e^(logit_j - best.value))

  float at(const float* logits, int32_t id) const { return float(double(logits[id]) - best.value - log_sum); }
};

// The denominator runs in the kernels' vectorized exponentials (a libm exp per vocabulary entry
// was ~2% of a batch-1 decode step).
LogSoftmax log_softmax_of(const KernelTable& kernels, const float* logits, int32_t vocab_size);

// The num_top (at most CD_MAX_TOP_LOGPROBS) largest logits' ids, descending, ties to the lower id,
// into ids[0, num_top), and their log-softmax into logprobs[0, num_top).
void top_logprobs(const float* logits, int32_t vocab_size, const LogSoftmax& log_softmax, int32_t num_top, int32_t* ids,
                  float* logprobs);

// 1 + the ids that come before id in top_logprobs' order: a larger logit, or an equal one with a
// lower id.
int32_t rank_of(const float* logits, int32_t vocab_size, int32_t id);

}  // namespace conduit
