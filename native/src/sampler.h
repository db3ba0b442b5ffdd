// Token sampling from one row of logits, in vLLM v1's order: a grammar's token bitmask, logit
// bias, repetition penalty, frequency and presence penalties, then the argmax, or temperature,
// min-p, top-k, top-p and one inverse-CDF draw. Counter-based: the draw depends only on (seed, output_index), so a seeded
// request samples the same tokens whatever shares its batch.
#pragma once

#include <cstdint>
#include <vector>

#include "conduit.h"
#include "kernels.h"

namespace conduit {

struct SamplingParams {
  float temperature;  // 0 = greedy
  float top_p;        // 1 disables
  int32_t top_k;      // 0 disables
  float min_p;        // 0 disables
  uint64_t seed;
  int32_t output_index;
};

// What a sequence's logit bias and history do to its logits before sampling (cd_batch's entries).
struct LogitAdjustments {
  const int32_t* bias_token_ids;
  const float* bias_values;  // finite, or -infinity to ban
  int32_t num_bias_tokens;
  float repetition_penalty;  // 1 disables
  float frequency_penalty;   // 0 disables
  float presence_penalty;    // 0 disables
  const int32_t* penalty_token_ids;
  const int32_t* penalty_output_counts;
  const uint8_t* penalty_in_prompt;
  int32_t num_penalty_tokens;
  // Proposals accepted before this sample (speculative decoding): output tokens the history above
  // does not count yet. A token among them that the history lacks is not in the prompt, since the
  // history lists every prompt token whenever the repetition penalty (the one use of that) is on.
  const int32_t* preceding_draft_ids;
  int32_t num_preceding_drafts;

  // Neutral adjustments leave the logits as they are, so the sampler reads the raw row.
  bool any() const {
    const bool penalized = repetition_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f;
    return num_bias_tokens > 0 || (penalized && (num_penalty_tokens > 0 || num_preceding_drafts > 0));
  }
};

// One thread's scratch: each vector grows to the vocabulary once and is reused.
struct SamplerScratch {
  std::vector<float> adjusted_logits;
  // Per preceding proposal: it is the first of its token among them and the history lacks it.
  std::vector<uint8_t> draft_is_new;
  std::vector<int32_t> ids;
  std::vector<double> probs;
};

// The sampled token id. raw_best is the argmax of the raw logits (ties to the lowest id).
// allowed_bits, when not null, is a structured output's bitmask (bit id & 31 of word id >> 5):
// tokens whose bit is clear get -infinity before anything else.
int32_t sample_token(const KernelTable& kernels, const float* logits, int32_t vocab_size, ArgMax raw_best,
                     const SamplingParams& params, const LogitAdjustments& adjustments, const uint32_t* allowed_bits,
                     SamplerScratch& scratch);

// A batch sequence's settings for its j-th sample (output index output_indices[seq] + j), its bias
// and penalties with its first j proposals counted as output, and its bitmask row (null when
// unconstrained): what every device's pass hands sample_token.
SamplingParams sampling_params_of(const cd_batch& batch, int32_t seq, int32_t j);
LogitAdjustments logit_adjustments_of(const cd_batch& batch, int32_t seq, int32_t num_preceding_drafts);
const uint32_t* allowed_bits_of(const cd_batch& batch, int32_t seq);

// A uniform draw in [0, 1) keyed by (seed, counter).
double uniform_from_counter(uint64_t seed, uint64_t counter);

}  // namespace conduit
