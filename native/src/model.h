// A loaded model: resolved weights, the paged KV cache, the kernel table, the thread pool and
// the scratch buffers a forward pass reuses.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm.h"
#include "conduit.h"
#include "kernels.h"
#include "matmul.h"
#include "moe.h"
#include "output_rows.h"
#include "row_parallel.h"
#include "sampler.h"
#include "thread_pool.h"
#include "weights.h"

namespace conduit {

struct Dimensions {
  int32_t num_layers;
  int32_t hidden_size;
  int32_t intermediate_size;
  int32_t moe_intermediate_size;
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t vocab_size;
  double rms_norm_eps;
  int32_t num_experts_per_token;

  int32_t q_size() const { return num_heads * head_dim; }
  int32_t kv_size() const { return num_kv_heads * head_dim; }
};

// What the architecture computes beyond Llama's shape (cd_model_spec documents each).
struct Numerics {
  float embedding_scale;  // rounded to the weight dtype, as transformers holds it
  float attention_scale;
  float attention_softcap;  // 0: off
  float final_softcap;
  cd_activation activation;
  float swiglu_alpha;
  float swiglu_limit;
  cd_routing routing;
  bool norm_topk_prob;
};

// Rotary embeddings of the layers that name it: cos and sin of position * inv_freq[i], scaled.
struct RopeTable {
  int32_t rotary_dim;
  std::vector<double> inv_freq;  // [rotary_dim / 2]
  double attention_scaling;
};

// The [vocab, hidden] embedding table, read a row at a time and never quantized.
struct Embedding {
  const void* data;
  cd_dtype dtype;
};

struct Expert {
  // gate_up: gate's and up's panels interleaved (gate panel p, up panel p, ...), so a task's tile
  // of both streams as one run; then gate_proj and up_proj are empty. Else (their formats or
  // sizes differ) gate_up is empty and each is a matrix of its own.
  Matrix gate_up;
  Matrix gate_proj, up_proj, down_proj;
  const float* gate_bias;  // nullptr when the architecture has none
  const float* up_bias;
  const float* down_bias;
};

struct Layer {
  const float* input_norm;
  Matrix q_proj, k_proj, v_proj;
  const float* q_bias;  // nullptr when the architecture has none
  const float* k_bias;
  const float* v_bias;
  const float* q_norm;  // [head_dim], or nullptr
  const float* k_norm;
  const float* sinks;   // [num_heads], or nullptr
  SegmentedMatrix o_proj;  // row-parallel: a sum in a fixed order at every TP size (row_parallel.h)
  const float* o_bias;
  const float* attn_out_norm;  // nullptr: o_proj adds straight into the residual stream
  const float* ffn_norm;
  const float* ffn_out_norm;   // nullptr: down_proj adds straight into the residual stream
  int32_t sliding_window_tokens;  // 0 = unlimited
  int32_t rope;
  int32_t kv_group;
  int32_t kv_slot;
  Matrix gate_proj, up_proj;             // dense MLP
  SegmentedMatrix down_proj;
  Matrix router;                         // MoE: [num_experts, hidden], fp32 panels
  const float* router_bias;
  std::vector<Expert> experts;           // empty for a dense MLP

  bool is_moe() const { return !experts.empty(); }
};

// How one (layer, K or V, block, kv head) region of block_size x head_dim elements is laid out.
// kRows: [slot][head_dim], each key and value contiguous. kBf16Pairs (a bf16 cache read by
// AVX512_BF16 dot products, KernelTable::score_key_groups): keys [head_dim / 2][slot][2], so one
// load holds a pair of dims of 16 keys; values [slot / 2][head_dim][2], so one load holds 16 dims
// of a pair of slots.
enum class KvLayout { kRows, kBf16Pairs };

// K and V in one allocation, laid out [block][layer slot][K, V][kv_head][region]: a block belongs
// to one KV-cache group at a time and holds layers_per_block of that group's layers (model.h's
// Layer::kv_slot), so one head's keys of a block are contiguous for attention.
class KvCache {
 public:
  KvCache(const Dimensions& dims, cd_dtype dtype, KvLayout layout, int32_t num_blocks, int32_t block_size_tokens,
          int32_t layers_per_block);

  cd_dtype dtype() const { return dtype_; }
  KvLayout layout() const { return layout_; }
  int32_t block_size_tokens() const { return block_size_tokens_; }
  uint64_t bytes_per_block() const { return bytes_per_block_; }

  // The block_size x head_dim elements of one head in one block, for the layer in layer_slot.
  void* region(int32_t layer_slot, int32_t kv, int32_t block, int32_t kv_head) const {
    const size_t index = ((size_t(block) * layers_per_block_ + size_t(layer_slot)) * 2 + size_t(kv)) * num_kv_heads_ + size_t(kv_head);
    return static_cast<uint8_t*>(data_.get()) + index * size_t(block_size_tokens_) * row_bytes_;
  }

  // kRows only: the head_dim elements of one head at one slot (block * block_size + offset).
  void* at(int32_t layer_slot, int32_t kv, int32_t slot, int32_t kv_head) const {
    return static_cast<uint8_t*>(region(layer_slot, kv, slot / block_size_tokens_, kv_head)) +
           size_t(slot % block_size_tokens_) * row_bytes_;
  }

  // Writes one head's key (kv 0) or value (kv 1) at a slot, converted to the cache dtype.
  void store(int32_t layer_slot, int32_t kv, int32_t slot, int32_t kv_head, const float* values) const;

