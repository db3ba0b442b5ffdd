// The arithmetic of a draw that the CPU sampler (src/sampler.cc) and the CUDA sampler
// (src/cuda/sample.cu) share, compiled by both g++ and nvcc, so that the same processed logits
// give the same token on either device: the counter-based uniform, the order of candidates
// (ties to the lower id), the min-p threshold, each candidate's unnormalized probability and the
// top-p cut followed by one inverse-CDF draw, all in double, summed in candidate order.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define CONDUIT_HD __host__ __device__ __forceinline__
#else
#define CONDUIT_HD inline
#endif

namespace conduit {
namespace sampling {

CONDUIT_HD uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A uniform draw in [0, 1) keyed by (seed, counter): 53 bits of splitmix64(splitmix64(seed) ^ counter).
CONDUIT_HD double uniform_from_counter(uint64_t seed, uint64_t counter) {
  const uint64_t bits = splitmix64(splitmix64(seed) ^ counter);
  return double(bits >> 11) * 0x1.0p-53;
}

// The candidates' order: a larger logit first, equal logits by the lower id.
CONDUIT_HD bool ranks_before(float logit_a, int32_t id_a, float logit_b, int32_t id_b) {
  return logit_a > logit_b || (logit_a == logit_b && id_a < id_b);
}

// A key whose ascending order is ranks_before's order: the logit's bits mapped to an unsigned
// order and inverted (larger first), then the id (lower first). -0 is 0, as == has it.
CONDUIT_HD uint64_t candidate_key(float logit, int32_t id) {
  uint32_t bits;
  if (logit == 0.0f) logit = 0.0f;
#if defined(__CUDA_ARCH__)
  bits = __float_as_uint(logit);
#else
  __builtin_memcpy(&bits, &logit, sizeof bits);
#endif
  const uint32_t ordered = (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
  return (uint64_t(~ordered) << 32) | uint32_t(id);
}

// min-p keeps a logit at least max + T ln(min_p): a probability at least min_p times the largest.
// ln_min_p is log(double(min_p)), computed by the caller (std::log and CUDA's log agree to 1 ulp).
CONDUIT_HD double min_p_threshold(float max_logit, float temperature, double ln_min_p) {
  return double(max_logit) + double(temperature) * ln_min_p;
}

// The top-p cut (top_p < 1) over probs[0, num_candidates) in candidate order, then the draw of
// target_fraction (a uniform in [0, 1)) of what is kept: returns the index of the chosen candidate.
// A target rounded up to the total itself takes the last candidate of nonzero probability, so a
// banned (probability 0) token is never drawn.
template <typename Probs>
CONDUIT_HD int32_t cut_and_draw(const Probs& probs, int32_t num_candidates, double total, float top_p,
                                double target_fraction) {
  if (top_p < 1.0f) {
    const double threshold = double(top_p) * total;
    double cumulative = 0;
    int32_t kept = 0;
    while (kept < num_candidates) {
      cumulative += probs[kept];
      ++kept;
      if (cumulative >= threshold) break;
    }
    num_candidates = kept;
    total = cumulative;
  }
  const double target = target_fraction * total;
  double cumulative = 0;
  int32_t last_possible = 0;
  for (int32_t i = 0; i < num_candidates; ++i) {
    if (probs[i] > 0) last_possible = i;
    cumulative += probs[i];
    if (target < cumulative) return i;
  }
  return last_possible;
}

}  // namespace sampling
}  // namespace conduit
