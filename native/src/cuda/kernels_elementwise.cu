// Embedding, RMS norm, the per-token position work (biases, head norms, RoPE, the KV write into
// paged blocks), gated activations, residual adds and soft-caps. One block (or warp) per row:
// nothing sums across rows.
#include <cmath>

#include "common.cuh"
#include "kernels.cuh"
#include "reduce.cuh"
#include "segment_fold.h"

namespace conduit {
namespace cuda {

namespace {

constexpr int kRowThreads = 256;

__global__ void embed_kernel(const __nv_bfloat16* table, int32_t hidden_size, const int32_t* token_ids, float scale,
                             float* hidden) {
  const int32_t t = blockIdx.x;
  const __nv_bfloat16* row = table + size_t(token_ids[t]) * hidden_size;
  float* out = hidden + size_t(t) * hidden_size;
  for (int32_t i = threadIdx.x; i < hidden_size; i += blockDim.x) {
    const float value = __bfloat162float(row[i]);
    out[i] = scale == 1.0f ? value : value * scale;
  }
}

__device__ __forceinline__ void store_as(float* y, int32_t i, float value) { y[i] = value; }
__device__ __forceinline__ void store_as(__nv_bfloat16* y, int32_t i, float value) { y[i] = __float2bfloat16_rn(value); }

// The CPU's rms_norm: inv_rms = 1 / sqrt(sum(x^2) / n + eps) in double, rounded to float, then
// weight * (x * inv_rms).
template <typename Out>
__global__ void rms_norm_kernel(const float* x, int32_t x_stride, const float* weight, int32_t width, double eps,
                                Out* y, int32_t y_stride) {
  __shared__ float shared[kRowThreads / 32];
  const float* row = x + size_t(blockIdx.x) * x_stride;
  float partial = 0.0f;
  for (int32_t i = threadIdx.x; i < width; i += blockDim.x) partial += row[i] * row[i];
  const float sum_squares = block_sum(partial, shared);
  const float inv_rms = float(1.0 / sqrt(double(sum_squares) / width + eps));
  Out* out = y + size_t(blockIdx.x) * y_stride;
  for (int32_t i = threadIdx.x; i < width; i += blockDim.x) store_as(out, i, weight[i] * (row[i] * inv_rms));
}

// A warp's RMS norm of one head in place (q_norm, k_norm).
__device__ void norm_head_warp(float* head, const float* weight, int32_t head_dim, double eps) {
  float partial = 0.0f;
  for (int32_t i = threadIdx.x & 31; i < head_dim; i += 32) partial += head[i] * head[i];
  const float sum_squares = warp_sum(partial);
  const float inv_rms = float(1.0 / sqrt(double(sum_squares) / head_dim + eps));
  __syncwarp();
  for (int32_t i = threadIdx.x & 31; i < head_dim; i += 32) head[i] = weight[i] * (head[i] * inv_rms);
  __syncwarp();
}

__device__ void rotate_head_warp(float* head, int32_t rotary_dim, const float* cos_row, const float* sin_row) {
  const int32_t half = rotary_dim / 2;
  for (int32_t i = threadIdx.x & 31; i < half; i += 32) {
    const float a = head[i];
    const float b = head[i + half];
    head[i] = a * cos_row[i] - b * sin_row[i];
    head[i + half] = b * cos_row[i] + a * sin_row[i];
  }
  __syncwarp();
}

__device__ __forceinline__ __nv_bfloat16* cache_row(const RopeKvArgs& a, int32_t kv, int32_t slot, int32_t kv_head) {
  const int32_t block = slot / a.block_size;
  const size_t region = ((size_t(block) * a.layers_per_block + size_t(a.kv_slot)) * 2 + size_t(kv)) * a.num_kv_heads + kv_head;
  return a.cache + (region * a.block_size + size_t(slot % a.block_size)) * a.head_dim;
}

// One block per token: the cos/sin row in shared memory, then one warp per head.
__global__ void rope_kv_kernel(RopeKvArgs a) {
  extern __shared__ float rope_shared[];  // cos[half], sin[half]
  const int32_t t = blockIdx.x;
  const int32_t half = a.rotary_dim / 2;
  float* cos_row = rope_shared;
  float* sin_row = rope_shared + half;
  const int32_t position = a.positions[t];
  for (int32_t i = threadIdx.x; i < half; i += blockDim.x) {
    const double angle = double(position) * a.inv_freq[i];
    cos_row[i] = float(cos(angle) * a.attention_scaling);
    sin_row[i] = float(sin(angle) * a.attention_scaling);
  }
  __syncthreads();
  const int32_t warp = threadIdx.x / 32;
  const int32_t num_warps = blockDim.x / 32;
  const int32_t q_size = a.num_heads * a.head_dim;
  const int32_t kv_size = a.num_kv_heads * a.head_dim;
  const int32_t slot = a.slots[t];
  const int32_t lane = threadIdx.x & 31;
  for (int32_t h = warp; h < a.num_heads + 2 * a.num_kv_heads; h += num_warps) {
    if (h < a.num_heads) {
      float* head = a.q + size_t(t) * q_size + size_t(h) * a.head_dim;
      if (a.q_bias != nullptr) {
        for (int32_t i = lane; i < a.head_dim; i += 32) head[i] += a.q_bias[h * a.head_dim + i];
        __syncwarp();
      }
      if (a.q_norm != nullptr) norm_head_warp(head, a.q_norm, a.head_dim, a.eps);
      rotate_head_warp(head, a.rotary_dim, cos_row, sin_row);
    } else if (h < a.num_heads + a.num_kv_heads) {
      const int32_t kv_head = h - a.num_heads;
      float* head = a.k + size_t(t) * kv_size + size_t(kv_head) * a.head_dim;
      if (a.k_bias != nullptr) {
        for (int32_t i = lane; i < a.head_dim; i += 32) head[i] += a.k_bias[kv_head * a.head_dim + i];
        __syncwarp();
      }
      if (a.k_norm != nullptr) norm_head_warp(head, a.k_norm, a.head_dim, a.eps);
      rotate_head_warp(head, a.rotary_dim, cos_row, sin_row);
      if (slot >= 0) {
        __nv_bfloat16* out = cache_row(a, 0, slot, kv_head);
        for (int32_t i = lane; i < a.head_dim; i += 32) out[i] = __float2bfloat16_rn(head[i]);
      }
    } else {
      const int32_t kv_head = h - a.num_heads - a.num_kv_heads;
      const float* head = a.v + size_t(t) * kv_size + size_t(kv_head) * a.head_dim;
      if (slot >= 0) {
        __nv_bfloat16* out = cache_row(a, 1, slot, kv_head);
        for (int32_t i = lane; i < a.head_dim; i += 32) {
          const float bias = a.v_bias != nullptr ? a.v_bias[kv_head * a.head_dim + i] : 0.0f;
          out[i] = __float2bfloat16_rn(a.v_bias != nullptr ? head[i] + bias : head[i]);
        }
      }
    }
  }
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ float gelu_tanh(float x) {
  const float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(inner));
}

__global__ void gated_activation_kernel(const float* gate, const float* up, int32_t width, int32_t activation,
                                        float alpha, float limit, __nv_bfloat16* out, int32_t out_stride) {
  const size_t row = blockIdx.y;
  const int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= width) return;
  const float g = gate[row * width + i];
  const float u = up[row * width + i];
  float value;
  if (activation == CD_ACTIVATION_GELU_TANH) {
    value = gelu_tanh(g) * u;
  } else if (activation == CD_ACTIVATION_CLAMPED_SWIGLU) {
    const float gc = fminf(g, limit);
    const float uc = fminf(fmaxf(u, -limit), limit);
    value = (uc + 1.0f) * (gc / (1.0f + expf(-alpha * gc)));
  } else {
    value = silu(g) * u;
  }
  out[row * out_stride + i] = __float2bfloat16_rn(value);
}

__global__ void add_to_residual_kernel(float* hidden, float* layer_out, const float* bias, const float* norm_weight,
                                       int32_t width, double eps) {
  __shared__ float shared[kRowThreads / 32];
  float* out = layer_out + size_t(blockIdx.x) * width;
  float* h = hidden + size_t(blockIdx.x) * width;
  if (bias != nullptr) {
    for (int32_t i = threadIdx.x; i < width; i += blockDim.x) out[i] += bias[i];
  }
  float inv_rms = 1.0f;
  if (norm_weight != nullptr) {
    float partial = 0.0f;
    for (int32_t i = threadIdx.x; i < width; i += blockDim.x) partial += out[i] * out[i];
    const float sum_squares = block_sum(partial, shared);
    inv_rms = float(1.0 / sqrt(double(sum_squares) / width + eps));
  }
  for (int32_t i = threadIdx.x; i < width; i += blockDim.x) {
    const float value = norm_weight != nullptr ? norm_weight[i] * (out[i] * inv_rms) : out[i];
    h[i] += value;
  }
}

__global__ void softcap_kernel(float* x, size_t count, float cap) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) x[i] = cap * tanhf(x[i] / cap);
}

