// Sampling on the device, one 1024-thread block per row, with the CPU sampler's semantics and
// arithmetic (src/sampler.cc through shared/sampling_math.h): the raw argmax (ties to the lowest
// id) and log-softmax; greedy, or min-p's survivors in id order, sorted by (logit desc, id asc)
// when top-k or top-p needs an order, probabilities e^((logit - max) / T) in double, and the
// top-p cut and inverse-CDF draw summed serially in candidate order by one thread, so the same
// logits give the CPU's token.
#include <cfloat>
#include <cmath>

#include "common.cuh"
#include "kernels.cuh"
#include "reduce.cuh"
#include "shared/sampling_math.h"

namespace conduit {
namespace cuda {

namespace {

constexpr int kThreads = 1024;

struct Best {
  float value;
  int32_t index;
};

__device__ __forceinline__ Best better(Best a, Best b) {
  return conduit::sampling::ranks_before(b.value, b.index, a.value, a.index) ? b : a;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const float* __restrict__ logits, int32_t vocab_size,
                                                          const DeviceSamplingRow* __restrict__ rows,
                                                          SamplerScratchDevice scratch, size_t key_stride,
                                                          int32_t* tokens, float* logprobs) {
  __shared__ float best_values[kThreads / 32];
  __shared__ int32_t best_indices[kThreads / 32];
  __shared__ double sums[kThreads / 32];
  __shared__ int32_t counts[kThreads + 1];
  const DeviceSamplingRow row = rows[blockIdx.x];
  const float* x = logits + size_t(row.logits_row) * vocab_size;
  const int tid = threadIdx.x;

  // Raw argmax, ties to the lowest id: each thread's contiguous range, then a fixed tree.
  const int32_t per_thread = ceil_div(vocab_size, kThreads);
  const int32_t begin = min(vocab_size, tid * per_thread);
  const int32_t end = min(vocab_size, begin + per_thread);
  Best best{-INFINITY, vocab_size};
  for (int32_t id = begin; id < end; ++id) best = better(best, Best{x[id], id});
  for (int offset = 16; offset > 0; offset >>= 1) {
    const Best other{__shfl_xor_sync(0xffffffffu, best.value, offset), __shfl_xor_sync(0xffffffffu, best.index, offset)};
    best = better(best, other);
  }
  if ((tid & 31) == 0) {
    best_values[tid / 32] = best.value;
    best_indices[tid / 32] = best.index;
  }
  __syncthreads();
  if (tid == 0) {
    Best all{best_values[0], best_indices[0]};
    for (int w = 1; w < kThreads / 32; ++w) all = better(all, Best{best_values[w], best_indices[w]});
    best_values[0] = all.value;
    best_indices[0] = all.index;
  }
  __syncthreads();
  const float max_logit = best_values[0];
  const int32_t argmax = best_indices[0];

  // log(sum e^(logit - max)) in double.
  double partial = 0.0;
  for (int32_t id = begin; id < end; ++id) partial += exp(double(x[id]) - double(max_logit));
  const double log_sum = log(block_sum(partial, sums));

  const bool greedy = row.temperature <= 0.0f || row.top_k == 1 || max_logit == INFINITY;
  int32_t token = argmax;
  if (!greedy) {
    int32_t* ids = scratch.ids + size_t(blockIdx.x) * vocab_size;
    double* probs = scratch.probs + size_t(blockIdx.x) * vocab_size;
    // Candidates in id order: min-p's survivors, or every id.
    const double threshold =
        row.min_p > 0.0f ? conduit::sampling::min_p_threshold(max_logit, row.temperature, log(double(row.min_p))) : -INFINITY;
    int32_t kept = 0;
    for (int32_t id = begin; id < end; ++id) kept += double(x[id]) >= threshold ? 1 : 0;
    counts[tid + 1] = kept;
    __syncthreads();
    if (tid == 0) {
      counts[0] = 0;
      for (int i = 1; i <= kThreads; ++i) counts[i] += counts[i - 1];
    }
    __syncthreads();
    int32_t write = counts[tid];
    for (int32_t id = begin; id < end; ++id) {
      if (double(x[id]) >= threshold) ids[write++] = id;
    }
    int32_t num_candidates = counts[kThreads];
    __syncthreads();
    const bool top_p_active = row.top_p < 1.0f;
    const bool top_k_active = row.top_k > 0 && row.top_k < num_candidates;
    if (top_k_active || top_p_active) {
      // Bitonic sort of (logit desc, id asc) keys; padding keys sort last.
      uint64_t* keys = scratch.keys + size_t(blockIdx.x) * key_stride;
      int32_t size = 1;
      while (size < num_candidates) size <<= 1;
      for (int32_t i = tid; i < size; i += kThreads) keys[i] = i < num_candidates ? conduit::sampling::candidate_key(x[ids[i]], ids[i]) : ~0ull;
      __syncthreads();
      for (int32_t k = 2; k <= size; k <<= 1) {
        for (int32_t j = k >> 1; j > 0; j >>= 1) {
          for (int32_t i = tid; i < size; i += kThreads) {
            const int32_t partner = i ^ j;
            if (partner > i) {
              const bool ascending = (i & k) == 0;
              const uint64_t a = keys[i];
              const uint64_t b = keys[partner];
              if ((a > b) == ascending) {
                keys[i] = b;
                keys[partner] = a;
              }
            }
          }
          __syncthreads();
        }
      }
      if (top_k_active) num_candidates = row.top_k;
      for (int32_t i = tid; i < num_candidates; i += kThreads) ids[i] = int32_t(uint32_t(keys[i]));
      __syncthreads();
    }
    const double inverse_temperature = 1.0 / double(row.temperature);
    for (int32_t i = tid; i < num_candidates; i += kThreads) {
      probs[i] = exp((double(x[ids[i]]) - max_logit) * inverse_temperature);
    }
    __syncthreads();
    if (tid == 0) {
      double total = 0;
      for (int32_t i = 0; i < num_candidates; ++i) total += probs[i];
      const double u = conduit::sampling::uniform_from_counter(row.seed, uint64_t(uint32_t(row.output_index)));
      best_indices[0] = ids[conduit::sampling::cut_and_draw(probs, num_candidates, total, row.top_p, u)];
    }
    __syncthreads();
    token = best_indices[0];
  }
  if (tid == 0) {
    tokens[blockIdx.x] = token;
    logprobs[blockIdx.x] = float(double(x[token]) - double(max_logit) - log_sum);
  }
}

}  // namespace

size_t sampler_key_stride(int32_t vocab_size) {
  size_t size = 1;
  while (size < size_t(vocab_size)) size <<= 1;
  return size;
}

void launch_sample(const float* logits, int32_t vocab_size, const DeviceSamplingRow* rows, int32_t num_rows,
                   const SamplerScratchDevice& scratch, int32_t* tokens, float* logprobs, cudaStream_t stream) {
  if (num_rows == 0) return;
  if (num_rows > scratch.rows_capacity) throw Error(CD_ERR_INTERNAL, "sampler scratch too small");
  sample_kernel<<<num_rows, kThreads, 0, stream>>>(logits, vocab_size, rows, scratch, sampler_key_stride(vocab_size),
                                                   tokens, logprobs);
  CDC_CHECK_LAUNCH();
}

}  // namespace cuda
}  // namespace conduit
