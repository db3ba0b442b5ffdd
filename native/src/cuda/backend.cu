#include "backend.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <limits>
#include <sched.h>
#include <string>
#include <thread>
#include <vector>

#include "batch_plan.h"
#include "common.cuh"
#include "device_group.h"
#include "host_weights.h"
#include "kernels.cuh"
#include "logprobs.h"
#include "sampler.h"
#include "shared/sampling_math.h"
#include "tp_plan.h"

namespace conduit {
namespace cuda {

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// Prompt logprobs run the LM head over slabs of at most this many rows.
constexpr int32_t kPromptSlabRows = 64;
// Rows the device sampler's scratch holds at once.
constexpr int32_t kSamplerRows = 64;
constexpr size_t kGraphCapacity = 32;
// Rows per slab of a row-parallel matmul, so its partials ([8][rows][hidden] fp32) stay bounded.
constexpr int32_t kSegmentSlabRows = 256;

int32_t num_segment_slabs(int32_t tokens) { return (tokens + kSegmentSlabRows - 1) / kSegmentSlabRows; }
int32_t slab_rows(int32_t tokens, int32_t slab) { return std::min(kSegmentSlabRows, tokens - slab * kSegmentSlabRows); }

int32_t round_up(int32_t value, int32_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// Deterministic uniform values in [-scale, scale) by index: the synthetic models.
__global__ void random_bf16_kernel(__nv_bfloat16* out, size_t count, uint64_t seed, float scale) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    const double u = conduit::sampling::uniform_from_counter(seed, i);
    out[i] = __float2bfloat16_rn(float((2.0 * u - 1.0) * scale));
  }
}

__global__ void random_f32_kernel(float* out, size_t count, uint64_t seed, float scale) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    out[i] = float((2.0 * conduit::sampling::uniform_from_counter(seed, i) - 1.0) * scale);
  }
}

// Rows [row_begin, row_begin + n) and inputs [col_begin, col_begin + k) of a [*, full_k] matrix
// (num_stacked of them), drawn by the whole matrix's index: a rank's share of a synthetic model is
// the same numbers as the share of the whole one. out: [stacked][n_padded][k_padded].
__global__ void random_matrix_kernel(void* out, bool q8, int32_t num_stacked, int32_t n, int32_t k, int32_t n_padded,
                                     int32_t k_padded, int32_t full_n, int32_t row_begin, int32_t col_begin,
                                     int32_t full_k, uint64_t seed, float scale) {
  const size_t count = size_t(num_stacked) * n * k;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    const size_t stack = i / (size_t(n) * k);
    const int32_t row = int32_t(i / k % n);
    const int32_t col = int32_t(i % k);
    const uint64_t index = (stack * full_n + row_begin + row) * uint64_t(full_k) + col_begin + col;
    const double u = conduit::sampling::uniform_from_counter(seed, index);
    const size_t at = (stack * n_padded + row) * k_padded + col;
    if (q8) {
      static_cast<int8_t*>(out)[at] = int8_t(int32_t(u * 255.0) - 127);
    } else {
      static_cast<__nv_bfloat16*>(out)[at] = __float2bfloat16_rn(float((2.0 * u - 1.0) * scale));
    }
  }
}

__global__ void fill_half_kernel(__half* out, size_t count, float value) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    out[i] = __float2half_rn(value);
  }
}