__global__ void gather_rows_kernel(const float* src, int32_t width, const int32_t* rows, float* dst) {
  const float* from = src + size_t(rows[blockIdx.x]) * width;
  float* to = dst + size_t(blockIdx.x) * width;
  for (int32_t i = threadIdx.x; i < width; i += blockDim.x) to[i] = from[i];
}

__global__ void fold_segments_kernel(const float* partials, int32_t num_rows, int32_t n, float* y, int32_t y_stride,
                                     bool accumulate) {
  const int32_t col = blockIdx.x * blockDim.x + threadIdx.x;
  const int32_t row = blockIdx.y;
  if (col >= n) return;
  const float sum = fold_segments(partials + size_t(row) * n + col, size_t(num_rows) * size_t(n));
  float* out = y + size_t(row) * y_stride + col;
  *out = accumulate ? *out + sum : sum;
}

__global__ void pack_segments_kernel(const __nv_bfloat16* src, int32_t src_stride, SegmentSlots slots,
                                     __nv_bfloat16* dst) {
  const int32_t t = blockIdx.y;
  const int32_t width = (slots.end - slots.first) * slots.slot;
  for (int32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < width; j += gridDim.x * blockDim.x) {
    const int32_t column = packed_source_column(slots.bounds, slots.first, slots.slot, j);
    dst[size_t(t) * width + j] = column >= 0 ? src[size_t(t) * src_stride + column] : __float2bfloat16_rn(0.0f);
  }
}

}  // namespace

