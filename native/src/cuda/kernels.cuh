// The plugin's kernels, each a host launcher on a stream. Every reduction has one order for
// every batch size: a row's values depend on its own inputs, the model's shape and constants,
// never on how many rows share the launch (native/README.md, "Batch invariance").
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace conduit {
namespace cuda {

// ---- elementwise and per-row kernels (kernels_elementwise.cu) ----

// hidden[t] = float(table[token_ids[t]]) * scale (scale 1: no multiply, as the CPU does).
void launch_embed(const __nv_bfloat16* table, int32_t hidden_size, const int32_t* token_ids, int32_t num_tokens,
                  float scale, float* hidden, cudaStream_t stream);

// y[r] = weight * (x[r] * inv_rms(x[r])) for num_rows rows of width elements (row strides in
// elements): one 256-thread block per row and one summation tree for every row count.
void launch_rms_norm_f32(const float* x, int32_t x_stride, const float* weight, int32_t width, double eps,
                         int32_t num_rows, float* y, int32_t y_stride, cudaStream_t stream);
void launch_rms_norm_bf16(const float* x, int32_t x_stride, const float* weight, int32_t width, double eps,
                          int32_t num_rows, __nv_bfloat16* y, int32_t y_stride, cudaStream_t stream);

// Per token: q/k/v biases, q/k head norms, rotary embedding of q and k (cos and sin of
// position * inv_freq in double, times attention_scaling, as the CPU computes them), then K and
// V stored as bf16 at the token's cache slot (slot < 0: a padding token, nothing stored).
struct RopeKvArgs {
  float* q;        // [tokens, q_size]
  float* k;        // [tokens, kv_size]
  const float* v;  // [tokens, kv_size]
  const float* q_bias;  // nullable
  const float* k_bias;
  const float* v_bias;
  const float* q_norm;  // nullable [head_dim]
  const float* k_norm;
  double eps;
  const int32_t* positions;  // [tokens]
  const int32_t* slots;      // [tokens] block * block_size + offset, or -1
  const double* inv_freq;    // [rotary_dim / 2]
  int32_t rotary_dim;
  double attention_scaling;
  int32_t num_heads, num_kv_heads, head_dim;
  __nv_bfloat16* cache;  // the whole KV cache
  int32_t layers_per_block, kv_slot, block_size;
  int32_t num_tokens;
};
void launch_rope_kv(const RopeKvArgs& args, cudaStream_t stream);

// out[t] = act(gate[t], up[t]) as bf16 (the down projection's input).
void launch_gated_activation(const float* gate, const float* up, int32_t width, int32_t num_rows, int32_t activation,
                             float alpha, float limit, __nv_bfloat16* out, int32_t out_stride, cudaStream_t stream);

// hidden[t] += norm(layer_out[t] + bias) (bias and norm nullable).
void launch_add_to_residual(float* hidden, float* layer_out, const float* bias, const float* norm_weight,
                            int32_t width, double eps, int32_t num_rows, cudaStream_t stream);

// x = cap * tanh(x / cap), row-major [rows, width].
void launch_softcap(float* x, size_t count, float cap, cudaStream_t stream);

// y[r] = fold_segments (src/cuda/tp_plan.h) of partials [8][num_rows][n] (or y[r] += it) for
// num_rows rows of n outputs: row-parallel matmuls' fixed tree, the CPU's combine_segments.
void launch_fold_segments(const float* partials, int32_t num_rows, int32_t n, float* y, int32_t y_stride,
                          bool accumulate, cudaStream_t stream);

// A rank's row-parallel inputs (local columns [0, bounds[end] - bounds[first]) of src) copied per
// segment into zero-padded slots: dst[t][(s - first) * slot + i] = src[t][bounds[s] - bounds[first]
// + i] for i < the segment's width, 0 after it up to slot (SegmentInputs, src/cuda/tp_plan.h).
struct SegmentSlots {
  int32_t bounds[9];
  int32_t first, end, slot;
};
void launch_pack_segments(const __nv_bfloat16* src, int32_t src_stride, int32_t num_rows, const SegmentSlots& slots,
                          __nv_bfloat16* dst, cudaStream_t stream);

// Rows of src (row ids) gathered into dst: dst[i] = src[rows[i]].
void launch_gather_rows(const float* src, int32_t width, const int32_t* rows, int32_t num_rows, float* dst,
                        cudaStream_t stream);

// ---- matmul (gemm.cu) ----

// A weight on the device: bf16 [n_padded][k_padded] or Q8_0 int8 [n_padded][k_padded] with fp16
// scales [k_padded / 32][n_padded], rows past n and inputs past k zero.
struct DeviceMatrix {
  int32_t n = 0, k = 0;
  int32_t n_padded = 0, k_padded = 0;
  bool q8 = false;
  void* values = nullptr;
  __half* scales = nullptr;
  // K's split, 0: gemm_splits(n, k_padded). A rank's rows of a column-parallel matrix keep the
  // whole matrix's split, so each output is the same chain at every tensor-parallel size.
  int32_t splits = 0;
};

// Matrix rows are padded to this (the widest column tile) and inputs to the k step.
constexpr int32_t kGemmRowPad = 128;
constexpr int32_t kGemmKStep = 32;

// The fixed split of K for a matrix shape: a function of (n, k) alone, never of the rows.
int32_t gemm_splits(int32_t n, int32_t k_padded);

// y[m, 0..n) (row stride y_stride) = x[m] . w[n] for num_rows rows of x (bf16, row stride
// x_stride >= k_padded, zero past k), or y += that when accumulate. partials: scratch of
// gemm_partials_floats(num_rows, n_padded) floats, used when the rows are few.
void launch_gemm(const __nv_bfloat16* x, int32_t x_stride, int32_t num_rows, const DeviceMatrix& w, float* y,
                 int32_t y_stride, bool accumulate, float* partials, cudaStream_t stream);
size_t gemm_partials_floats(int32_t num_rows, const DeviceMatrix& w);

// Grouped (MoE): w is a stack of num_groups matrices of w's shape, each n_padded x k_padded
// (scales likewise) after the previous; group g's rows [group_starts[g], group_starts[g + 1]) of
// x and y (device memory, so a captured graph replays any grouping) run on matrix g, each row
// with the chains launch_gemm gives it. max_group_rows bounds every group's rows.
void launch_grouped_gemm(const __nv_bfloat16* x, int32_t x_stride, int32_t max_group_rows, const DeviceMatrix& w,
                         const int32_t* group_starts, int32_t num_groups, float* y, int32_t y_stride,
                         cudaStream_t stream);

// ---- mixture of experts (moe.cu) ----

// logits[t, e] = x[t] . router[e] (+ bias[e]) in fp32, as the CPU keeps the router (its top-k is
// a discontinuous choice): one warp per (token, expert), lanes' strided chains then a fixed
// butterfly.
void launch_router_logits(const float* x, int32_t x_stride, int32_t num_tokens, const float* router, int32_t num_experts,
                          int32_t hidden_size, const float* bias, float* logits, cudaStream_t stream);

// The routing of src/moe.cc, one thread per token from its own logits (double): slot_experts and
// slot_weights [tokens, top_k], best first.
void launch_moe_route(const float* logits, int32_t num_tokens, int32_t num_experts, int32_t top_k, int32_t routing,
                      bool norm_topk_prob, int32_t* slot_experts, float* slot_weights, cudaStream_t stream);

// The slots grouped by expert as the CPU groups them (within an expert, tokens in batch order):
// expert_starts [experts + 1], slot_rows [slots] (each slot's grouped row), row_tokens and
// row_experts [slots]. One block; each expert's rows are counted and placed by one thread.
void launch_moe_group(const int32_t* slot_experts, int32_t num_slots, int32_t top_k, int32_t num_experts,
                      int32_t* expert_starts, int32_t* slot_rows, int32_t* row_tokens, int32_t* row_experts,
                      cudaStream_t stream);

// rows[r] = x[row_tokens[r]] (bf16 rows of width elements, strides in elements).
void launch_gather_bf16(const __nv_bfloat16* x, int32_t x_stride, const int32_t* row_tokens, int32_t num_rows,
                        int32_t width, __nv_bfloat16* rows, int32_t rows_stride, cudaStream_t stream);

// y[r] += bias[row_experts[r]] ([experts, width] stacked) for num_rows rows.
void launch_expert_bias(float* y, int32_t width, int32_t num_rows, const int32_t* row_experts, const float* bias,
                        cudaStream_t stream);

// hidden[t] += the token's experts combined in its slot order, one chain per element:
// acc = w0 (o0 + b0), then acc + w_k (o_k + b_k) (down_bias nullable, [experts, hidden]).
void launch_moe_combine(const float* expert_out, int32_t hidden_size, const int32_t* slot_rows,
                        const int32_t* slot_experts, const float* slot_weights, const float* down_bias, int32_t top_k,
                        int32_t num_tokens, float* hidden, cudaStream_t stream);
// out[i] = row i of slot expert_owners[row_experts[i]] of a group's gathered expert outputs
// ([size][slot_floats], tp_plan.h's expert parallelism), for the grouped rows [0, num_rows).
void launch_select_expert_rows(const float* gathered, size_t slot_floats, int32_t hidden_size,
                               const int32_t* row_experts, const int32_t* expert_owners, int32_t num_rows, float* out,
                               cudaStream_t stream);

// ---- attention (attention.cu) ----

// Paged attention for every token of the batch (prefill, chunked prefill and decode alike):
// each (token, kv head, fixed chunk of kKvChunkTokens positions) scores its keys for the group's
// query heads and keeps (max, sum, weighted values); a merge combines the chunks in position
// order. The chunking follows positions alone, so a token's output is the same whatever the
// batch and however its prompt was chunked.
constexpr int32_t kKvChunkTokens = 256;
struct AttentionArgs {
  const float* q;             // [tokens, num_heads * head_dim] after RoPE
  const __nv_bfloat16* cache;
  const int32_t* block_tables;  // this layer's group: [seqs][max_blocks_per_seq]
  int32_t max_blocks_per_seq;
  const int32_t* token_seqs;  // [tokens]
  const int32_t* positions;   // [tokens]; -1 for padding
  const float* sinks;         // nullable [num_heads]
  int32_t num_heads, num_kv_heads, head_dim;
  int32_t layers_per_block, kv_slot, block_size;
  int32_t window;             // 0: unlimited
  float scale, softcap;
  int32_t num_tokens;
  int32_t num_chunks;         // chunks of the longest context in the launch
  float* partials;            // attention_partials_floats(...)
  __nv_bfloat16* out;         // [tokens, out_stride]
  int32_t out_stride;
};
size_t attention_partials_floats(int32_t num_tokens, int32_t num_heads, int32_t head_dim, int32_t num_chunks);
void launch_attention(const AttentionArgs& args, cudaStream_t stream);

// ---- sampling (sample.cu) ----

struct DeviceSamplingRow {
  float temperature, top_p, min_p;
  int32_t top_k;
  uint64_t seed;
  int32_t output_index;
  int32_t logits_row;  // into the logits
};
// Per row: the raw argmax (ties to the lowest id) and log-softmax, then greedy or temperature,
// min-p, top-k, top-p and one inverse-CDF draw with the CPU sampler's arithmetic
// (shared/sampling_math.h). Writes tokens[i] and logprobs[i] (raw log-softmax of the token).
struct SamplerScratchDevice {
  int32_t* ids = nullptr;       // [rows_capacity][vocab]
  uint64_t* keys = nullptr;     // [rows_capacity][pow2 >= vocab]
  double* probs = nullptr;      // [rows_capacity][vocab]
  int32_t rows_capacity = 0;
};
size_t sampler_key_stride(int32_t vocab_size);
void launch_sample(const float* logits, int32_t vocab_size, const DeviceSamplingRow* rows, int32_t num_rows,
                   const SamplerScratchDevice& scratch, int32_t* tokens, float* logprobs, cudaStream_t stream);

// ---- probes (probes.cu) ----
double probe_read_bandwidth(int32_t device, size_t size_bytes, int32_t repeats);
double probe_mma_peak(int32_t device);

}  // namespace cuda
}  // namespace conduit
