#include "sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "shared/sampling_math.h"

namespace conduit {

namespace {

constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();
constexpr uint32_t kNegativeInfinityBits = 0xff800000u;

// A copy of the logits in which every token the bitmask does not allow is -infinity. A grammar's
// masks are mostly runs (a string's body allows nearly every token, a key's next byte nearly
// none), so a word of 32 ids all allowed or all refused is copied or filled whole.
const float* mask_logits(const float* logits, int32_t vocab_size, const uint32_t* allowed_bits,
                         std::vector<float>& masked) {
  masked.resize(size_t(vocab_size));
  float* out = masked.data();
  const int32_t num_whole_words = vocab_size >> 5;
  for (int32_t word = 0; word < num_whole_words; ++word) {
    const uint32_t bits = allowed_bits[word];
    const int32_t begin = word << 5;
    if (bits == ~0u) {
      std::copy_n(logits + begin, 32, out + begin);
    } else if (bits == 0u) {
      std::fill_n(out + begin, 32, kNegativeInfinity);
    } else {
      // As bit patterns, selected without a branch: a mixed word's bits are unpredictable.
      uint32_t patterns[32];
      std::memcpy(patterns, logits + begin, sizeof(patterns));
      for (int32_t bit = 0; bit < 32; ++bit) {
        const uint32_t keep = 0u - ((bits >> bit) & 1u);
        patterns[bit] = (patterns[bit] & keep) | (kNegativeInfinityBits & ~keep);
      }
      std::memcpy(out + begin, patterns, sizeof(patterns));
    }
  }
  // The last word's ids past the vocabulary are not the model's.
  for (int32_t id = num_whole_words << 5; id < vocab_size; ++id) {
    out[id] = (allowed_bits[id >> 5] >> (id & 31)) & 1u ? logits[id] : kNegativeInfinity;
  }
  return out;
}

int32_t count_of(const int32_t* ids, int32_t num_ids, int32_t id) {
  int32_t count = 0;
  for (int32_t i = 0; i < num_ids; ++i) count += ids[i] == id ? 1 : 0;
  return count;
}

// One token's penalties, given its occurrences in the output so far.
void penalize(float& logit, const LogitAdjustments& adjustments, int32_t output_count, bool in_prompt) {
  if (output_count > 0 || in_prompt) {
    const float repetition = adjustments.repetition_penalty;
    logit = logit > 0.0f ? logit / repetition : logit * repetition;
  }
  if (output_count > 0) {
    logit -= adjustments.frequency_penalty * float(output_count);
    logit -= adjustments.presence_penalty;
  }
}

// The logits with the bias added, then the penalties applied, each an fp32 operation as vLLM
// does it: in a copy, unless they are the scratch already (a masked row). Each token's penalty is
// one sequence of operations on its own logit, so the order of the entries does not matter, and
// a token counted with the proposals before this sample gets exactly the operations plain
// decoding gives it once those proposals are output.
const float* adjust_logits(const float* logits, int32_t vocab_size, const LogitAdjustments& adjustments,
                           SamplerScratch& scratch) {
  std::vector<float>& adjusted = scratch.adjusted_logits;
  if (logits != adjusted.data()) {
    adjusted.resize(size_t(vocab_size));
    std::copy_n(logits, vocab_size, adjusted.begin());
  }
  for (int32_t i = 0; i < adjustments.num_bias_tokens; ++i) {
    adjusted[size_t(adjustments.bias_token_ids[i])] += adjustments.bias_values[i];
  }
  const bool penalized = adjustments.repetition_penalty != 1.0f || adjustments.frequency_penalty != 0.0f ||
                         adjustments.presence_penalty != 0.0f;
  const int32_t* drafts = adjustments.preceding_draft_ids;
  const int32_t num_drafts = penalized ? adjustments.num_preceding_drafts : 0;
  scratch.draft_is_new.assign(size_t(num_drafts), 1);
  for (int32_t i = 0; i < adjustments.num_penalty_tokens; ++i) {
    const int32_t token_id = adjustments.penalty_token_ids[i];
    int32_t output_count = adjustments.penalty_output_counts[i];
    for (int32_t d = 0; d < num_drafts; ++d) {
      if (drafts[d] != token_id) continue;
      ++output_count;
      scratch.draft_is_new[size_t(d)] = 0;
    }
    penalize(adjusted[size_t(token_id)], adjustments, output_count, adjustments.penalty_in_prompt[i] != 0);
  }
  for (int32_t d = 0; d < num_drafts; ++d) {
    if (scratch.draft_is_new[size_t(d)] == 0 || count_of(drafts, d, drafts[d]) > 0) continue;
    penalize(adjusted[size_t(drafts[d])], adjustments, count_of(drafts, num_drafts, drafts[d]), false);
  }
  return adjusted.data();
}

// The ids, in order, whose probability is at least min_p times the largest: a logit at least
// max + temperature * ln(min_p), one comparison per token instead of an exponential. Returns their
// number; the largest is always among them.
int32_t keep_min_p(const float* logits, int32_t vocab_size, float max_logit, const SamplingParams& params,
                   std::vector<int32_t>& ids) {
  const double threshold = sampling::min_p_threshold(max_logit, params.temperature, std::log(double(params.min_p)));
  int32_t kept = 0;
  for (int32_t id = 0; id < vocab_size; ++id) {
    if (double(logits[id]) >= threshold) ids[size_t(kept++)] = id;
  }
  return kept;
}

// Temperature, then min-p, then top-k, then top-p over the survivors, then one inverse-CDF draw.
// Min-p goes first because it needs no sort and often leaves a few dozen tokens to sort.
int32_t sample_stochastic(const float* logits, int32_t vocab_size, float max_logit, const SamplingParams& params,
                          std::vector<int32_t>& ids, std::vector<double>& probs) {
  ids.resize(size_t(vocab_size));
  probs.resize(size_t(vocab_size));
  int32_t num_candidates = vocab_size;
  if (params.min_p > 0.0f) {
    num_candidates = keep_min_p(logits, vocab_size, max_logit, params, ids);
  } else {
    for (int32_t id = 0; id < vocab_size; ++id) ids[size_t(id)] = id;
  }
  const auto by_logit = [logits](int32_t a, int32_t b) { return sampling::ranks_before(logits[a], a, logits[b], b); };
  const bool top_p_active = params.top_p < 1.0f;
  if (params.top_k > 0 && params.top_k < num_candidates) {
    std::partial_sort(ids.begin(), ids.begin() + params.top_k, ids.begin() + num_candidates, by_logit);
    num_candidates = params.top_k;
  } else if (top_p_active) {
    std::sort(ids.begin(), ids.begin() + num_candidates, by_logit);
  }
  // Without truncation the candidates stay in id order and need no sort. Every truncation keeps
  // the largest logit, so probabilities are relative to it.
  const double inverse_temperature = 1.0 / double(params.temperature);
  double total = 0;
  for (int32_t i = 0; i < num_candidates; ++i) {
    const double p = std::exp((double(logits[ids[size_t(i)]]) - max_logit) * inverse_temperature);
    probs[size_t(i)] = p;
    total += p;
  }
  const double u = uniform_from_counter(params.seed, uint64_t(uint32_t(params.output_index)));
  return ids[size_t(sampling::cut_and_draw(probs.data(), num_candidates, total, params.top_p, u))];
}

}  // namespace

double uniform_from_counter(uint64_t seed, uint64_t counter) {
  return sampling::uniform_from_counter(seed, counter);
}

int32_t sample_token(const KernelTable& kernels, const float* logits, int32_t vocab_size, ArgMax raw_best,
                     const SamplingParams& params, const LogitAdjustments& adjustments, const uint32_t* allowed_bits,
                     SamplerScratch& scratch) {
  ArgMax best = raw_best;
  // What an empty choice falls back to: the model's own first choice among what the grammar
  // allows. A grammar that allows nothing (a row written empty: its grammar failed) falls back to
  // the raw argmax, which the engine withholds, failing the request rather than the batch.
  ArgMax fallback = raw_best;
  if (allowed_bits != nullptr) {
    logits = mask_logits(logits, vocab_size, allowed_bits, scratch.adjusted_logits);
    best = kernels.argmax(logits, vocab_size);
    if (best.value == kNegativeInfinity) return raw_best.index;
    fallback = best;
  }
  if (adjustments.any()) {
    logits = adjust_logits(logits, vocab_size, adjustments, scratch);
    best = kernels.argmax(logits, vocab_size);
    // Every token banned (by bias or min_tokens, among what the grammar allows) leaves nothing to
    // sample from: fall back, deterministically, as above; the grammar outranks a ban.
    if (best.value == kNegativeInfinity) return fallback.index;
  }
  const bool greedy = params.temperature <= 0.0f || params.top_k == 1;
  // Ties go to the lowest id. An infinite logit (a repetition penalty so small that a division
  // overflowed) takes all the probability, which the draw's e^(logit - max) cannot express.
  if (greedy || best.value == std::numeric_limits<float>::infinity()) return best.index;
  return sample_stochastic(logits, vocab_size, best.value, params, scratch.ids, scratch.probs);
}

SamplingParams sampling_params_of(const cd_batch& batch, int32_t seq, int32_t j) {
  return SamplingParams{batch.temperatures[seq], batch.top_ps[seq], batch.top_ks[seq],
                        batch.min_ps[seq],       batch.seeds[seq],  batch.output_indices[seq] + j};
}

LogitAdjustments logit_adjustments_of(const cd_batch& batch, int32_t seq, int32_t num_preceding_drafts) {
  const int32_t num_drafts = batch.num_draft_tokens == nullptr ? 0 : batch.num_draft_tokens[seq];
  const int32_t bias_begin = batch.bias_starts[seq];
  const int32_t penalty_begin = batch.penalty_starts[seq];
  return LogitAdjustments{batch.bias_token_ids + bias_begin,
                          batch.bias_values + bias_begin,
                          batch.bias_starts[seq + 1] - bias_begin,
                          batch.repetition_penalties[seq],
                          batch.frequency_penalties[seq],
                          batch.presence_penalties[seq],
                          batch.penalty_token_ids + penalty_begin,
                          batch.penalty_output_counts + penalty_begin,
                          batch.penalty_in_prompt + penalty_begin,
                          batch.penalty_starts[seq + 1] - penalty_begin,
                          batch.token_ids + batch.query_starts[seq + 1] - num_drafts,
                          num_preceding_drafts};
}

const uint32_t* allowed_bits_of(const cd_batch& batch, int32_t seq) {
  if (batch.bitmask_rows == nullptr) return nullptr;
  const int32_t row = batch.bitmask_rows[seq];
  return row < 0 ? nullptr : batch.token_bitmask + size_t(row) * size_t(batch.bitmask_words);
}

}  // namespace conduit
