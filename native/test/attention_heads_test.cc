// Attention's kernels over a bf16 pairs cache give each query head the same bits whether it runs
// alone or among the heads that share its kv head (run by attention-heads.test.ts). avx512 scores
// and sums two heads at a time, sharing each key and value load; a slip between the pair's
// halves (one head's query or numerators used for the other) is far below what the fp64
// model-level tests can see, and batch invariance compares the paired kernel with itself. Also
// checked: every score against an fp64 dot of the stored keys, and no slot outside the visible
// range read into a sum (those hold NaN here).
//
//   attention_heads_test SEED KERNEL...   (KERNEL: scalar, avx2, avx512, amx; the caller passes
//                                          the ones this CPU runs)
// Prints one line per kernel; exits non-zero on the first mismatch, naming the seed and case.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../src/kernels.h"

namespace {

using conduit::KernelTable;

// Of the sum of |products|: avx512 holds each query and numerator to 16 bits (two bf16 halves,
// 2^-16 apart); a head's half swapped for its pair's is off by ~2^-9.
constexpr double kTolerance = 1e-4;

uint16_t to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return uint16_t((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

double from_bf16(uint16_t value) {
  const uint32_t bits = uint32_t(value) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

const KernelTable& table_named(const std::string& name) {
  if (name == "scalar") return conduit::kernels_scalar();
#ifdef __x86_64__
  if (name == "avx2") return conduit::kernels_avx2();
  if (name == "avx512") return conduit::kernels_avx512();
  if (name == "amx") return conduit::kernels_amx();
#endif
  std::fprintf(stderr, "unknown kernel %s\n", name.c_str());
  std::exit(2);
}

[[noreturn]] void fail(uint32_t seed, const std::string& kernel, const std::string& what) {
  std::fprintf(stderr, "seed %u, %s: %s\n", seed, kernel.c_str(), what.c_str());
  std::exit(1);
}

struct Case {
  int32_t num_heads, head_dim, num_groups, skip, num_visible;
  size_t key_pair_stride;  // uint16 elements between a group's key pairs (>= 32)
};

std::string describe(const Case& c) {
  return "heads " + std::to_string(c.num_heads) + ", head_dim " + std::to_string(c.head_dim) + ", groups " +
         std::to_string(c.num_groups) + ", skip " + std::to_string(c.skip) + ", visible " + std::to_string(c.num_visible);
}

// Returns the number of outputs compared.
size_t check_case(const KernelTable& kernels, const std::string& kernel, uint32_t seed, const Case& c, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.01f, 1.0f);
  const int32_t num_pairs = c.head_dim / 2;
  const int32_t num_slots = 16 * c.num_groups;

  std::vector<float> q(size_t(c.num_heads) * c.head_dim);
  for (float& x : q) x = normal(rng);
  // Keys: group g's pair d holds its 16 keys' dims 2d, 2d + 1 interleaved, key_pair_stride apart.
  std::vector<std::vector<uint16_t>> key_storage(size_t(c.num_groups));
  std::vector<const uint16_t*> key_groups(size_t(c.num_groups));
  for (int32_t g = 0; g < c.num_groups; ++g) {
    key_storage[size_t(g)].resize(size_t(num_pairs) * c.key_pair_stride);
    for (uint16_t& x : key_storage[size_t(g)]) x = to_bf16(normal(rng));
    key_groups[size_t(g)] = key_storage[size_t(g)].data();
  }
  const size_t scores_stride = size_t(num_slots) + 16;
  std::vector<uint16_t> q_scratch(4 * size_t(c.head_dim));
  std::vector<float> together(size_t(c.num_heads) * scores_stride), alone(scores_stride);
  kernels.score_key_groups(q.data(), c.num_heads, q_scratch.data(), key_groups.data(), c.num_groups, c.key_pair_stride,
                           c.head_dim, together.data(), scores_stride);
  for (int32_t h = 0; h < c.num_heads; ++h) {
    kernels.score_key_groups(q.data() + size_t(h) * c.head_dim, 1, q_scratch.data(), key_groups.data(), c.num_groups,
                             c.key_pair_stride, c.head_dim, alone.data(), scores_stride);
    for (int32_t i = 0; i < num_slots; ++i) {
      const float got = together[size_t(h) * scores_stride + size_t(i)];
      if (std::memcmp(&got, &alone[size_t(i)], sizeof got) != 0) {
        fail(seed, kernel, describe(c) + ": head " + std::to_string(h) + " key " + std::to_string(i) + " scores " +
                               std::to_string(got) + " among the heads, " + std::to_string(alone[size_t(i)]) + " alone");
      }
      // Within 1e-4 of the fp64 dot over the stored keys: avx512 holds q to 16 bits (two bf16 halves).
      double exact = 0, magnitude = 0;
      const uint16_t* pairs = key_groups[size_t(i / 16)];
      for (int32_t d = 0; d < c.head_dim; ++d) {
        const double key = from_bf16(pairs[size_t(d / 2) * c.key_pair_stride + size_t(i % 16) * 2 + size_t(d % 2)]);
        exact += double(q[size_t(h) * c.head_dim + size_t(d)]) * key;
        magnitude += std::fabs(double(q[size_t(h) * c.head_dim + size_t(d)]) * key);
      }
      if (std::fabs(got - exact) > kTolerance * magnitude) {
        fail(seed, kernel, describe(c) + ": head " + std::to_string(h) + " key " + std::to_string(i) + " score " +
                               std::to_string(got) + ", fp64 " + std::to_string(exact));
      }
    }
  }

  // Values: slot i in pair i / 2 at value_groups[i / 16] + (i / 2 % 8) * 2 * head_dim; slots
  // outside [skip, skip + num_visible) hold NaN, which no sum may read.
  std::vector<std::vector<uint16_t>> value_storage(size_t(c.num_groups));
  std::vector<const uint16_t*> value_groups(size_t(c.num_groups));
  const uint16_t nan_bf16 = 0x7fc0;
  for (int32_t g = 0; g < c.num_groups; ++g) {
    std::vector<uint16_t>& values = value_storage[size_t(g)];
    values.resize(16 * size_t(c.head_dim));
    for (int32_t p = 0; p < 8; ++p) {
      for (int32_t d = 0; d < c.head_dim; ++d) {
        for (int32_t parity = 0; parity < 2; ++parity) {
          const int32_t slot = 16 * g + 2 * p + parity;
          const bool visible = slot >= c.skip && slot < c.skip + c.num_visible;
          values[size_t(p) * 2 * c.head_dim + size_t(d) * 2 + size_t(parity)] = visible ? to_bf16(normal(rng)) : nan_bf16;
        }
      }
    }
    value_groups[size_t(g)] = values.data();
  }
  const size_t numerators_stride = scores_stride;
  std::vector<float> numerators(size_t(c.num_heads) * numerators_stride);
  for (float& x : numerators) x = uniform(rng);
  std::vector<uint16_t> probs_scratch(4 * (size_t(c.skip) + size_t(c.num_visible) + 1));
  std::vector<float> out_together(size_t(c.num_heads) * c.head_dim), out_alone(size_t(c.head_dim));
  kernels.sum_value_groups(numerators.data(), numerators_stride, c.num_heads, c.skip, c.num_visible, probs_scratch.data(),
                           value_groups.data(), c.head_dim, out_together.data());
  for (int32_t h = 0; h < c.num_heads; ++h) {
    kernels.sum_value_groups(numerators.data() + size_t(h) * numerators_stride, numerators_stride, 1, c.skip,
                             c.num_visible, probs_scratch.data(), value_groups.data(), c.head_dim, out_alone.data());
    for (int32_t d = 0; d < c.head_dim; ++d) {
      const float got = out_together[size_t(h) * c.head_dim + size_t(d)];
      if (!std::isfinite(got)) fail(seed, kernel, describe(c) + ": a slot outside the visible range was read (head " + std::to_string(h) + ")");
      if (std::memcmp(&got, &out_alone[size_t(d)], sizeof got) != 0) {
        fail(seed, kernel, describe(c) + ": head " + std::to_string(h) + " dim " + std::to_string(d) + " sums to " +
                               std::to_string(got) + " among the heads, " + std::to_string(out_alone[size_t(d)]) + " alone");
      }
      double exact = 0, magnitude = 0;
      for (int32_t i = c.skip; i < c.skip + c.num_visible; ++i) {
        const double value = from_bf16(value_groups[size_t(i / 16)][size_t(i / 2 % 8) * 2 * c.head_dim + size_t(d) * 2 + size_t(i % 2)]);
        const double numerator = numerators[size_t(h) * numerators_stride + size_t(i)];
        exact += numerator * value;
        magnitude += std::fabs(numerator * value);
      }
      if (std::fabs(got - exact) > kTolerance * magnitude) {
        fail(seed, kernel, describe(c) + ": head " + std::to_string(h) + " dim " + std::to_string(d) + " sum " +
                               std::to_string(got) + ", fp64 " + std::to_string(exact));
      }
    }
  }
  return size_t(c.num_heads) * (size_t(num_slots) + size_t(c.head_dim));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: attention_heads_test SEED KERNEL...\n");
    return 2;
  }
  const uint32_t seed = uint32_t(std::strtoul(argv[1], nullptr, 10));
  for (int arg = 2; arg < argc; ++arg) {
    const std::string kernel = argv[arg];
    const KernelTable& kernels = table_named(kernel);
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> heads(1, 6), dims(1, 4), groups(1, 9), stride_pad(0, 2);
    size_t num_outputs = 0;
    constexpr int kCases = 200;
    for (int i = 0; i < kCases; ++i) {
      Case c{};
      c.num_heads = heads(rng);
      c.head_dim = 16 * dims(rng);
      c.num_groups = groups(rng);
      c.key_pair_stride = size_t(32 + 32 * stride_pad(rng));
      const int32_t num_slots = 16 * c.num_groups;
      c.skip = std::uniform_int_distribution<int32_t>(0, std::min(15, num_slots - 1))(rng);
      c.num_visible = std::uniform_int_distribution<int32_t>(1, num_slots - c.skip)(rng);
      num_outputs += check_case(kernels, kernel, seed, c, rng);
    }
    std::printf("%s: %d cases, %zu outputs, each head's bits the same alone and among its kv head's heads\n", kernel.c_str(),
                kCases, num_outputs);
  }
  return 0;
}
