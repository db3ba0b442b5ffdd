// The mixture-of-experts MLP's own kernels (the expert matmuls are launch_grouped_gemm): router
// logits, routing, grouping by expert, and the combine. Batch invariance as on the CPU
// (src/moe.h): a token's routing reads only its own logits, each grouped row's matmul chains are
// those of any launch, and a token's experts are added in its own slot order by one thread per
// element. Which other tokens chose the same experts changes only which rows a block runs.
#include <cmath>

#include "common.cuh"
#include "kernels.cuh"
#include "reduce.cuh"

namespace conduit {
namespace cuda {

namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void router_logits_kernel(const float* x, int32_t x_stride, int32_t num_tokens, const float* router,
                                     int32_t num_experts, int32_t hidden_size, const float* bias, float* logits) {
  const int32_t pair = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (pair >= num_tokens * num_experts) return;
  const int32_t t = pair / num_experts;
  const int32_t e = pair % num_experts;
  const float* row = x + size_t(t) * x_stride;
  const float* weights = router + size_t(e) * hidden_size;
  float partial = 0.0f;
  for (int32_t i = threadIdx.x & 31; i < hidden_size; i += 32) partial += row[i] * weights[i];
  const float sum = warp_sum(partial);
  if ((threadIdx.x & 31) == 0) logits[pair] = bias == nullptr ? sum : sum + bias[e];
}

// src/moe.cc's route(), step for step.
__global__ void route_kernel(const float* logits_all, int32_t num_tokens, int32_t num_experts, int32_t top_k,
                             int32_t routing, bool norm_topk_prob, int32_t* slot_experts, float* slot_weights) {
  const int32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= num_tokens) return;
  const float* logits = logits_all + size_t(t) * num_experts;
  int32_t* experts = slot_experts + size_t(t) * top_k;
  float* weights = slot_weights + size_t(t) * top_k;
  for (int32_t k = 0; k < top_k; ++k) {
    int32_t best = -1;
    for (int32_t e = 0; e < num_experts; ++e) {
      bool taken = false;
      for (int32_t j = 0; j < k; ++j) taken = taken || experts[j] == e;
      if (taken) continue;
      if (best < 0 || logits[e] > logits[best]) best = e;
    }
    experts[k] = best;
  }
  double max = logits[experts[0]];
  double denominator = 0.0;
  if (routing == CD_ROUTING_SOFTMAX_TOPK && !norm_topk_prob) {
    for (int32_t e = 0; e < num_experts; ++e) max = fmax(max, double(logits[e]));
    for (int32_t e = 0; e < num_experts; ++e) denominator += exp(double(logits[e]) - max);
  } else {
    for (int32_t k = 0; k < top_k; ++k) denominator += exp(double(logits[experts[k]]) - max);
  }
  for (int32_t k = 0; k < top_k; ++k) weights[k] = float(exp(double(logits[experts[k]]) - max) / denominator);
}

// One block: thread e counts expert e's slots, thread 0 turns the counts into starts, thread e
// places its slots in slot (batch) order.
__global__ void group_kernel(const int32_t* slot_experts, int32_t num_slots, int32_t top_k, int32_t num_experts,
                             int32_t* expert_starts, int32_t* slot_rows, int32_t* row_tokens, int32_t* row_experts) {
  for (int32_t e = threadIdx.x; e < num_experts; e += blockDim.x) {
    int32_t count = 0;
    for (int32_t slot = 0; slot < num_slots; ++slot) count += slot_experts[slot] == e ? 1 : 0;
    expert_starts[e + 1] = count;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    expert_starts[0] = 0;
    for (int32_t e = 0; e < num_experts; ++e) expert_starts[e + 1] += expert_starts[e];
  }
  __syncthreads();
  for (int32_t e = threadIdx.x; e < num_experts; e += blockDim.x) {
    int32_t row = expert_starts[e];
    for (int32_t slot = 0; slot < num_slots; ++slot) {
      if (slot_experts[slot] != e) continue;
      slot_rows[slot] = row;
      row_tokens[row] = slot / top_k;
      row_experts[row] = e;
      ++row;
    }
  }
}

__global__ void gather_bf16_kernel(const __nv_bfloat16* x, int32_t x_stride, const int32_t* row_tokens, int32_t width,
                                   __nv_bfloat16* rows, int32_t rows_stride) {
  const __nv_bfloat16* source = x + size_t(row_tokens[blockIdx.x]) * x_stride;
  __nv_bfloat16* target = rows + size_t(blockIdx.x) * rows_stride;
  for (int32_t i = threadIdx.x; i < width; i += blockDim.x) target[i] = source[i];
}

__global__ void expert_bias_kernel(float* y, int32_t width, const int32_t* row_experts, const float* bias) {
  float* row = y + size_t(blockIdx.x) * width;
  const float* b = bias + size_t(row_experts[blockIdx.x]) * width;
  for (int32_t i = threadIdx.x; i < width; i += blockDim.x) row[i] += b[i];
}

__global__ void combine_kernel(const float* expert_out, int32_t hidden_size, const int32_t* slot_rows,
                               const int32_t* slot_experts, const float* slot_weights, const float* down_bias,
                               int32_t top_k, float* hidden) {
  const int32_t t = blockIdx.x;
  for (int32_t i = threadIdx.x; i < hidden_size; i += blockDim.x) {
    float acc = 0.0f;
    for (int32_t k = 0; k < top_k; ++k) {
      const int32_t slot = t * top_k + k;
      float value = expert_out[size_t(slot_rows[slot]) * hidden_size + i];
      if (down_bias != nullptr) value = value + down_bias[size_t(slot_experts[slot]) * hidden_size + i];
      const float weighted = slot_weights[slot] * value;
      acc = k == 0 ? weighted : acc + weighted;
    }
    float* out = hidden + size_t(t) * hidden_size + i;
    *out = *out + acc;
  }
}

// Row i of the grouped expert outputs from the slot of the rank that holds its expert.
__global__ void select_expert_rows_kernel(const float* gathered, size_t slot_floats, int32_t hidden_size,
                                          const int32_t* row_experts, const int32_t* expert_owners, float* out) {
  const float* source = gathered + size_t(expert_owners[row_experts[blockIdx.x]]) * slot_floats +
                        size_t(blockIdx.x) * hidden_size;
  float* target = out + size_t(blockIdx.x) * hidden_size;
  for (int32_t i = threadIdx.x; i < hidden_size; i += blockDim.x) target[i] = source[i];
}

}  // namespace