void launch_embed(const __nv_bfloat16* table, int32_t hidden_size, const int32_t* token_ids, int32_t num_tokens,
                  float scale, float* hidden, cudaStream_t stream) {
  if (num_tokens == 0) return;
  embed_kernel<<<num_tokens, kRowThreads, 0, stream>>>(table, hidden_size, token_ids, scale, hidden);
  CDC_CHECK_LAUNCH();
}

void launch_rms_norm_f32(const float* x, int32_t x_stride, const float* weight, int32_t width, double eps,
                         int32_t num_rows, float* y, int32_t y_stride, cudaStream_t stream) {
  if (num_rows == 0) return;
  rms_norm_kernel<float><<<num_rows, kRowThreads, 0, stream>>>(x, x_stride, weight, width, eps, y, y_stride);
  CDC_CHECK_LAUNCH();
}

void launch_rms_norm_bf16(const float* x, int32_t x_stride, const float* weight, int32_t width, double eps,
                          int32_t num_rows, __nv_bfloat16* y, int32_t y_stride, cudaStream_t stream) {
  if (num_rows == 0) return;
  rms_norm_kernel<__nv_bfloat16><<<num_rows, kRowThreads, 0, stream>>>(x, x_stride, weight, width, eps, y, y_stride);
  CDC_CHECK_LAUNCH();
}

void launch_rope_kv(const RopeKvArgs& args, cudaStream_t stream) {
  if (args.num_tokens == 0) return;
  const size_t shared_bytes = size_t(args.rotary_dim) * sizeof(float);
  rope_kv_kernel<<<args.num_tokens, kRowThreads, shared_bytes, stream>>>(args);
  CDC_CHECK_LAUNCH();
}

void launch_gated_activation(const float* gate, const float* up, int32_t width, int32_t num_rows, int32_t activation,
                             float alpha, float limit, __nv_bfloat16* out, int32_t out_stride, cudaStream_t stream) {
  if (num_rows == 0) return;
  const dim3 grid(ceil_div(width, kRowThreads), num_rows);
  gated_activation_kernel<<<grid, kRowThreads, 0, stream>>>(gate, up, width, activation, alpha, limit, out, out_stride);
  CDC_CHECK_LAUNCH();
}

void launch_add_to_residual(float* hidden, float* layer_out, const float* bias, const float* norm_weight,
                            int32_t width, double eps, int32_t num_rows, cudaStream_t stream) {
  if (num_rows == 0) return;
  add_to_residual_kernel<<<num_rows, kRowThreads, 0, stream>>>(hidden, layer_out, bias, norm_weight, width, eps);
  CDC_CHECK_LAUNCH();
}

void launch_softcap(float* x, size_t count, float cap, cudaStream_t stream) {
  if (count == 0) return;
  softcap_kernel<<<unsigned((count + kRowThreads - 1) / kRowThreads), kRowThreads, 0, stream>>>(x, count, cap);
  CDC_CHECK_LAUNCH();
}

void launch_gather_rows(const float* src, int32_t width, const int32_t* rows, int32_t num_rows, float* dst,
                        cudaStream_t stream) {
  if (num_rows == 0) return;
  gather_rows_kernel<<<num_rows, kRowThreads, 0, stream>>>(src, width, rows, dst);
  CDC_CHECK_LAUNCH();
}

void launch_fold_segments(const float* partials, int32_t num_rows, int32_t n, float* y, int32_t y_stride,
                          bool accumulate, cudaStream_t stream) {
  if (num_rows == 0) return;
  const dim3 grid((n + kRowThreads - 1) / kRowThreads, num_rows);
  fold_segments_kernel<<<grid, kRowThreads, 0, stream>>>(partials, num_rows, n, y, y_stride, accumulate);
  CDC_CHECK_LAUNCH();
}

void launch_pack_segments(const __nv_bfloat16* src, int32_t src_stride, int32_t num_rows, const SegmentSlots& slots,
                          __nv_bfloat16* dst, cudaStream_t stream) {
  if (num_rows == 0) return;
  const int32_t width = (slots.end - slots.first) * slots.slot;
  const dim3 grid((width + kRowThreads - 1) / kRowThreads, num_rows);
  pack_segments_kernel<<<grid, kRowThreads, 0, stream>>>(src, src_stride, slots, dst);
  CDC_CHECK_LAUNCH();
}


}  // namespace cuda
}  // namespace conduit
