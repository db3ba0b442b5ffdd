#include "sampler.h"

#include <algorithm>
#include <cmath>

namespace conduit {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Temperature, then top-k, then top-p over the survivors, then one inverse-CDF draw.
int32_t sample_stochastic(const float* logits, int32_t vocab_size, const SamplingParams& params,
                          std::vector<int32_t>& ids, std::vector<double>& probs) {
  ids.resize(size_t(vocab_size));
  probs.resize(size_t(vocab_size));
  for (int32_t id = 0; id < vocab_size; ++id) ids[size_t(id)] = id;
  const auto by_logit = [logits](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  int32_t num_candidates = vocab_size;
  const bool top_p_active = params.top_p < 1.0f;
  if (params.top_k > 0 && params.top_k < vocab_size) {
    num_candidates = params.top_k;
    std::partial_sort(ids.begin(), ids.begin() + num_candidates, ids.end(), by_logit);
  } else if (top_p_active) {
    std::sort(ids.begin(), ids.end(), by_logit);
  }
  // Without truncation the candidates stay in id order and need no sort.
  float max_logit = logits[ids[0]];
  for (int32_t i = 1; i < num_candidates; ++i) max_logit = std::max(max_logit, logits[ids[size_t(i)]]);
  const double inverse_temperature = 1.0 / double(params.temperature);
  double total = 0;
  for (int32_t i = 0; i < num_candidates; ++i) {
    const double p = std::exp((double(logits[ids[size_t(i)]]) - max_logit) * inverse_temperature);
    probs[size_t(i)] = p;
    total += p;
  }
  if (top_p_active) {
    const double threshold = double(params.top_p) * total;
    double cumulative = 0;
    int32_t kept = 0;
    while (kept < num_candidates) {
      cumulative += probs[size_t(kept)];
      ++kept;
      if (cumulative >= threshold) break;
    }
    num_candidates = kept;
    total = cumulative;
  }
  const double target = uniform_from_counter(params.seed, uint64_t(uint32_t(params.output_index))) * total;
  double cumulative = 0;
  for (int32_t i = 0; i < num_candidates; ++i) {
    cumulative += probs[size_t(i)];
    if (target < cumulative) return ids[size_t(i)];
  }
  return ids[size_t(num_candidates - 1)];
}

}  // namespace

double uniform_from_counter(uint64_t seed, uint64_t counter) {
  const uint64_t bits = splitmix64(splitmix64(seed) ^ counter);
  return double(bits >> 11) * 0x1.0p-53;
}

SampledToken sample_token(const KernelTable& kernels, const float* logits, int32_t vocab_size,
                          const SamplingParams& params, std::vector<int32_t>& id_scratch, std::vector<double>& prob_scratch) {
  const bool greedy = params.temperature <= 0.0f || params.top_k == 1;
  // Ties go to the lowest id. The log-softmax's denominator runs in the kernels' vectorized
  // exponentials (a libm exp per vocabulary entry was ~2% of a batch-1 decode step).
  const ArgMax best = kernels.argmax(logits, vocab_size);
  const int32_t id = greedy ? best.index : sample_stochastic(logits, vocab_size, params, id_scratch, prob_scratch);
  const double sum = kernels.sum_exp(logits, vocab_size, best.value);
  return SampledToken{id, float(double(logits[id]) - best.value - std::log(sum))};
}

}  // namespace conduit