 private:
  cd_dtype dtype_;
  KvLayout layout_;
  size_t num_blocks_;
  size_t layers_per_block_;
  size_t num_kv_heads_;
  int32_t head_dim_;
  int32_t block_size_tokens_;
  size_t row_bytes_;
  uint64_t bytes_per_block_;
  AlignedBuffer data_;
};

// Per-forward scratch, grown to the largest batch seen and then reused.
struct Workspace {
  std::vector<float> hidden;        // [tokens, hidden] the residual stream
  std::vector<float> normed;        // [tokens, hidden]
  std::vector<float> q, k, v;       // [tokens, q_size | kv_size]
  std::vector<float> attention;     // [tokens, q_size]
  std::vector<float> layer_out;     // [tokens, hidden] an attention or MLP output normed before the residual add
  std::vector<float> gate, up;      // [tokens, intermediate]
  std::vector<std::vector<float>> rope_cos, rope_sin;  // [rope tables][tokens, rotary_dim / 2]
  std::vector<int32_t> token_seqs;  // [tokens] the sequence owning each token
  OutputRows outputs;               // the LM head's rows and where each sequence's samples go
  std::vector<float> output_hidden; // [output or prompt rows, hidden]
  std::vector<float> output_logits; // [output or prompt rows, vocab]
  MatmulScratch packed;             // a matmul's activations as its kernel reads them
  std::vector<float> partials;      // [kReductionSegments][tokens, hidden] a row-parallel matmul's segments
  std::vector<float> rank_logits;   // [rows, ceil(vocab / tp)] this rank's vocabulary, then every rank's
  SegmentScratch segments;
  std::vector<std::vector<float>> scores;  // [threads][heads per kv head][scores_stride] attention scores
  size_t scores_stride = 0;                // the context one head's scores hold
  std::vector<std::vector<float>> softmax_sums;  // [threads][heads per kv head]
  std::vector<std::vector<uint16_t>> query_bf16;  // [threads][4 x head_dim] (kBf16Pairs): two heads' halves
  std::vector<std::vector<uint16_t>> probs_bf16;  // [threads][2 x context] (kBf16Pairs)
  std::vector<std::vector<const uint16_t*>> key_groups, value_groups;  // [threads][context / 16]
  std::vector<int64_t> prefetched_history;  // [threads] the (sequence, kv head) a thread last fetched this layer (kBf16Pairs)
  std::vector<SamplerScratch> samplers;  // [threads]
  MoeScratch moe;
};

// This rank's place in a tensor-parallel group (size 1: the whole model). A rank holds heads,
// KV heads (or a copy of one) and MLP columns [rank, rank + 1) / size of the model's, whole
// row-parallel segments, the experts [rank, rank + 1) / size of each MoE layer, and the
// vocabulary rows [vocab_begin, vocab_end) of the LM head.
struct TensorParallel {
  int32_t rank = 0;
  int32_t size = 1;
  std::unique_ptr<Communicator> comm;  // null at size 1
  int32_t vocab_begin = 0;
  int32_t vocab_end = 0;
  std::vector<int32_t> batch_message;  // rank 0: the step's batch as it was broadcast, reused
  ExpertShard experts{};               // MoE layers: this rank holds whole experts (moe_parallel.h)

  int32_t first_segment() const { return rank * kReductionSegments / size; }
  int32_t end_segment() const { return (rank + 1) * kReductionSegments / size; }
  int32_t vocab_of(int32_t r, int32_t vocab_size) const { return int32_t(int64_t(vocab_size) * r / size); }
};

struct Model {
  Model(const cd_model_spec& spec, const cd_load_options& options, const KernelTable& kernels,
        std::unique_ptr<Communicator> comm);

  void forward(const cd_batch& batch, cd_forward_output& output);
  // Rank > 0: runs the passes rank 0 broadcasts until it stops the group.
  void serve_rank();

  TensorParallel tp;
  int32_t numa_node = -1;  // where this rank's threads run; -1: not pinned
  Dimensions dims;  // this rank's share: heads, KV heads and intermediate size divided by tp.size
  Numerics numerics;
  std::vector<RopeTable> ropes;
  int32_t num_kv_groups;
  const KernelTable& kernels;
  ThreadPool pool;
  WeightStore weights;
  Embedding embed_tokens;
  Matrix lm_head;
  const float* final_norm;
  std::vector<Layer> layers;
  KvCache kv_cache;
  Workspace workspace;
};

}  // namespace conduit

struct cd_model {
  std::unique_ptr<conduit::Model> model;  // null on a device
  // CD_DEVICE_CUDA: the plugin's model, whose passes a one-thread pool of its own drives.
  const struct cdc_plugin* plugin = nullptr;
  void* device_model = nullptr;
  std::unique_ptr<conduit::ThreadPool> device_driver;
  uint64_t device_kv_bytes_per_block = 0;
  // The pass in flight: what cd_model_forward handed over, read by the driver thread's task.
  const cd_batch* batch = nullptr;
  cd_forward_output* output = nullptr;
  cd_forward_done done = nullptr;
  void* user_data = nullptr;
  // A rank of an MPI group ends its part of the job at free (conduit::end_mpi_job) when the group
  // ended in order: rank 0's stop sent, or on rank r > 0 received (serve_rank returned).
  bool over_mpi = false;
  int32_t tp_connect_timeout_ms = 0;
  bool served_to_stop = false;
};
