// Paged attention over the block tables, with GQA: one block per (token, kv head, chunk of
// kKvChunkTokens positions) scores its visible keys for each query head of the group, keeps the
// chunk's max, sum of exponentials and weighted values; one block per (token, head) merges the
// chunks in position order. Chunks are cut at fixed positions (0, 256, 512, ...), so a token's
// output depends on its own context alone: the same alone or in a batch of 256, in one prefill
// or a decode step.
#include <cfloat>
#include <cmath>

#include "common.cuh"
#include "kernels.cuh"
#include "reduce.cuh"

namespace conduit {
namespace cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGroup = 16;  // query heads per kv head

__device__ __forceinline__ const __nv_bfloat16* kv_row(const AttentionArgs& a, int32_t kv, int32_t seq,
                                                       int32_t position, int32_t kv_head) {
  const int32_t block = a.block_tables[size_t(seq) * a.max_blocks_per_seq + position / a.block_size];
  const size_t region = ((size_t(block) * a.layers_per_block + size_t(a.kv_slot)) * 2 + size_t(kv)) * a.num_kv_heads + kv_head;
  return a.cache + (region * a.block_size + size_t(position % a.block_size)) * a.head_dim;
}

__device__ __forceinline__ int32_t first_visible(int32_t position, int32_t window) {
  return window == 0 ? 0 : max(0, position - window + 1);
}

// Partials per (token, head, chunk): [max, sum, values[head_dim]].
__device__ __forceinline__ float* partial_at(const AttentionArgs& a, int32_t t, int32_t head, int32_t chunk) {
  return a.partials + ((size_t(t) * a.num_heads + head) * a.num_chunks + chunk) * size_t(a.head_dim + 2);
}

__global__ void __launch_bounds__(kThreads) attention_chunk_kernel(AttentionArgs a) {
  extern __shared__ float shared[];
  const int32_t group_size = a.num_heads / a.num_kv_heads;
  float* q_shared = shared;                                     // [group][head_dim]
  float* scores = shared + group_size * a.head_dim;             // [group][kKvChunkTokens]
  __shared__ float reduce_shared[kWarps];
  const int32_t t = blockIdx.x / a.num_kv_heads;
  const int32_t kv_head = blockIdx.x % a.num_kv_heads;
  const int32_t chunk = blockIdx.y;
  const int32_t position = a.positions[t];
  const int32_t first_head = kv_head * group_size;
  const int32_t chunk_begin = max(chunk * kKvChunkTokens, position >= 0 ? first_visible(position, a.window) : 0);
  const int32_t chunk_end = min((chunk + 1) * kKvChunkTokens, position + 1);
  if (chunk_begin >= chunk_end) {
    // Nothing visible here (or a padding token): an empty partial the merge skips.
    for (int32_t g = threadIdx.x; g < group_size; g += blockDim.x) {
      float* p = partial_at(a, t, first_head + g, chunk);
      p[0] = -INFINITY;
      p[1] = 0.0f;
    }
    return;
  }
  const int32_t seq = a.token_seqs[t];
  const int32_t num_keys = chunk_end - chunk_begin;
  const int32_t q_size = a.num_heads * a.head_dim;
  for (int32_t i = threadIdx.x; i < group_size * a.head_dim; i += blockDim.x) {
    q_shared[i] = a.q[size_t(t) * q_size + size_t(first_head) * a.head_dim + i];
  }
  __syncthreads();
  // Scores: a warp per key, lanes over dims in a fixed stride, summed by the butterfly.
  const int32_t warp = threadIdx.x / 32;
  const int32_t lane = threadIdx.x & 31;
  for (int32_t j = warp; j < num_keys; j += kWarps) {
    const __nv_bfloat16* key = kv_row(a, 0, seq, chunk_begin + j, kv_head);
    for (int32_t g = 0; g < group_size; ++g) {
      const float* q = q_shared + g * a.head_dim;
      float partial = 0.0f;
      for (int32_t d = lane; d < a.head_dim; d += 32) partial += q[d] * __bfloat162float(key[d]);
      const float dot = warp_sum(partial);
      if (lane == 0) {
        scores[g * kKvChunkTokens + j] = a.softcap == 0.0f ? dot * a.scale : a.softcap * tanhf(dot * a.scale / a.softcap);
      }
    }
  }
  __syncthreads();
  // Per head: the chunk's max, numerators in place and their sum.
  for (int32_t g = 0; g < group_size; ++g) {
    float* s = scores + g * kKvChunkTokens;
    float local_max = -INFINITY;
    for (int32_t j = threadIdx.x; j < num_keys; j += blockDim.x) local_max = fmaxf(local_max, s[j]);
    const float chunk_max = block_max(local_max, reduce_shared);
    float local_sum = 0.0f;
    for (int32_t j = threadIdx.x; j < num_keys; j += blockDim.x) {
      const float p = expf(s[j] - chunk_max);
      s[j] = p;
      local_sum += p;
    }
    const float chunk_sum = block_sum(local_sum, reduce_shared);
    if (threadIdx.x == 0) {
      float* p = partial_at(a, t, first_head + g, chunk);
      p[0] = chunk_max;
      p[1] = chunk_sum;
    }
  }
  __syncthreads();
  // Weighted values: threads over dims, keys in position order.
  for (int32_t d = threadIdx.x; d < a.head_dim; d += blockDim.x) {
    float acc[kMaxGroup];
    for (int32_t g = 0; g < group_size; ++g) acc[g] = 0.0f;
    for (int32_t j = 0; j < num_keys; ++j) {
      const float v = __bfloat162float(kv_row(a, 1, seq, chunk_begin + j, kv_head)[d]);
      for (int32_t g = 0; g < group_size; ++g) acc[g] += scores[g * kKvChunkTokens + j] * v;
    }
    for (int32_t g = 0; g < group_size; ++g) partial_at(a, t, first_head + g, chunk)[2 + d] = acc[g];
  }
}

// Chunks merged in position order against the overall max (a sink joins the max and adds
// e^(sink - max) to the denominator last, as the CPU's softmax does).
__global__ void __launch_bounds__(kThreads) attention_merge_kernel(AttentionArgs a) {
  const int32_t t = blockIdx.x / a.num_heads;
  const int32_t head = blockIdx.x % a.num_heads;
  __nv_bfloat16* out = a.out + size_t(t) * a.out_stride + size_t(head) * a.head_dim;
  if (a.positions[t] < 0) {
    for (int32_t d = threadIdx.x; d < a.head_dim; d += blockDim.x) out[d] = __float2bfloat16_rn(0.0f);
    return;
  }
  float overall = -INFINITY;
  for (int32_t c = 0; c < a.num_chunks; ++c) overall = fmaxf(overall, partial_at(a, t, head, c)[0]);
  const float sink = a.sinks != nullptr ? a.sinks[head] : -INFINITY;
  overall = fmaxf(overall, sink);
  float denominator = 0.0f;
  for (int32_t c = 0; c < a.num_chunks; ++c) {
    const float* p = partial_at(a, t, head, c);
    if (p[0] == -INFINITY) continue;
    denominator += p[1] * expf(p[0] - overall);
  }
  if (sink != -INFINITY) denominator += expf(sink - overall);
  const float inv = 1.0f / denominator;
  for (int32_t d = threadIdx.x; d < a.head_dim; d += blockDim.x) {
    float value = 0.0f;
    for (int32_t c = 0; c < a.num_chunks; ++c) {
      const float* p = partial_at(a, t, head, c);
      if (p[0] == -INFINITY) continue;
      value += p[2 + d] * expf(p[0] - overall);
    }
    out[d] = __float2bfloat16_rn(value * inv);
  }
}

}  // namespace