// Waits for the token bitmasks' writers (see cd_batch.bitmask_ready), as the CPU pass does.
void wait_for_bitmasks(const cd_batch& batch) {
  if (batch.bitmask_rows == nullptr || batch.bitmask_ready == nullptr) return;
  const auto ready = [&batch] {
    return __atomic_load_n(batch.bitmask_ready, __ATOMIC_ACQUIRE) >= batch.bitmask_ready_target;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(CD_BITMASK_WAIT_MS);
  while (!ready()) {
    if (std::chrono::steady_clock::now() > deadline) {
      throw Error(CD_ERR_INTERNAL, "the token bitmasks of a structured output were not written within " +
                                       std::to_string(CD_BITMASK_WAIT_MS) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

// A device allocation that frees itself.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept : data_(other.data_), count_(other.count_) {
    other.data_ = nullptr;
    other.count_ = 0;
  }
  // Grows to at least count elements (contents lost, new memory zeroed); true when it moved.
  bool reserve(size_t count) {
    if (count <= count_) return false;
    release();
    CDC_CHECK(cudaMalloc(&data_, std::max<size_t>(count, 1) * sizeof(T)));
    CDC_CHECK(cudaMemset(data_, 0, std::max<size_t>(count, 1) * sizeof(T)));
    count_ = count;
    return true;
  }
  T* get() const { return data_; }
  size_t size() const { return count_; }

 private:
  void release() {
    if (data_ != nullptr) cudaFree(data_);
    data_ = nullptr;
    count_ = 0;
  }
  T* data_ = nullptr;
  size_t count_ = 0;
};

// A row-parallel matrix (o_proj, down_proj) as the fixed tree's segments along its inputs
// (src/row_parallel.h): the rank's segments [first, end), each its own matrix (k 0: empty).
struct SegmentedWeights {
  SegmentBounds bounds{};
  SegmentInputs inputs;
  int32_t first = 0, end = kReductionSegments;
  std::array<DeviceMatrix, kReductionSegments> segments{};
};

struct DeviceLayer {
  const float* input_norm = nullptr;
  DeviceMatrix q_proj, k_proj, v_proj, gate_proj, up_proj;
  SegmentedWeights o_proj, down_proj;
  const float *q_bias = nullptr, *k_bias = nullptr, *v_bias = nullptr;
  const float *q_norm = nullptr, *k_norm = nullptr, *sinks = nullptr;
  const float *o_bias = nullptr, *attn_out_norm = nullptr, *ffn_norm = nullptr, *ffn_out_norm = nullptr;
  int32_t window = 0, rope = 0, kv_group = 0, kv_slot = 0;
  // MoE layers (num_experts > 0) instead of the dense MLP: the router in fp32 [experts, hidden],
  // each expert matrix a stack of the rank's experts [expert_begin, expert_begin + held_experts)
  // (launch_grouped_gemm), biases [experts, n] of every expert or null; in a group, expert_owners
  // [experts] (tp_plan.h).
  int32_t num_experts = 0, expert_begin = 0, held_experts = 0;
  const int32_t* expert_owners = nullptr;
  const float *router = nullptr, *router_bias = nullptr;
  DeviceMatrix expert_gate, expert_up, expert_down;
  const float *expert_gate_bias = nullptr, *expert_up_bias = nullptr, *expert_down_bias = nullptr;
};

struct DeviceRope {
  const double* inv_freq;
  int32_t rotary_dim;
  double attention_scaling;
};

}  // namespace

class TpGroup;

class CudaModel {
 public:
  // shard: this model's part of the whole (plan_rank; rank 0 of 1: all of it), on device.
  CudaModel(const cd_model_spec& spec, const cd_load_options& options, uint64_t random_seed, const RankShard& shard,
            int32_t device);
  ~CudaModel();
  void forward(const cd_batch& batch, cd_forward_output& output);
  uint64_t kv_bytes_per_block() const { return kv_bytes_per_block_; }

 private:
  friend class TpGroup;
  // ---- load ----
  template <typename T>
  T* upload(const std::vector<T>& values);
  // Elements [begin, begin + n) of a vector of full_n (n = full_n, begin 0: all of it).
  const float* upload_vector(const HostCheckpoint* checkpoint, const cd_tensor_ref& ref, int32_t n, bool is_norm,
                             int32_t begin = 0, int32_t full_n = 0);
  DeviceMatrix allocate_matrix(int32_t n, int32_t k, int32_t num_stacked = 1);
  // Matrix `index` of a stack (0 for a single matrix) from the checkpoint: rows [row_begin, row_begin +
  // m.n) and inputs [col_begin, col_begin + m.k) of a matrix of ref_k inputs (0: m.k).
  void fill_matrix(const HostCheckpoint& checkpoint, const cd_tensor_ref& ref, const DeviceMatrix& m, int32_t index,
                   int32_t row_begin = 0, int32_t col_begin = 0, int32_t ref_k = 0);
  // Synthetic weights, by the index in the whole [full_n, full_k] matrix (0: m's own shape).
  void fill_random(const DeviceMatrix& m, int32_t num_stacked, uint64_t seed, int32_t row_begin = 0,
                   int32_t col_begin = 0, int32_t full_n = 0, int32_t full_k = 0);

  // ---- forward ----
  // True when a buffer moved (this rank's graphs are dropped; a group drops its own).
  bool ensure_capacity(const BatchPlan& plan, int32_t num_seqs);
  void upload_plan(const BatchPlan& plan);
  void run_layers(const BatchPlan& plan, int32_t num_logit_rows);
  // The phases of run_layers, which the tensor-parallel driver (TpGroup) enqueues per rank around
  // its all-gathers: a layer's attention up to attention_out_, then per slab of rows o_proj's
  // segments into segment_partials_ and their fold into the residual stream; the MLP likewise.
  void embed(const BatchPlan& plan);
  void attention(size_t index, const BatchPlan& plan);
  void mlp(size_t index, int32_t num_tokens);
  void segments(const SegmentedWeights& w, const __nv_bfloat16* input, int32_t input_stride, int32_t num_tokens,
                int32_t slab);
  void fold(size_t index, bool attention_output, int32_t num_tokens, int32_t slab);
  // A MoE layer in two phases around a group's gather: routing and the rank's experts into
  // expert_outputs(), then (after the gather) the combine into the residual stream.
  void run_experts(const DeviceLayer& layer, int32_t num_tokens);
  void combine_experts(size_t index, int32_t num_tokens);
  float* expert_outputs(int32_t num_tokens) {
    return tp_size_ == 1 ? moe_out_.get() : gathered_experts_.get() + size_t(tp_rank_) * num_tokens * top_k_ * hidden_;
  }
  // Final norm, LM head (this rank's vocabulary slice) and soft-cap of rows listed in device_rows:
  // logits_[0, num_rows), or in a group the rank's place in gathered_logits_.
  void final_logits(const int32_t* device_rows, int32_t num_rows);
  // The logits of num_rows rows listed on the host, into logits_ (prompt logprobs' slabs).
  void logits_of_rows(const int32_t* host_rows, int32_t num_rows);
  void produce_outputs(const cd_batch& batch, const BatchPlan& plan, bool logits_by_token, cd_forward_output& output);
  void produce_prompt_logprobs(const cd_batch& batch, const BatchPlan& plan, cd_forward_output& output);
  int32_t logits_row(const BatchPlan& plan, int32_t output_row, bool by_token) const {
    return by_token ? plan.outputs.tokens[size_t(output_row)] : output_row;
  }

  int32_t device_;
  cudaStream_t stream_ = nullptr;
  // Tensor parallelism: this rank, its vocabulary slice [vocab_begin_, vocab_begin_ + vocab_slice_)
  // at gathered_logits_'s stride slice_columns_, and the group that drives it (rank 0 only).
  int32_t tp_rank_ = 0, tp_size_ = 1;
  int32_t vocab_begin_ = 0, vocab_slice_ = 0, slice_columns_ = 0;
  TpGroup* group_ = nullptr;
  bool q8_;
  // Shapes.
  int32_t num_layers_, hidden_, intermediate_, num_heads_, num_kv_heads_, head_dim_, vocab_;
  int32_t q_size_, kv_size_;
  int32_t hidden_padded_, q_padded_, intermediate_padded_;
  int32_t max_experts_ = 0, top_k_, moe_intermediate_, moe_intermediate_padded_;
  cd_routing routing_;
  bool norm_topk_prob_;
  double eps_;
  bool norm_adds_one_;
  float embedding_scale_, attention_scale_, attention_softcap_, final_softcap_;
  cd_activation activation_;
  float swiglu_alpha_, swiglu_limit_;
  int32_t num_kv_groups_, layers_per_block_, block_size_, num_blocks_;
  uint64_t kv_bytes_per_block_;
  // Weights.
  std::vector<void*> allocations_;
  __nv_bfloat16* embed_ = nullptr;
  DeviceMatrix lm_head_;
  const float* final_norm_ = nullptr;
  std::vector<DeviceLayer> layers_;
  std::vector<DeviceRope> ropes_;
  __nv_bfloat16* kv_cache_ = nullptr;
  // Workspace, grown to the largest batch seen.
  int32_t token_capacity_ = 0;
  DeviceBuffer<float> residual_, layer_out_, q_, k_, v_, gate_, up_, gemm_partials_, attention_partials_;
  DeviceBuffer<__nv_bfloat16> normed_, attention_out_, activated_, output_normed_;
  DeviceBuffer<float> logits_, output_hidden_;
  // [8][slab rows][hidden] (partials_layout), and a slab's inputs in segment slots when packed.
  DeviceBuffer<float> segment_partials_;
  DeviceBuffer<__nv_bfloat16> packed_inputs_;
  // A group's logits: [size][rows][slice_columns_], rank r's slice at r's place.
  DeviceBuffer<float> gathered_logits_;
  // MoE: per token, then per slot (tokens x top_k) and per grouped row.
  DeviceBuffer<float> router_logits_, slot_weights_, moe_gate_, moe_up_, moe_out_;
  DeviceBuffer<int32_t> slot_experts_, slot_rows_, row_tokens_, row_experts_, expert_starts_;
  DeviceBuffer<__nv_bfloat16> moe_rows_, moe_activated_;
  // A group's expert outputs: [size][slots][hidden], rank r's experts' rows in slot r.
  DeviceBuffer<float> gathered_experts_;
  DeviceBuffer<int32_t> token_ids_, positions_, token_seqs_, slots_, block_tables_, output_tokens_;
  DeviceBuffer<DeviceSamplingRow> sampling_rows_;
  DeviceBuffer<int32_t> sampled_tokens_;
  DeviceBuffer<float> sampled_logprobs_;
  DeviceBuffer<int32_t> sampler_ids_;
  DeviceBuffer<uint64_t> sampler_keys_;
  DeviceBuffer<double> sampler_probs_;
  // Host side.
  std::vector<float> host_logits_;
  std::vector<SamplerScratch> host_sampler_;
  const KernelTable& host_kernels_;
  GraphCache<cudaGraphExec_t> graphs_;
  bool graphs_enabled_;
  bool group_graphs_ = false;
};

CudaModel::CudaModel(const cd_model_spec& spec, const cd_load_options& options, uint64_t random_seed,
                     const RankShard& shard, int32_t device)
    : device_(device),
      q8_(options.quantization == CD_QUANTIZATION_INT8),
      host_kernels_(kernels_scalar()),
      graphs_(kGraphCapacity, [](cudaGraphExec_t exec) { cudaGraphExecDestroy(exec); }) {
  if (options.weight_dtype != CD_DTYPE_BF16 || options.kv_cache_dtype != CD_DTYPE_BF16) {
    throw Error(CD_ERR_INVALID_ARGUMENT,
                "the CUDA backend runs bf16 weights (or int8 with quantization) and a bf16 KV cache; load with "
                "dtype bf16 and kvCacheDtype bf16");
  }
  if (options.quantization != CD_QUANTIZATION_NONE && options.quantization != CD_QUANTIZATION_INT8) {
    throw Error(CD_ERR_INVALID_ARGUMENT, "the CUDA backend quantizes to int8 only; load with quantization none or int8");
  }
  for (int32_t i = 0; i < spec.num_layers; ++i) max_experts_ = std::max(max_experts_, spec.layers[i].num_experts);
  if (spec.num_heads / spec.num_kv_heads > 16) {
    throw Error(CD_ERR_INVALID_ARGUMENT, "the CUDA attention kernel takes at most 16 query heads per kv head");
  }
  const char* graphs_setting = std::getenv("CONDUIT_CUDA_GRAPHS");
  // A group captures its step across every rank's stream itself (TpGroup::forward).
  graphs_enabled_ = (graphs_setting == nullptr || std::string(graphs_setting) != "0") && shard.size == 1;
  group_graphs_ = graphs_setting == nullptr || std::string(graphs_setting) != "0";
  CDC_CHECK(cudaSetDevice(device_));
  CDC_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  num_layers_ = spec.num_layers;
  hidden_ = spec.hidden_size;
  intermediate_ = shard.intermediate_size;
  num_heads_ = shard.num_heads;
  num_kv_heads_ = shard.num_kv_heads;
  head_dim_ = spec.head_dim;
  vocab_ = spec.vocab_size;
  tp_rank_ = shard.rank;
  tp_size_ = shard.size;
  vocab_begin_ = shard.vocab_begin;
  vocab_slice_ = shard.vocab_end - shard.vocab_begin;
  slice_columns_ = (vocab_ + tp_size_ - 1) / tp_size_;
  const int32_t full_q_size = spec.num_heads * spec.head_dim;
  const int32_t full_kv_size = spec.num_kv_heads * spec.head_dim;
  q_size_ = num_heads_ * head_dim_;
  kv_size_ = num_kv_heads_ * head_dim_;
  hidden_padded_ = round_up(hidden_, kGemmKStep);
  q_padded_ = round_up(q_size_, kGemmKStep);
  intermediate_padded_ = round_up(intermediate_, kGemmKStep);
  top_k_ = spec.num_experts_per_token;
  moe_intermediate_ = spec.moe_intermediate_size;
  moe_intermediate_padded_ = round_up(moe_intermediate_, kGemmKStep);
  routing_ = spec.routing;
  norm_topk_prob_ = spec.norm_topk_prob != 0;
  eps_ = spec.rms_norm_eps;
  norm_adds_one_ = spec.norm_adds_one != 0;
  embedding_scale_ = round_to_bf16(float(spec.embedding_scale));
  attention_scale_ = float(spec.attention_scale);
  attention_softcap_ = float(spec.attention_softcap);
  final_softcap_ = float(spec.final_softcap);
  activation_ = spec.activation;
  swiglu_alpha_ = float(spec.swiglu_alpha);
  swiglu_limit_ = float(spec.swiglu_limit);
  num_kv_groups_ = spec.num_kv_groups;
  layers_per_block_ = spec.layers_per_kv_block;
  block_size_ = options.block_size_tokens;
  num_blocks_ = options.num_kv_blocks;
  kv_bytes_per_block_ = uint64_t(2) * layers_per_block_ * num_kv_heads_ * block_size_ * head_dim_ * sizeof(__nv_bfloat16);

  std::unique_ptr<HostCheckpoint> checkpoint;
  if (random_seed == 0) checkpoint = std::make_unique<HostCheckpoint>(spec);
  uint64_t next_seed = random_seed;
  // Synthetic weights: each tensor its own seed.
  const auto synthetic = [&]() -> uint64_t { return random_seed == 0 ? 0 : ++next_seed; };

  // Embedding table: bf16 rows.
  {
    const size_t count = size_t(vocab_) * hidden_;
    void* table = nullptr;
    CDC_CHECK(cudaMalloc(&table, count * sizeof(__nv_bfloat16)));
    allocations_.push_back(table);
    embed_ = static_cast<__nv_bfloat16*>(table);
    if (checkpoint == nullptr) {
      random_bf16_kernel<<<1024, 256, 0, stream_>>>(embed_, count, synthetic(), 1.0f);
      CDC_CHECK_LAUNCH();
    } else {
      std::vector<float> rows(size_t(1024) * hidden_);
      std::vector<uint16_t> bits(rows.size());
      for (int32_t first = 0; first < vocab_; first += 1024) {
        const int32_t last = std::min(vocab_, first + 1024);
        checkpoint->read_rows(spec.embed_tokens, hidden_, first, last, rows.data());
        const size_t n = size_t(last - first) * hidden_;
        for (size_t i = 0; i < n; ++i) bits[i] = to_bf16_bits(rows[i]);
        CDC_CHECK(cudaMemcpy(embed_ + size_t(first) * hidden_, bits.data(), n * 2, cudaMemcpyHostToDevice));
      }
    }
  }
  // Rows [row_begin, row_begin + n) of a column-parallel [full_n, k] matrix, split along K as
  // the whole matrix is (so a row's chains do not depend on the tensor-parallel size).
  const auto matrix = [&](const cd_tensor_ref& ref, int32_t row_begin, int32_t n, int32_t full_n, int32_t k) {
    DeviceMatrix m = allocate_matrix(n, k);
    m.splits = gemm_splits(full_n, m.k_padded);
    if (checkpoint != nullptr) {
      fill_matrix(*checkpoint, ref, m, 0, row_begin);
    } else {
      fill_random(m, 1, synthetic(), row_begin, 0, full_n, k);
    }
    return m;
  };
  // A row-parallel [n, full_k] matrix: the shard's segments of its inputs.
  const auto segmented = [&](const cd_tensor_ref& ref, int32_t n, int32_t full_k) {
    SegmentedWeights w;
    w.bounds = segment_bounds(full_k);
    w.inputs = segment_inputs(w.bounds, kGemmKStep);
    w.first = shard.first_segment;
    w.end = shard.end_segment;
    const uint64_t seed = synthetic();
    for (int32_t s = w.first; s < w.end; ++s) {
      const int32_t begin = w.bounds[size_t(s)];
      const int32_t segment_k = w.bounds[size_t(s) + 1] - begin;
      if (segment_k == 0) continue;
      DeviceMatrix& m = w.segments[size_t(s)];
      m = allocate_matrix(n, segment_k);
      if (checkpoint != nullptr) {
        fill_matrix(*checkpoint, ref, m, 0, 0, begin, full_k);
      } else {
        fill_random(m, 1, seed, 0, begin, n, full_k);
      }
    }
    return w;
  };
  // One matrix of every expert, stacked: field picks it from an expert's spec.
  // A rank holds only its experts; synthetic ones are drawn by the whole stack's index.
  const auto experts = [&](const cd_layer_spec& source, cd_tensor_ref cd_expert_spec::*field, int32_t n, int32_t k) {
    const ExpertRange held = held_experts(shard.rank, shard.size, source.num_experts);
    const uint64_t seed = synthetic();
    if (held.end == held.begin) return DeviceMatrix{};
    DeviceMatrix m = allocate_matrix(n, k, held.end - held.begin);
    for (int32_t e = held.begin; checkpoint != nullptr && e < held.end; ++e) {
      fill_matrix(*checkpoint, source.experts[e].*field, m, e - held.begin);
    }
    if (checkpoint == nullptr) fill_random(m, held.end - held.begin, seed, held.begin * n, 0, n, k);
    return m;
  };
  // A bias of every expert, [experts, n]; null when the checkpoint has none.
  const auto expert_biases = [&](const cd_layer_spec& source, cd_tensor_ref cd_expert_spec::*field,
                                 int32_t n) -> const float* {
    if (checkpoint == nullptr || (source.experts[0].*field).size_bytes == 0) return nullptr;
    std::vector<float> values;
    for (int32_t e = 0; e < source.num_experts; ++e) {
      const std::vector<float> bias = checkpoint->vector(source.experts[e].*field, n);
      values.insert(values.end(), bias.begin(), bias.end());
    }
    return upload(values);
  };
  // Elements [begin, begin + n) of a vector of full_n.
  const auto vector = [&](const cd_tensor_ref& ref, int32_t n, bool is_norm, int32_t begin = 0,
                          int32_t full_n = 0) -> const float* {
    if (checkpoint != nullptr) return upload_vector(checkpoint.get(), ref, n, is_norm, begin, full_n);
    return is_norm ? upload(std::vector<float>(size_t(n), 1.0f)) : nullptr;
  };
  lm_head_ = matrix(spec.lm_head, vocab_begin_, vocab_slice_, vocab_, hidden_);
  final_norm_ = vector(spec.final_norm, hidden_, true);
  for (int32_t r = 0; r < spec.num_ropes; ++r) {
    const cd_rope_spec& rope = spec.ropes[r];
    ropes_.push_back(DeviceRope{upload(std::vector<double>(rope.inv_freq, rope.inv_freq + rope.rotary_dim / 2)),
                                rope.rotary_dim, rope.attention_scaling});
  }
  layers_.resize(size_t(num_layers_));
  for (int32_t i = 0; i < num_layers_; ++i) {
    const cd_layer_spec& source = spec.layers[i];
    DeviceLayer& layer = layers_[size_t(i)];
    layer.input_norm = vector(source.input_norm, hidden_, true);
    const int32_t q_begin = shard.head_begin * head_dim_;
    const int32_t kv_begin = shard.kv_head_begin * head_dim_;
    layer.q_proj = matrix(source.q_proj, q_begin, q_size_, full_q_size, hidden_);
    layer.k_proj = matrix(source.k_proj, kv_begin, kv_size_, full_kv_size, hidden_);
    layer.v_proj = matrix(source.v_proj, kv_begin, kv_size_, full_kv_size, hidden_);
    layer.q_bias = vector(source.q_bias, q_size_, false, q_begin, full_q_size);
    layer.k_bias = vector(source.k_bias, kv_size_, false, kv_begin, full_kv_size);
    layer.v_bias = vector(source.v_bias, kv_size_, false, kv_begin, full_kv_size);
    layer.q_norm = vector(source.q_norm, head_dim_, true);
    layer.k_norm = vector(source.k_norm, head_dim_, true);
    layer.sinks = checkpoint != nullptr ? upload_vector(checkpoint.get(), source.sinks, num_heads_, false,
                                                        shard.head_begin, spec.num_heads)
                                        : nullptr;
    layer.o_proj = segmented(source.o_proj, hidden_, full_q_size);
    layer.o_bias = vector(source.o_bias, hidden_, false);
    layer.attn_out_norm = vector(source.attn_out_norm, hidden_, true);
    layer.ffn_norm = vector(source.ffn_norm, hidden_, true);
    layer.ffn_out_norm = vector(source.ffn_out_norm, hidden_, true);
    layer.num_experts = source.num_experts;
    if (source.num_experts > 0) {
      const ExpertRange held = held_experts(shard.rank, shard.size, source.num_experts);
      layer.expert_begin = held.begin;
      layer.held_experts = held.end - held.begin;
      if (shard.size > 1) layer.expert_owners = upload(expert_owners(shard.size, source.num_experts));
      const size_t router_count = size_t(source.num_experts) * hidden_;
      if (checkpoint != nullptr) {
        std::vector<float> router(router_count);
        checkpoint->read_rows(source.router, hidden_, 0, source.num_experts, router.data());
        layer.router = upload(router);
        layer.router_bias = upload_vector(checkpoint.get(), source.router_bias, source.num_experts, false);
      } else {
        float* router = upload(std::vector<float>(router_count));
        random_f32_kernel<<<256, 256, 0, stream_>>>(router, router_count, synthetic(), float(1.0 / std::sqrt(double(hidden_))));
        CDC_CHECK_LAUNCH();
        layer.router = router;
      }
      layer.expert_gate = experts(source, &cd_expert_spec::gate_proj, moe_intermediate_, hidden_);
      layer.expert_up = experts(source, &cd_expert_spec::up_proj, moe_intermediate_, hidden_);
      layer.expert_down = experts(source, &cd_expert_spec::down_proj, hidden_, moe_intermediate_);
      layer.expert_gate_bias = expert_biases(source, &cd_expert_spec::gate_bias, moe_intermediate_);
      layer.expert_up_bias = expert_biases(source, &cd_expert_spec::up_bias, moe_intermediate_);
      layer.expert_down_bias = expert_biases(source, &cd_expert_spec::down_bias, hidden_);
    } else {
      layer.gate_proj = matrix(source.gate_proj, shard.intermediate_begin, intermediate_, spec.intermediate_size, hidden_);
      layer.up_proj = matrix(source.up_proj, shard.intermediate_begin, intermediate_, spec.intermediate_size, hidden_);
      layer.down_proj = segmented(source.down_proj, hidden_, spec.intermediate_size);
    }
    layer.window = source.sliding_window_tokens;
    layer.rope = source.rope_index;
    layer.kv_group = source.kv_group;
    layer.kv_slot = source.kv_slot;
  }
  if (checkpoint == nullptr) {
    // Synthetic models have the optional norms only where the spec names them (size_bytes > 0).
    for (int32_t i = 0; i < num_layers_; ++i) {
      const cd_layer_spec& source = spec.layers[i];
      DeviceLayer& layer = layers_[size_t(i)];
      if (source.q_norm.size_bytes == 0) layer.q_norm = nullptr;
      if (source.k_norm.size_bytes == 0) layer.k_norm = nullptr;
      if (source.attn_out_norm.size_bytes == 0) layer.attn_out_norm = nullptr;
      if (source.ffn_out_norm.size_bytes == 0) layer.ffn_out_norm = nullptr;
    }
  }
  const size_t cache_bytes = size_t(num_blocks_) * kv_bytes_per_block_;
  void* cache = nullptr;
  CDC_CHECK(cudaMalloc(&cache, cache_bytes));
  allocations_.push_back(cache);
  // Stale slots are never read into a sum, but zeros keep a bug from reading NaN.
  CDC_CHECK(cudaMemset(cache, 0, cache_bytes));
  kv_cache_ = static_cast<__nv_bfloat16*>(cache);
  CDC_CHECK(cudaStreamSynchronize(stream_));
  host_sampler_.resize(1);
}

CudaModel::~CudaModel() {
  cudaSetDevice(device_);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  graphs_.clear();
  for (void* allocation : allocations_) cudaFree(allocation);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

template <typename T>
T* CudaModel::upload(const std::vector<T>& values) {
  void* device = nullptr;
  CDC_CHECK(cudaMalloc(&device, std::max<size_t>(values.size(), 1) * sizeof(T)));
  allocations_.push_back(device);
  CDC_CHECK(cudaMemcpy(device, values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice));
  return static_cast<T*>(device);
}

const float* CudaModel::upload_vector(const HostCheckpoint* checkpoint, const cd_tensor_ref& ref, int32_t n,
                                      bool is_norm, int32_t begin, int32_t full_n) {
  std::vector<float> values = checkpoint->vector(ref, full_n > 0 ? full_n : n);
  if (values.empty()) return nullptr;
  if (full_n > 0) values = std::vector<float>(values.begin() + begin, values.begin() + begin + n);
  // Gemma's norms multiply by (1 + w), computed in fp32 as the CPU runtime does.
  if (is_norm && norm_adds_one_) {
    for (float& value : values) value = 1.0f + value;
  }
  return upload(values);
}

// A weight's device memory (num_stacked of them, one after another), rows padded to the widest
// column tile and inputs to the k step, zeroed (the padding must read as zeros).
DeviceMatrix CudaModel::allocate_matrix(int32_t n, int32_t k, int32_t num_stacked) {
  DeviceMatrix m;
  m.n = n;
  m.k = k;
  m.n_padded = round_up(n, kGemmRowPad);
  m.k_padded = round_up(k, kGemmKStep);
  m.q8 = q8_;
  const size_t bytes = size_t(num_stacked) * m.n_padded * m.k_padded * (q8_ ? 1 : 2);
  CDC_CHECK(cudaMalloc(&m.values, bytes));
  allocations_.push_back(m.values);
  CDC_CHECK(cudaMemset(m.values, 0, bytes));
  if (q8_) {
    const size_t scale_bytes = size_t(num_stacked) * (m.k_padded / 32) * m.n_padded * sizeof(__half);
    void* scales = nullptr;
    CDC_CHECK(cudaMalloc(&scales, scale_bytes));
    allocations_.push_back(scales);
    CDC_CHECK(cudaMemset(scales, 0, scale_bytes));
    m.scales = static_cast<__half*>(scales);
  }
  return m;
}

void CudaModel::fill_random(const DeviceMatrix& m, int32_t num_stacked, uint64_t seed, int32_t row_begin,
                            int32_t col_begin, int32_t full_n, int32_t full_k) {
  full_n = full_n > 0 ? full_n : m.n;
  full_k = full_k > 0 ? full_k : m.k;
  random_matrix_kernel<<<1024, 256, 0, stream_>>>(m.values, q8_, num_stacked, m.n, m.k, m.n_padded, m.k_padded, full_n,
                                                  row_begin, col_begin, full_k, seed,
                                                  float(1.0 / std::sqrt(double(full_k))));
  CDC_CHECK_LAUNCH();
  if (q8_) {
    fill_half_kernel<<<256, 256, 0, stream_>>>(m.scales, size_t(num_stacked) * (m.k_padded / 32) * m.n_padded,
                                               float(1.0 / (127.0 * std::sqrt(double(full_k)))));
    CDC_CHECK_LAUNCH();
  }
}

void CudaModel::fill_matrix(const HostCheckpoint& checkpoint, const cd_tensor_ref& ref, const DeviceMatrix& m,
                            int32_t index, int32_t row_begin, int32_t col_begin, int32_t ref_k) {
  const int32_t n = m.n;
  const int32_t k = m.k;
  ref_k = ref_k > 0 ? ref_k : k;
  const size_t element_bytes = q8_ ? 1 : 2;
  uint8_t* values = static_cast<uint8_t*>(m.values) + size_t(index) * m.n_padded * m.k_padded * element_bytes;
  std::vector<uint16_t> scale_bits;  // [k_padded / 32][n_padded] fp16 bits
  if (q8_) scale_bits.assign(size_t(m.k_padded / 32) * m.n_padded, 0);
  constexpr int32_t kSlabRows = 256;
  std::vector<float> rows(size_t(kSlabRows) * ref_k);
  std::vector<float> padded_row(size_t(m.k_padded));
  std::vector<uint16_t> bf16(size_t(kSlabRows) * m.k_padded);
  std::vector<int8_t> int8(size_t(kSlabRows) * m.k_padded);
  std::vector<uint16_t> row_scales(size_t(m.k_padded / 32));
  for (int32_t first = 0; first < n; first += kSlabRows) {
    const int32_t last = std::min(n, first + kSlabRows);
    checkpoint.read_rows(ref, ref_k, row_begin + first, row_begin + last, rows.data());
    for (int32_t r = first; r < last; ++r) {
      const float* row = rows.data() + size_t(r - first) * ref_k + col_begin;
      std::fill(padded_row.begin(), padded_row.end(), 0.0f);
      std::copy_n(row, k, padded_row.begin());
      if (q8_) {
        quantize_row_q8(padded_row.data(), m.k_padded, int8.data() + size_t(r - first) * m.k_padded, row_scales.data());
        for (int32_t b = 0; b < m.k_padded / 32; ++b) scale_bits[size_t(b) * m.n_padded + r] = row_scales[size_t(b)];
      } else {
        for (int32_t i = 0; i < m.k_padded; ++i) bf16[size_t(r - first) * m.k_padded + i] = to_bf16_bits(padded_row[size_t(i)]);
      }
    }
    const size_t bytes = size_t(last - first) * m.k_padded * element_bytes;
    CDC_CHECK(cudaMemcpy(values + size_t(first) * m.k_padded * element_bytes,
                         q8_ ? static_cast<const void*>(int8.data()) : bf16.data(), bytes, cudaMemcpyHostToDevice));
  }
  if (q8_) {
    CDC_CHECK(cudaMemcpy(m.scales + size_t(index) * scale_bits.size(), scale_bits.data(),
                         scale_bits.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
  }
}

bool CudaModel::ensure_capacity(const BatchPlan& plan, int32_t num_seqs) {
  bool moved = false;
  const int32_t tokens = std::max(plan.padded_tokens, 1);
  if (tokens > token_capacity_) {
    // Grow with headroom so a prefill does not reallocate (and drop the graphs) every step.
    token_capacity_ = std::max(tokens, std::min(token_capacity_ * 2, 8192));
    const size_t t = size_t(token_capacity_);
    residual_.reserve(t * hidden_);
    layer_out_.reserve(t * hidden_);
    q_.reserve(t * q_size_);
    k_.reserve(t * kv_size_);
    v_.reserve(t * kv_size_);
    gate_.reserve(t * intermediate_);
    up_.reserve(t * intermediate_);
    normed_.reserve(t * hidden_padded_);
    attention_out_.reserve(t * q_padded_);
    activated_.reserve(t * intermediate_padded_);
    token_ids_.reserve(t);
    positions_.reserve(t);
    token_seqs_.reserve(t);
    output_tokens_.reserve(t);
    slots_.reserve(t * num_kv_groups_);
    if (max_experts_ > 0) {
      const size_t slots = t * size_t(top_k_);
      router_logits_.reserve(t * max_experts_);
      slot_experts_.reserve(slots);
      slot_weights_.reserve(slots);
      slot_rows_.reserve(slots);
      row_tokens_.reserve(slots);
      row_experts_.reserve(slots);
      expert_starts_.reserve(size_t(max_experts_) + 1);
      moe_rows_.reserve(slots * hidden_padded_);
      moe_gate_.reserve(slots * moe_intermediate_);
      moe_up_.reserve(slots * moe_intermediate_);
      moe_activated_.reserve(slots * moe_intermediate_padded_);
      moe_out_.reserve(slots * hidden_);
      if (tp_size_ > 1) gathered_experts_.reserve(size_t(tp_size_) * slots * hidden_);
    }
    moved = true;
  }
  // Logits for the output rows (every padded token of a graphed decode step), or a prompt slab.
  const int32_t output_rows = plan.decode_only ? tokens : int32_t(plan.outputs.tokens.size());
  const int32_t logit_rows = std::max({output_rows, kPromptSlabRows, 1});
  moved |= logits_.reserve(size_t(logit_rows) * vocab_);
  moved |= output_normed_.reserve(size_t(logit_rows) * hidden_padded_);
  if (tp_size_ > 1) moved |= gathered_logits_.reserve(size_t(tp_size_) * logit_rows * slice_columns_);
  // Split-K partials of the largest matrix at few rows (the LM head's rows included).
  size_t partials = 0;
  size_t packed_columns = 0;
  const int32_t few_rows = std::min(logit_rows, 32);
  for (const DeviceLayer& layer : layers_) {
    for (const DeviceMatrix* m : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.gate_proj, &layer.up_proj}) {
      partials = std::max(partials, gemm_partials_floats(few_rows, *m));
    }
    for (const SegmentedWeights* w : {&layer.o_proj, &layer.down_proj}) {
      for (const DeviceMatrix& m : w->segments) partials = std::max(partials, gemm_partials_floats(few_rows, m));
      if (w->inputs.packed) packed_columns = std::max(packed_columns, size_t(w->end - w->first) * w->inputs.slot_columns);
    }
  }
  const int32_t segment_rows = std::min(tokens, kSegmentSlabRows);
  moved |= segment_partials_.reserve(size_t(kReductionSegments) * segment_rows * hidden_);
  moved |= packed_inputs_.reserve(size_t(segment_rows) * packed_columns);
  partials = std::max(partials, gemm_partials_floats(few_rows, lm_head_));
  moved |= gemm_partials_.reserve(partials);
  // Attention partials for a slab of tokens (run_layers attends in slabs).
  const int32_t slab = std::min(tokens, 256);
  moved |= attention_partials_.reserve(attention_partials_floats(slab, num_heads_, head_dim_, plan.num_chunks));
  moved |= block_tables_.reserve(plan.block_tables.size());
  (void)num_seqs;
  moved |= sampling_rows_.reserve(size_t(kSamplerRows));
  moved |= sampled_tokens_.reserve(size_t(kSamplerRows));
  moved |= sampled_logprobs_.reserve(size_t(kSamplerRows));
  if (sampler_ids_.size() == 0) {
    sampler_ids_.reserve(size_t(kSamplerRows) * vocab_);
    sampler_probs_.reserve(size_t(kSamplerRows) * vocab_);
    sampler_keys_.reserve(size_t(kSamplerRows) * sampler_key_stride(vocab_));
  }
  if (moved) graphs_.clear();
  return moved;
}

void CudaModel::upload_plan(const BatchPlan& plan) {
  const auto copy = [this](auto& buffer, const std::vector<int32_t>& values) {
    if (values.empty()) return;
    CDC_CHECK(cudaMemcpyAsync(buffer.get(), values.data(), values.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                              stream_));
  };
  copy(token_ids_, plan.token_ids);
  copy(positions_, plan.positions);
  copy(token_seqs_, plan.token_seqs);
  copy(slots_, plan.slots);
  copy(block_tables_, plan.block_tables);
  copy(output_tokens_, plan.outputs.tokens);
}

// Final norm of the rows' hidden states, the LM head, the soft-cap: logits_[0, num_rows).
void CudaModel::final_logits(const int32_t* device_rows, int32_t num_rows) {
  if (num_rows == 0) return;
  launch_gather_rows(residual_.get(), hidden_, device_rows, num_rows, layer_out_.get(), stream_);
  launch_rms_norm_bf16(layer_out_.get(), hidden_, final_norm_, hidden_, eps_, num_rows, output_normed_.get(),
                       hidden_padded_, stream_);
  // Alone: every column at its place in logits_. In a group: the rank's slice at its place in
  // gathered_logits_ ([size][rows][slice_columns_]), which TpGroup gathers and lays out.
  const bool alone = tp_size_ == 1;
  const int32_t stride = alone ? vocab_ : slice_columns_;
  float* logits = alone ? logits_.get() : gathered_logits_.get() + size_t(tp_rank_) * num_rows * slice_columns_;
  launch_gemm(output_normed_.get(), hidden_padded_, num_rows, lm_head_, logits, stride, false, gemm_partials_.get(),
              stream_);
  if (final_softcap_ != 0.0f) launch_softcap(logits, size_t(num_rows) * stride, final_softcap_, stream_);
}

// Embedding, every layer, then the logits of num_logit_rows rows listed in output_tokens_.
void CudaModel::run_layers(const BatchPlan& plan, int32_t num_logit_rows) {
  const int32_t tokens = plan.padded_tokens;
  embed(plan);
  for (size_t i = 0; i < layers_.size(); ++i) {
    attention(i, plan);
    for (int32_t slab = 0; slab < num_segment_slabs(tokens); ++slab) {
      segments(layers_[i].o_proj, attention_out_.get(), q_padded_, tokens, slab);
      fold(i, true, tokens, slab);
    }
    mlp(i, tokens);
    if (layers_[i].num_experts > 0) {
      combine_experts(i, tokens);
      continue;
    }
    for (int32_t slab = 0; slab < num_segment_slabs(tokens); ++slab) {
      segments(layers_[i].down_proj, activated_.get(), intermediate_padded_, tokens, slab);
      fold(i, false, tokens, slab);
    }
  }
  final_logits(output_tokens_.get(), num_logit_rows);
}

void CudaModel::embed(const BatchPlan& plan) {
  launch_embed(embed_, hidden_, token_ids_.get(), plan.padded_tokens, embedding_scale_, residual_.get(), stream_);
}

// The input norm, q/k/v, RoPE and the KV write, attention: attention_out_.
void CudaModel::attention(size_t index, const BatchPlan& plan) {
  const int32_t tokens = plan.padded_tokens;
  const DeviceLayer& layer = layers_[index];
  float* partials = gemm_partials_.get();
  launch_rms_norm_bf16(residual_.get(), hidden_, layer.input_norm, hidden_, eps_, tokens, normed_.get(), hidden_padded_,
                       stream_);
  launch_gemm(normed_.get(), hidden_padded_, tokens, layer.q_proj, q_.get(), q_size_, false, partials, stream_);
  launch_gemm(normed_.get(), hidden_padded_, tokens, layer.k_proj, k_.get(), kv_size_, false, partials, stream_);
  launch_gemm(normed_.get(), hidden_padded_, tokens, layer.v_proj, v_.get(), kv_size_, false, partials, stream_);
  const DeviceRope& rope = ropes_[size_t(layer.rope)];
  RopeKvArgs rope_args{q_.get(), k_.get(), v_.get(), layer.q_bias, layer.k_bias, layer.v_bias, layer.q_norm,
                       layer.k_norm, eps_, positions_.get(), slots_.get() + size_t(layer.kv_group) * tokens,
                       rope.inv_freq, rope.rotary_dim, rope.attention_scaling, num_heads_, num_kv_heads_, head_dim_,
                       kv_cache_, layers_per_block_, layer.kv_slot, block_size_, tokens};
  launch_rope_kv(rope_args, stream_);
  // Attention in slabs of tokens, so its partials stay bounded for long prompts.
  constexpr int32_t kSlab = 256;
  for (int32_t first = 0; first < tokens; first += kSlab) {
    const int32_t count = std::min(kSlab, tokens - first);
    AttentionArgs attention{q_.get() + size_t(first) * q_size_,
                            kv_cache_,
                            block_tables_.get() + size_t(layer.kv_group) * plan.table_rows * plan.block_table_stride,
                            plan.block_table_stride,
                            token_seqs_.get() + first,
                            positions_.get() + first,
                            layer.sinks,
                            num_heads_,
                            num_kv_heads_,
                            head_dim_,
                            layers_per_block_,
                            layer.kv_slot,
                            block_size_,
                            layer.window,
                            attention_scale_,
                            attention_softcap_,
                            count,
                            plan.num_chunks,
                            attention_partials_.get(),
                            attention_out_.get() + size_t(first) * q_padded_,
                            q_padded_};
    launch_attention(attention, stream_);
  }
}

// The ffn norm, then gate/up and the activation (activated_, down_proj's input), or a MoE layer's
// routing and experts (combine_experts adds them to the residual stream).
void CudaModel::mlp(size_t index, int32_t num_tokens) {
  const DeviceLayer& layer = layers_[index];
  const int32_t tokens = num_tokens;
  float* partials = gemm_partials_.get();
  launch_rms_norm_bf16(residual_.get(), hidden_, layer.ffn_norm, hidden_, eps_, tokens, normed_.get(), hidden_padded_,
                       stream_);
  if (layer.num_experts > 0) {
    run_experts(layer, tokens);
    return;
  }
  launch_gemm(normed_.get(), hidden_padded_, tokens, layer.gate_proj, gate_.get(), intermediate_, false, partials,
              stream_);
  launch_gemm(normed_.get(), hidden_padded_, tokens, layer.up_proj, up_.get(), intermediate_, false, partials, stream_);
  launch_gated_activation(gate_.get(), up_.get(), intermediate_, tokens, activation_, swiglu_alpha_, swiglu_limit_,
                          activated_.get(), intermediate_padded_, stream_);
}

// Segment s's product for the slab's rows into segment_partials_[s] ([8][rows][hidden]), for the
// rank's segments: input holds the rank's inputs (local columns from w.bounds[w.first]).
void CudaModel::segments(const SegmentedWeights& w, const __nv_bfloat16* input, int32_t input_stride,
                         int32_t num_tokens, int32_t slab) {
  const int32_t rows = slab_rows(num_tokens, slab);
  const __nv_bfloat16* x = input + size_t(slab) * kSegmentSlabRows * input_stride;
  int32_t x_stride = input_stride;
  if (w.inputs.packed) {
    SegmentSlots slots{};
    std::copy(w.bounds.begin(), w.bounds.end(), slots.bounds);
    slots.first = w.first;
    slots.end = w.end;
    slots.slot = w.inputs.slot_columns;
    launch_pack_segments(x, input_stride, rows, slots, packed_inputs_.get(), stream_);
    x = packed_inputs_.get();
    x_stride = (w.end - w.first) * w.inputs.slot_columns;
  }
  for (int32_t s = w.first; s < w.end; ++s) {
    float* partial = segment_partials_.get() + size_t(s) * rows * hidden_;
    const DeviceMatrix& m = w.segments[size_t(s)];
    if (m.k == 0) {
      CDC_CHECK(cudaMemsetAsync(partial, 0, size_t(rows) * hidden_ * sizeof(float), stream_));
      continue;
    }
    const size_t column = w.inputs.packed ? size_t(s - w.first) * w.inputs.slot_columns
                                          : size_t(w.bounds[size_t(s)] - w.bounds[size_t(w.first)]);
    launch_gemm(x + column, x_stride, rows, m, partial, hidden_, false, gemm_partials_.get(), stream_);
  }
}

// The slab's eight partials folded by the fixed tree into the residual stream (through the
// layer's output bias and norm when it has them).
void CudaModel::fold(size_t index, bool attention_output, int32_t num_tokens, int32_t slab) {
  const DeviceLayer& layer = layers_[index];
  const int32_t rows = slab_rows(num_tokens, slab);
  const size_t first_row = size_t(slab) * kSegmentSlabRows;
  const float* bias = attention_output ? layer.o_bias : nullptr;
  const float* norm = attention_output ? layer.attn_out_norm : layer.ffn_out_norm;
  float* residual = residual_.get() + first_row * hidden_;
  if (bias == nullptr && norm == nullptr) {
    launch_fold_segments(segment_partials_.get(), rows, hidden_, residual, hidden_, true, stream_);
    return;
  }
  float* out = layer_out_.get() + first_row * hidden_;
  launch_fold_segments(segment_partials_.get(), rows, hidden_, out, hidden_, false, stream_);
  launch_add_to_residual(residual, out, bias, norm, hidden_, eps_, rows, stream_);
}

// The MoE MLP over normed_ (the ffn norm's bf16 rows): src/moe.cc's steps on the device, routed
// from fp32 rows as the CPU routes. Every rank routes and groups alike and runs its own experts'
// rows (at their grouped places) into expert_outputs(); the rows of other ranks' experts are left
// as they are, the gather brings them.
void CudaModel::run_experts(const DeviceLayer& layer, int32_t num_tokens) {
  const int32_t num_experts = layer.num_experts;
  const int32_t num_slots = num_tokens * top_k_;
  float* normed_f32 = layer_out_.get();
  launch_rms_norm_f32(residual_.get(), hidden_, layer.ffn_norm, hidden_, eps_, num_tokens, normed_f32, hidden_, stream_);
  launch_router_logits(normed_f32, hidden_, num_tokens, layer.router, num_experts, hidden_, layer.router_bias,
                       router_logits_.get(), stream_);
  launch_moe_route(router_logits_.get(), num_tokens, num_experts, top_k_, routing_, norm_topk_prob_, slot_experts_.get(),
                   slot_weights_.get(), stream_);
  launch_moe_group(slot_experts_.get(), num_slots, top_k_, num_experts, expert_starts_.get(), slot_rows_.get(),
                   row_tokens_.get(), row_experts_.get(), stream_);
  // A rank with no expert of this layer (fewer experts than ranks) only routes, for the combine.
  if (layer.held_experts == 0) return;
  launch_gather_bf16(normed_.get(), hidden_padded_, row_tokens_.get(), num_slots, hidden_padded_, moe_rows_.get(),
                     hidden_padded_, stream_);
  // The rank's experts are groups [expert_begin, expert_begin + held_experts) of the grouping, their
  // rows at the same places as at TP = 1. A token picks distinct experts, so no expert has more
  // rows than there are tokens.
  const int32_t* starts = expert_starts_.get() + layer.expert_begin;
  launch_grouped_gemm(moe_rows_.get(), hidden_padded_, num_tokens, layer.expert_gate, starts, layer.held_experts,
                      moe_gate_.get(), moe_intermediate_, stream_);
  launch_grouped_gemm(moe_rows_.get(), hidden_padded_, num_tokens, layer.expert_up, starts, layer.held_experts,
                      moe_up_.get(), moe_intermediate_, stream_);
  launch_expert_bias(moe_gate_.get(), moe_intermediate_, num_slots, row_experts_.get(), layer.expert_gate_bias, stream_);
  launch_expert_bias(moe_up_.get(), moe_intermediate_, num_slots, row_experts_.get(), layer.expert_up_bias, stream_);
  launch_gated_activation(moe_gate_.get(), moe_up_.get(), moe_intermediate_, num_slots, activation_, swiglu_alpha_,
                          swiglu_limit_, moe_activated_.get(), moe_intermediate_padded_, stream_);
  launch_grouped_gemm(moe_activated_.get(), moe_intermediate_padded_, num_tokens, layer.expert_down, starts,
                      layer.held_experts, expert_outputs(num_tokens), hidden_, stream_);
}

// Every expert's rows (in a group: each from its owner's slot of the gathered outputs), combined in
// each token's slot order into the residual stream.
void CudaModel::combine_experts(size_t index, int32_t num_tokens) {
  const DeviceLayer& layer = layers_[index];
  const int32_t num_slots = num_tokens * top_k_;
  if (tp_size_ > 1) {
    launch_select_expert_rows(gathered_experts_.get(), size_t(num_slots) * hidden_, hidden_, row_experts_.get(),
                              layer.expert_owners, num_slots, moe_out_.get(), stream_);
  }
  launch_moe_combine(moe_out_.get(), hidden_, slot_rows_.get(), slot_experts_.get(), slot_weights_.get(),
                     layer.expert_down_bias, top_k_, num_tokens, residual_.get(), stream_);
}

void CudaModel::forward(const cd_batch& batch, cd_forward_output& output) {
  CDC_CHECK(cudaSetDevice(device_));
  const BatchPlan plan = plan_batch(batch, num_kv_groups_, block_size_, kKvChunkTokens, graphs_enabled_);
  ensure_capacity(plan, batch.num_seqs);
  const bool graphed = graphs_enabled_ && plan.decode_only && graph_bucket(plan.num_tokens) > 0;
  if (graphed) {
    // A decode step's logits are computed for every padded token (row = token), so the captured
    // graph does not depend on which sequences ask for them.
    std::vector<int32_t> every_token(size_t(plan.padded_tokens));
    for (int32_t t = 0; t < plan.padded_tokens; ++t) every_token[size_t(t)] = t;
    BatchPlan graph_plan = plan;
    graph_plan.outputs.tokens = every_token;
    upload_plan(graph_plan);
    const GraphCache<cudaGraphExec_t>::Key key{plan.padded_tokens, plan.num_chunks};
    cudaGraphExec_t exec = graphs_.find(key);
    if (exec == nullptr) {
      cudaGraph_t graph = nullptr;
      CDC_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      try {
        run_layers(plan, plan.padded_tokens);
      } catch (...) {
        cudaStreamEndCapture(stream_, &graph);
        if (graph != nullptr) cudaGraphDestroy(graph);
        throw;
      }
      CDC_CHECK(cudaStreamEndCapture(stream_, &graph));
      const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
      cudaGraphDestroy(graph);
      CDC_CHECK(instantiated);
      graphs_.insert(key, exec);
    }
    CDC_CHECK(cudaGraphLaunch(exec, stream_));
  } else {
    upload_plan(plan);
    run_layers(plan, int32_t(plan.outputs.tokens.size()));
  }
  produce_outputs(batch, plan, graphed, output);
  produce_prompt_logprobs(batch, plan, output);
  CDC_CHECK(cudaStreamSynchronize(stream_));
}

void CudaModel::produce_outputs(const cd_batch& batch, const BatchPlan& plan, bool logits_by_token,
                                cd_forward_output& output) {
  const OutputRows& rows = plan.outputs;
  const size_t num_sample_rows = size_t(batch.num_seqs) * size_t(rows.sample_stride);
  std::fill_n(output.sampled_token_ids, num_sample_rows, -1);
  std::fill_n(output.sampled_logprobs, num_sample_rows, 0.0f);
  std::fill_n(output.top_token_ids, num_sample_rows * CD_MAX_TOP_LOGPROBS, -1);
  std::fill_n(output.top_logprobs, num_sample_rows * CD_MAX_TOP_LOGPROBS, kNaN);
  // Output row -> its sample: row j of its sequence's rows is the j-th sample.
  const auto sample_index = [&rows](int32_t row) { return row - rows.first_rows[size_t(rows.seqs[size_t(row)])]; };
  const auto sample_row = [&](int32_t row) {
    return size_t(rows.seqs[size_t(row)]) * size_t(rows.sample_stride) + size_t(sample_index(row));
  };
  // Device sampling, kSamplerRows rows at a time.
  const size_t vocab = size_t(vocab_);
  std::vector<DeviceSamplingRow> sampling;
  std::vector<int32_t> tokens(static_cast<size_t>(kSamplerRows));
  std::vector<float> logprobs(static_cast<size_t>(kSamplerRows));
  for (size_t first = 0; first < plan.device_sampled_rows.size(); first += kSamplerRows) {
    const size_t count = std::min(plan.device_sampled_rows.size() - first, size_t(kSamplerRows));
    sampling.clear();
    for (size_t i = first; i < first + count; ++i) {
      const int32_t row = plan.device_sampled_rows[i];
      const SamplingParams params = sampling_params_of(batch, rows.seqs[size_t(row)], sample_index(row));
      sampling.push_back(DeviceSamplingRow{params.temperature, params.top_p, params.min_p, params.top_k, params.seed,
                                           params.output_index, logits_row(plan, row, logits_by_token)});
    }
    CDC_CHECK(cudaMemcpyAsync(sampling_rows_.get(), sampling.data(), count * sizeof(DeviceSamplingRow),
                              cudaMemcpyHostToDevice, stream_));
    SamplerScratchDevice scratch{sampler_ids_.get(), sampler_keys_.get(), sampler_probs_.get(), kSamplerRows};
    launch_sample(logits_.get(), vocab_, sampling_rows_.get(), int32_t(count), scratch, sampled_tokens_.get(),
                  sampled_logprobs_.get(), stream_);
    CDC_CHECK(cudaMemcpyAsync(tokens.data(), sampled_tokens_.get(), count * sizeof(int32_t), cudaMemcpyDeviceToHost,
                              stream_));
    CDC_CHECK(cudaMemcpyAsync(logprobs.data(), sampled_logprobs_.get(), count * sizeof(float), cudaMemcpyDeviceToHost,
                              stream_));
    CDC_CHECK(cudaStreamSynchronize(stream_));
    for (size_t i = 0; i < count; ++i) {
      const size_t target = sample_row(plan.device_sampled_rows[first + i]);
      output.sampled_token_ids[target] = tokens[i];
      output.sampled_logprobs[target] = logprobs[i];
    }
  }
  if (!plan.host_rows.empty()) {
    // Rows the host needs: returned logits, and sampling the device sampler does not cover.
    host_logits_.resize(plan.host_rows.size() * vocab);
    for (size_t i = 0; i < plan.host_rows.size(); ++i) {
      const int32_t row = logits_row(plan, plan.host_rows[i], logits_by_token);
      CDC_CHECK(cudaMemcpyAsync(host_logits_.data() + i * vocab, logits_.get() + size_t(row) * vocab,
                                vocab * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    }
    CDC_CHECK(cudaStreamSynchronize(stream_));
    bool waited = false;
    for (size_t i = 0; i < plan.host_rows.size(); ++i) {
      const int32_t row = plan.host_rows[i];
      const int32_t seq = rows.seqs[size_t(row)];
      const float* logits = host_logits_.data() + i * vocab;
      const auto returned = std::lower_bound(rows.returned_rows.begin(), rows.returned_rows.end(), row);
      if (returned != rows.returned_rows.end() && *returned == row) {
        std::copy_n(logits, vocab, output.logits + size_t(returned - rows.returned_rows.begin()) * vocab);
      }
      if (!(batch.seq_flags[seq] & CD_SEQ_SAMPLE) || samples_on_device(batch, seq)) continue;
      // A sequence with proposals samples its rows in order and stops, as the CPU pass does, at
      // the first sample that is not the next proposal.
      const int32_t j = sample_index(row);
      const size_t target = sample_row(row);
      const int32_t* drafts = batch.token_ids + batch.query_starts[seq + 1] - num_draft_tokens(batch, seq);
      if (j > 0 && output.sampled_token_ids[target - 1] != drafts[j - 1]) continue;
      if (!waited) {
        wait_for_bitmasks(batch);
        waited = true;
      }
      const LogSoftmax raw = log_softmax_of(host_kernels_, logits, vocab_);
      const int32_t token = sample_token(host_kernels_, logits, vocab_, raw.best, sampling_params_of(batch, seq, j),
                                         logit_adjustments_of(batch, seq, j), allowed_bits_of(batch, seq),
                                         host_sampler_[0]);
      output.sampled_token_ids[target] = token;
      output.sampled_logprobs[target] = raw.at(logits, token);
      top_logprobs(logits, vocab_, raw, batch.num_top_logprobs[seq], output.top_token_ids + target * CD_MAX_TOP_LOGPROBS,
                   output.top_logprobs + target * CD_MAX_TOP_LOGPROBS);
    }
  }
  settle_proposals(batch, rows.sample_stride, output);
}

void CudaModel::produce_prompt_logprobs(const cd_batch& batch, const BatchPlan& plan, cd_forward_output& output) {
  if (output.prompt_logprobs == nullptr) return;
  const size_t num_tokens = size_t(batch.num_tokens);
  std::fill_n(output.prompt_logprobs, num_tokens, kNaN);
  std::fill_n(output.prompt_ranks, num_tokens, 0);
  if (output.prompt_top_token_ids != nullptr) {
    std::fill_n(output.prompt_top_token_ids, num_tokens * CD_MAX_TOP_LOGPROBS, -1);
    std::fill_n(output.prompt_top_logprobs, num_tokens * CD_MAX_TOP_LOGPROBS, kNaN);
  }
  const size_t vocab = size_t(vocab_);
  const std::vector<int32_t>& prompt_tokens = plan.outputs.prompt_tokens;
  const int32_t num_rows = int32_t(prompt_tokens.size());
  for (int32_t first = 0; first < num_rows; first += kPromptSlabRows) {
    const int32_t count = std::min(kPromptSlabRows, num_rows - first);
    logits_of_rows(prompt_tokens.data() + first, count);
    host_logits_.resize(size_t(count) * vocab);
    CDC_CHECK(cudaMemcpyAsync(host_logits_.data(), logits_.get(), size_t(count) * vocab * sizeof(float),
                              cudaMemcpyDeviceToHost, stream_));
    CDC_CHECK(cudaStreamSynchronize(stream_));
    for (int32_t i = 0; i < count; ++i) {
      const int32_t token = prompt_tokens[size_t(first + i)];
      const int32_t seq = plan.token_seqs[size_t(token)];
      const int32_t next = prompt_next_token(batch, seq, token);
      const float* logits = host_logits_.data() + size_t(i) * vocab;
      const LogSoftmax raw = log_softmax_of(host_kernels_, logits, vocab_);
      output.prompt_logprobs[token] = raw.at(logits, next);
      output.prompt_ranks[token] = rank_of(logits, vocab_, next);
      const int32_t num_top = batch.num_prompt_top_logprobs[seq];
      if (num_top == 0) continue;
      const size_t top_row = size_t(token) * CD_MAX_TOP_LOGPROBS;
      top_logprobs(logits, vocab_, raw, num_top, output.prompt_top_token_ids + top_row,
                   output.prompt_top_logprobs + top_row);
    }
  }
}

// A tensor-parallel group of ranks in this process (plan_rank's shards), one stream each, driven
// by one host thread through tp_schedule: every rank's work before the all-gather that needs it,
// the all-gather (DeviceGroup: NCCL, or copies between ranks on one GPU) before any rank reads
// it. Every rank folds the same gathered partials in the same tree, so the residual streams stay
// equal, and the logits are TP = 1's bits. Rank 0 samples and returns the outputs.
class TpGroup {
 public:
  TpGroup(const cd_model_spec& spec, const cd_load_options& options, uint64_t random_seed,
          const std::vector<int32_t>& devices);
  ~TpGroup();
  void forward(const cd_batch& batch, cd_forward_output& output);
  // The logits of num_rows rows listed on the host, laid out in rank 0's logits_.
  void logits_of_rows(const int32_t* host_rows, int32_t num_rows);
  uint64_t kv_bytes_per_block() const { return ranks_[0]->kv_bytes_per_block(); }

 private:
  void run(const BatchPlan& plan, int32_t num_logit_rows);
  void gather_partials(int32_t num_rows);
  void gather_logits(int32_t num_rows);
  void gather_expert_outputs(int32_t num_tokens);
  // Every other rank's stream waits for the work already on `from`'s stream.
  void others_wait_for(int32_t from);
  // `to`'s stream waits for the work already on every other rank's stream.
  void wait_for_others(int32_t to);
  void capture(const BatchPlan& plan, cudaGraphExec_t& exec);

  int32_t size_;
  bool graphs_enabled_;
  GraphCache<cudaGraphExec_t> graphs_;
  std::vector<cudaEvent_t> events_;  // one per rank, on its device
  std::vector<std::unique_ptr<CudaModel>> ranks_;
  std::unique_ptr<DeviceGroup> group_;
  std::string nccl_why_;
  std::vector<TpOp> schedule_;
  int32_t schedule_slabs_ = -1;
  std::vector<const void*> mine_;
  std::vector<void*> all_;
};

TpGroup::TpGroup(const cd_model_spec& spec, const cd_load_options& options, uint64_t random_seed,
                 const std::vector<int32_t>& devices)
    : size_(int32_t(devices.size())),
      graphs_(kGraphCapacity, [](cudaGraphExec_t exec) { cudaGraphExecDestroy(exec); }),
      mine_(devices.size()),
      all_(devices.size()) {
  std::vector<DeviceRank> streams;
  for (int32_t rank = 0; rank < size_; ++rank) {
    const RankShard shard = plan_rank(spec, rank, size_);
    ranks_.push_back(std::make_unique<CudaModel>(spec, options, random_seed, shard, devices[size_t(rank)]));
    streams.push_back(DeviceRank{devices[size_t(rank)], ranks_.back()->stream_});
    cudaEvent_t event = nullptr;
    CDC_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    events_.push_back(event);
  }
  graphs_enabled_ = ranks_[0]->group_graphs_;
  ranks_[0]->group_ = this;
  group_ = open_device_group(streams, nccl_why_);
}

TpGroup::~TpGroup() {
  for (const std::unique_ptr<CudaModel>& rank : ranks_) {
    cudaSetDevice(rank->device_);
    cudaStreamSynchronize(rank->stream_);
  }
  graphs_.clear();
  for (size_t r = 0; r < events_.size(); ++r) {
    cudaSetDevice(ranks_[r]->device_);
    cudaEventDestroy(events_[r]);
  }
  group_.reset();
  ranks_.clear();
}

void TpGroup::forward(const cd_batch& batch, cd_forward_output& output) {
  CudaModel& lead = *ranks_[0];
  const BatchPlan plan = plan_batch(batch, lead.num_kv_groups_, lead.block_size_, kKvChunkTokens, graphs_enabled_);
  // A decode step replays one graph over every rank's stream, captured as TP = 1's is
  // (CudaModel::forward): logits for every padded token, keyed by (bucket, chunks).
  const bool graphed = graphs_enabled_ && plan.decode_only && graph_bucket(plan.num_tokens) > 0;
  BatchPlan uploaded = plan;
  if (graphed) {
    uploaded.outputs.tokens.resize(size_t(plan.padded_tokens));
    for (int32_t t = 0; t < plan.padded_tokens; ++t) uploaded.outputs.tokens[size_t(t)] = t;
  }
  bool moved = false;
  for (const std::unique_ptr<CudaModel>& rank : ranks_) {
    CDC_CHECK(cudaSetDevice(rank->device_));
    moved |= rank->ensure_capacity(plan, batch.num_seqs);
    rank->upload_plan(uploaded);
  }
  if (moved) graphs_.clear();
  if (graphed) {
    const GraphCache<cudaGraphExec_t>::Key key{plan.padded_tokens, plan.num_chunks};
    cudaGraphExec_t exec = graphs_.find(key);
    if (exec == nullptr) {
      capture(plan, exec);
      graphs_.insert(key, exec);
    }
    // The graph runs on rank 0's stream after every rank's upload; every rank's later work after it.
    wait_for_others(0);
    CDC_CHECK(cudaSetDevice(lead.device_));
    CDC_CHECK(cudaGraphLaunch(exec, lead.stream_));
    others_wait_for(0);
  } else {
    run(plan, int32_t(plan.outputs.tokens.size()));
  }
  CDC_CHECK(cudaSetDevice(lead.device_));
  lead.produce_outputs(batch, plan, graphed, output);
  lead.produce_prompt_logprobs(batch, plan, output);
  for (const std::unique_ptr<CudaModel>& rank : ranks_) {
    CDC_CHECK(cudaSetDevice(rank->device_));
    CDC_CHECK(cudaStreamSynchronize(rank->stream_));
  }
}

void TpGroup::others_wait_for(int32_t from) {
  CudaModel& source = *ranks_[size_t(from)];
  CDC_CHECK(cudaSetDevice(source.device_));
  CDC_CHECK(cudaEventRecord(events_[size_t(from)], source.stream_));
  for (int32_t r = 0; r < size_; ++r) {
    if (r == from) continue;
    CDC_CHECK(cudaSetDevice(ranks_[size_t(r)]->device_));
    CDC_CHECK(cudaStreamWaitEvent(ranks_[size_t(r)]->stream_, events_[size_t(from)], 0));
  }
}

void TpGroup::wait_for_others(int32_t to) {
  for (int32_t r = 0; r < size_; ++r) {
    if (r == to) continue;
    CDC_CHECK(cudaSetDevice(ranks_[size_t(r)]->device_));
    CDC_CHECK(cudaEventRecord(events_[size_t(r)], ranks_[size_t(r)]->stream_));
  }
  CDC_CHECK(cudaSetDevice(ranks_[size_t(to)]->device_));
  for (int32_t r = 0; r < size_; ++r) {
    if (r != to) CDC_CHECK(cudaStreamWaitEvent(ranks_[size_t(to)]->stream_, events_[size_t(r)], 0));
  }
}

// The step's whole schedule captured from rank 0's stream: the other ranks' streams join the
// capture by waiting on an event recorded in it (fork) and leave it when rank 0 waits on theirs
// (join). The collectives (NCCL's, or the copy group's copies and events) are captured with it.
void TpGroup::capture(const BatchPlan& plan, cudaGraphExec_t& exec) {
  CudaModel& lead = *ranks_[0];
  cudaGraph_t graph = nullptr;
  CDC_CHECK(cudaSetDevice(lead.device_));
  CDC_CHECK(cudaStreamBeginCapture(lead.stream_, cudaStreamCaptureModeRelaxed));
  try {
    others_wait_for(0);
    run(plan, plan.padded_tokens);
    wait_for_others(0);
  } catch (...) {
    cudaSetDevice(lead.device_);
    cudaStreamEndCapture(lead.stream_, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    throw;
  }
  CDC_CHECK(cudaSetDevice(lead.device_));
  CDC_CHECK(cudaStreamEndCapture(lead.stream_, &graph));
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  CDC_CHECK(instantiated);
}

void TpGroup::run(const BatchPlan& plan, int32_t num_logit_rows) {
  const int32_t tokens = plan.padded_tokens;
  const int32_t slabs = num_segment_slabs(tokens);
  if (slabs != schedule_slabs_) {
    std::vector<int32_t> layer_experts;
    for (const DeviceLayer& layer : ranks_[0]->layers_) layer_experts.push_back(layer.num_experts);
    schedule_ = tp_schedule(layer_experts, size_, slabs);
    schedule_slabs_ = slabs;
  }
  for (const TpOp& op : schedule_) {
    if (op.kind == TpOpKind::kGatherAttentionPartials || op.kind == TpOpKind::kGatherMlpPartials) {
      gather_partials(slab_rows(tokens, op.slab));
      continue;
    }
    if (op.kind == TpOpKind::kGatherLogits) {
      gather_logits(num_logit_rows);
      continue;
    }
    if (op.kind == TpOpKind::kGatherExpertOutputs) {
      gather_expert_outputs(tokens);
      continue;
    }
    CudaModel& rank = *ranks_[size_t(op.rank)];
    CDC_CHECK(cudaSetDevice(rank.device_));
    const size_t layer = size_t(op.layer);
    switch (op.kind) {
      case TpOpKind::kEmbed: rank.embed(plan); break;
      case TpOpKind::kAttention: rank.attention(layer, plan); break;
      case TpOpKind::kAttentionSegments:
        rank.segments(rank.layers_[layer].o_proj, rank.attention_out_.get(), rank.q_padded_, tokens, op.slab);
        break;
      case TpOpKind::kFoldAttention: rank.fold(layer, true, tokens, op.slab); break;
      case TpOpKind::kMlp: rank.mlp(layer, tokens); break;
      case TpOpKind::kMlpSegments:
        rank.segments(rank.layers_[layer].down_proj, rank.activated_.get(), rank.intermediate_padded_, tokens, op.slab);
        break;
      case TpOpKind::kFoldMlp: rank.fold(layer, false, tokens, op.slab); break;
      case TpOpKind::kCombineExperts: rank.combine_experts(layer, tokens); break;
      case TpOpKind::kLogitsSlice: rank.final_logits(rank.output_tokens_.get(), num_logit_rows); break;
      default: break;
    }
  }
}

// Every rank's segments of the slab's partials onto every rank, in place (partials_layout).
void TpGroup::gather_partials(int32_t num_rows) {
  const PartialsLayout layout = partials_layout(size_, num_rows, ranks_[0]->hidden_);
  for (int32_t r = 0; r < size_; ++r) {
    float* partials = ranks_[size_t(r)]->segment_partials_.get();
    mine_[size_t(r)] = partials + layout.rank_offset_floats(r);
    all_[size_t(r)] = partials;
  }
  group_->all_gather(mine_.data(), layout.rank_bytes(), all_.data());
}

// Every rank's expert output rows onto every rank, in place: slot r of gathered_experts_ holds rank
// r's experts' rows at their grouped places (the rest of the slot is never read).
void TpGroup::gather_expert_outputs(int32_t num_tokens) {
  const size_t slot_floats = size_t(num_tokens) * ranks_[0]->top_k_ * ranks_[0]->hidden_;
  if (slot_floats == 0) return;
  for (int32_t r = 0; r < size_; ++r) {
    float* gathered = ranks_[size_t(r)]->gathered_experts_.get();
    mine_[size_t(r)] = gathered + size_t(r) * slot_floats;
    all_[size_t(r)] = gathered;
  }
  group_->all_gather(mine_.data(), slot_floats * sizeof(float), all_.data());
}

// Every rank's vocabulary slice gathered (in place), then laid out as rank 0's logits_ [rows][vocab].
void TpGroup::gather_logits(int32_t num_rows) {
  if (num_rows == 0) return;
  CudaModel& lead = *ranks_[0];
  const size_t slice_floats = size_t(num_rows) * lead.slice_columns_;
  for (int32_t r = 0; r < size_; ++r) {
    float* gathered = ranks_[size_t(r)]->gathered_logits_.get();
    mine_[size_t(r)] = gathered + size_t(r) * slice_floats;
    all_[size_t(r)] = gathered;
  }
  group_->all_gather(mine_.data(), slice_floats * sizeof(float), all_.data());
  CDC_CHECK(cudaSetDevice(lead.device_));
  for (const std::unique_ptr<CudaModel>& rank : ranks_) {
    CDC_CHECK(cudaMemcpy2DAsync(lead.logits_.get() + rank->vocab_begin_, size_t(lead.vocab_) * sizeof(float),
                                lead.gathered_logits_.get() + size_t(rank->tp_rank_) * slice_floats,
                                size_t(lead.slice_columns_) * sizeof(float), size_t(rank->vocab_slice_) * sizeof(float),
                                size_t(num_rows), cudaMemcpyDeviceToDevice, lead.stream_));
  }
}

void TpGroup::logits_of_rows(const int32_t* host_rows, int32_t num_rows) {
  for (const std::unique_ptr<CudaModel>& rank : ranks_) {
    CDC_CHECK(cudaSetDevice(rank->device_));
    CDC_CHECK(cudaMemcpyAsync(rank->output_tokens_.get(), host_rows, size_t(num_rows) * sizeof(int32_t),
                              cudaMemcpyHostToDevice, rank->stream_));
    rank->final_logits(rank->output_tokens_.get(), num_rows);
  }
  gather_logits(num_rows);
}

void CudaModel::logits_of_rows(const int32_t* host_rows, int32_t num_rows) {
  if (group_ != nullptr) {
    group_->logits_of_rows(host_rows, num_rows);
    return;
  }
  CDC_CHECK(cudaMemcpyAsync(output_tokens_.get(), host_rows, size_t(num_rows) * sizeof(int32_t),
                            cudaMemcpyHostToDevice, stream_));
  final_logits(output_tokens_.get(), num_rows);
}

namespace {

// The devices of a group's ranks: deviceIndex + rank, or every rank on deviceIndex when
// CONDUIT_CUDA_TP_ONE_DEVICE=1 (how one GPU tests tensor parallelism; not for serving).
std::vector<int32_t> group_devices(const cd_load_options& options) {
  const char* one_device = std::getenv("CONDUIT_CUDA_TP_ONE_DEVICE");
  const bool shared = one_device != nullptr && std::string(one_device) == "1";
  int32_t count = 0;
  CDC_CHECK(cudaGetDeviceCount(&count));
  const int32_t size = options.tp_size;
  if (!shared && options.device_index + size > count) {
    throw Error(CD_ERR_UNSUPPORTED_DEVICE,
                "tensorParallel size " + std::to_string(size) + " runs one rank per GPU, on devices " +
                    std::to_string(options.device_index) + ".." + std::to_string(options.device_index + size - 1) +
                    ", but this machine has " + std::to_string(count) +
                    " CUDA device(s) (CONDUIT_CUDA_TP_ONE_DEVICE=1 puts every rank on deviceIndex, for testing)");
  }
  std::vector<int32_t> devices;
  for (int32_t rank = 0; rank < size; ++rank) devices.push_back(shared ? options.device_index : options.device_index + rank);
  return devices;
}

}  // namespace

CudaModelHandle::CudaModelHandle() = default;
CudaModelHandle::~CudaModelHandle() = default;

CudaModelHandle* load_model(const cd_model_spec& spec, const cd_load_options& options, uint64_t random_seed) {
  auto handle = std::make_unique<CudaModelHandle>();
  if (options.tp_size > 1) {
    handle->group = std::make_unique<TpGroup>(spec, options, random_seed, group_devices(options));
  } else {
    handle->model = std::make_unique<CudaModel>(spec, options, random_seed, plan_rank(spec, 0, 1), options.device_index);
  }
  return handle.release();
}

uint64_t kv_bytes_per_block(const CudaModelHandle& handle) {
  return handle.group != nullptr ? handle.group->kv_bytes_per_block() : handle.model->kv_bytes_per_block();
}

void forward(CudaModelHandle& handle, const cd_batch& batch, cd_forward_output& output) {
  if (handle.group != nullptr) {
    handle.group->forward(batch, output);
    return;
  }
  handle.model->forward(batch, output);
}

void free_model(CudaModelHandle* handle) { delete handle; }

}  // namespace cuda
}  // namespace conduit