void launch_select_expert_rows(const float* gathered, size_t slot_floats, int32_t hidden_size,
                               const int32_t* row_experts, const int32_t* expert_owners, int32_t num_rows, float* out,
                               cudaStream_t stream) {
  if (num_rows == 0) return;
  select_expert_rows_kernel<<<num_rows, 256, 0, stream>>>(gathered, slot_floats, hidden_size, row_experts,
                                                          expert_owners, out);
  CDC_CHECK_LAUNCH();
}

void launch_router_logits(const float* x, int32_t x_stride, int32_t num_tokens, const float* router, int32_t num_experts,
                          int32_t hidden_size, const float* bias, float* logits, cudaStream_t stream) {
  const int32_t pairs = num_tokens * num_experts;
  if (pairs == 0) return;
  router_logits_kernel<<<ceil_div(pairs, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream>>>(
      x, x_stride, num_tokens, router, num_experts, hidden_size, bias, logits);
  CDC_CHECK_LAUNCH();
}

void launch_moe_route(const float* logits, int32_t num_tokens, int32_t num_experts, int32_t top_k, int32_t routing,
                      bool norm_topk_prob, int32_t* slot_experts, float* slot_weights, cudaStream_t stream) {
  if (num_tokens == 0) return;
  route_kernel<<<ceil_div(num_tokens, 128), 128, 0, stream>>>(logits, num_tokens, num_experts, top_k, routing,
                                                              norm_topk_prob, slot_experts, slot_weights);
  CDC_CHECK_LAUNCH();
}

void launch_moe_group(const int32_t* slot_experts, int32_t num_slots, int32_t top_k, int32_t num_experts,
                      int32_t* expert_starts, int32_t* slot_rows, int32_t* row_tokens, int32_t* row_experts,
                      cudaStream_t stream) {
  group_kernel<<<1, 256, 0, stream>>>(slot_experts, num_slots, top_k, num_experts, expert_starts, slot_rows, row_tokens,
                                      row_experts);
  CDC_CHECK_LAUNCH();
}

void launch_gather_bf16(const __nv_bfloat16* x, int32_t x_stride, const int32_t* row_tokens, int32_t num_rows,
                        int32_t width, __nv_bfloat16* rows, int32_t rows_stride, cudaStream_t stream) {
  if (num_rows == 0) return;
  gather_bf16_kernel<<<num_rows, 256, 0, stream>>>(x, x_stride, row_tokens, width, rows, rows_stride);
  CDC_CHECK_LAUNCH();
}

void launch_expert_bias(float* y, int32_t width, int32_t num_rows, const int32_t* row_experts, const float* bias,
                        cudaStream_t stream) {
  if (num_rows == 0 || bias == nullptr) return;
  expert_bias_kernel<<<num_rows, 256, 0, stream>>>(y, width, row_experts, bias);
  CDC_CHECK_LAUNCH();
}

void launch_moe_combine(const float* expert_out, int32_t hidden_size, const int32_t* slot_rows,
                        const int32_t* slot_experts, const float* slot_weights, const float* down_bias, int32_t top_k,
                        int32_t num_tokens, float* hidden, cudaStream_t stream) {
  if (num_tokens == 0) return;
  combine_kernel<<<num_tokens, 256, 0, stream>>>(expert_out, hidden_size, slot_rows, slot_experts, slot_weights,
                                                 down_bias, top_k, hidden);
  CDC_CHECK_LAUNCH();
}

}  // namespace cuda
}  // namespace conduit