size_t attention_partials_floats(int32_t num_tokens, int32_t num_heads, int32_t head_dim, int32_t num_chunks) {
  return size_t(num_tokens) * size_t(num_heads) * size_t(num_chunks) * size_t(head_dim + 2);
}

void launch_attention(const AttentionArgs& args, cudaStream_t stream) {
  if (args.num_tokens == 0) return;
  const int32_t group_size = args.num_heads / args.num_kv_heads;
  if (group_size > kMaxGroup) {
    throw Error(CD_ERR_INVALID_ARGUMENT, "the CUDA attention kernel takes at most 16 query heads per kv head");
  }
  const size_t shared_bytes = size_t(group_size) * (size_t(args.head_dim) + kKvChunkTokens) * sizeof(float);
  const auto kernel = attention_chunk_kernel;
  static std::atomic<uint32_t> configured{0};
  allow_shared_memory(kernel, int(kMaxGroup * (256 + kKvChunkTokens) * sizeof(float)), configured);
  const dim3 grid(unsigned(args.num_tokens * args.num_kv_heads), unsigned(args.num_chunks));
  kernel<<<grid, kThreads, shared_bytes, stream>>>(args);
  CDC_CHECK_LAUNCH();
  attention_merge_kernel<<<unsigned(args.num_tokens * args.num_heads), kThreads, 0, stream>>>(args);
  CDC_CHECK_LAUNCH();
}

}  // namespace cuda
}  // namespace conduit
