// Token sampling from one row of logits. Counter-based: the random draw depends only on
// (seed, output_index), so a seeded request samples the same tokens whatever shares its batch.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels.h"

namespace conduit {

struct SamplingParams {
  float temperature;  // 0 = greedy
  float top_p;        // 1 disables
  int32_t top_k;      // 0 disables
  uint64_t seed;
  int32_t output_index;
};

struct SampledToken {
  int32_t token_id;
  float logprob;  // log-softmax of the raw logits at token_id
};

// Scratch vectors grow to vocab_size and are reused across calls. The logprob's denominator
// runs in the kernels' exponentials.
SampledToken sample_token(const KernelTable& kernels, const float* logits, int32_t vocab_size,
                          const SamplingParams& params, std::vector<int32_t>& id_scratch, std::vector<double>& prob_scratch);

// A uniform draw in [0, 1) keyed by (seed, counter).
double uniform_from_counter(uint64_t seed, uint64_t counter);

}  // namespace conduit
