// Which part of a model each rank of a tensor-parallel group holds on the GPU: the same split as
// the CPU runtime's (src/model.cc shard_of, src/model.h TensorParallel), so a GPU group and a CPU
// group cut a checkpoint alike. Column-parallel matrices (q/k/v, gate/up) keep a rank's rows;
// row-parallel ones (o_proj, down_proj) keep whole segments of issue 40's fixed reduction tree
// (src/row_parallel.h), and the LM head keeps a slice of the vocabulary. Host code, tested on CPU.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "conduit.h"
#include "row_parallel.h"
#include "cuda/segment_fold.h"

namespace conduit {
namespace cuda {

// Inputs [k_begin[s], k_begin[s + 1]) of a row-parallel matrix of k inputs form segment s.
using SegmentBounds = std::array<int32_t, kReductionSegments + 1>;
SegmentBounds segment_bounds(int32_t k);

struct RankShard {
  int32_t rank = 0;
  int32_t size = 1;
  // Query heads [head_begin, head_begin + num_heads); KV heads likewise (with fewer KV heads than
  // ranks, each rank holds a copy of the one its query heads read, as vLLM does).
  int32_t head_begin = 0;
  int32_t num_heads = 0;
  int32_t kv_head_begin = 0;
  int32_t num_kv_heads = 0;
  // MLP columns [intermediate_begin, intermediate_begin + intermediate_size).
  int32_t intermediate_begin = 0;
  int32_t intermediate_size = 0;
  // Row-parallel segments [first_segment, end_segment) of the reduction tree.
  int32_t first_segment = 0;
  int32_t end_segment = kReductionSegments;
  // LM head rows [vocab_begin, vocab_end).
  int32_t vocab_begin = 0;
  int32_t vocab_end = 0;
};

// Throws Error(CD_ERR_INVALID_ARGUMENT) naming the field when the model does not split over size
// ranks (size 1, 2, 4 or 8 dividing the heads and the MLP columns, and dividing or a multiple of
// the KV heads). A MoE layer is split by whole experts (held_experts), as the CPU splits it. A rank's
// heads and MLP columns are then whole segments [first_segment, end_segment) of o_proj's and
// down_proj's inputs, since size divides kReductionSegments.
RankShard plan_rank(const cd_model_spec& spec, int32_t rank, int32_t size);

// Expert parallelism (src/moe_parallel.h, the CPU's split): rank r holds experts [begin, end) of a
// MoE layer of num_experts, and owner[e] is the rank holding expert e. Every rank routes and groups
// alike, so each writes its experts' grouped rows at their places in its slot of the gathered
// expert outputs ([size][slots][hidden]); one all-gather, then every rank takes row i from
// owner[row_experts[i]]'s slot and combines a token's experts in its own slot order as TP = 1.
struct ExpertRange {
  int32_t begin = 0;
  int32_t end = 0;
};
ExpertRange held_experts(int32_t rank, int32_t size, int32_t num_experts);
std::vector<int32_t> expert_owners(int32_t size, int32_t num_experts);

// The partials of a row-parallel matmul over num_rows rows and n outputs, as the group gathers
// them: fp32 [kReductionSegments][num_rows][n], rank r's segments contiguous, so one all-gather of
// segments_per_rank * segment_floats floats per rank assembles every segment on every rank.
struct PartialsLayout {
  size_t segment_floats = 0;      // num_rows * n
  int32_t segments_per_rank = 0;  // kReductionSegments / size
  size_t rank_offset_floats(int32_t rank) const { return size_t(rank) * size_t(segments_per_rank) * segment_floats; }
  size_t rank_bytes() const { return size_t(segments_per_rank) * segment_floats * sizeof(float); }
  size_t total_floats() const { return size_t(kReductionSegments) * segment_floats; }
};
PartialsLayout partials_layout(int32_t size, int32_t num_rows, int32_t n);

// One copy of an all-gather made of copies (the in-process group, src/cuda/device_group.cc):
// rank src_rank's own bytes into rank dst_rank's gather buffer at src_rank's place.
struct GatherCopy {
  int32_t dst_rank = 0;
  int32_t src_rank = 0;
  size_t dst_offset_bytes = 0;
};
// Every copy an all-gather over size ranks of rank_bytes each takes, in the order they are issued
// (by destination rank, then source rank). in_place: each rank's own bytes already lie at its
// place in its gather buffer, so a rank copies only the others'.
std::vector<GatherCopy> gather_copies(int32_t size, size_t rank_bytes, bool in_place);

// How a rank's segment GEMMs read their inputs. The GEMM reads whole k steps of k_step inputs, so
// a segment whose bounds are not all on k steps would read past its end into its neighbour's
// inputs (and 0 * x is not 0 when x is Inf or NaN; on another rank there is no neighbour). Then
// every segment's inputs are first copied to a zero-padded slot of slot_columns of their own.
// The choice depends on the whole matrix's k alone, so every tensor-parallel size makes it alike.
struct SegmentInputs {
  bool packed = false;
  int32_t slot_columns = 0;  // packed: each segment's slot, a multiple of k_step
};
SegmentInputs segment_inputs(const SegmentBounds& bounds, int32_t k_step);

// One step of a tensor-parallel forward pass as the group driver (src/cuda/backend.cu) enqueues
// it: a rank's work on its own stream, or a collective over every rank (rank -1). Per layer:
// attention up to its output, then for each slab of rows o_proj's segments, the all-gather of
// their partials and every rank's fold into its residual; then the MLP's likewise; after the last
// layer every rank's slice of the LM head and the gather of the logits. A MoE layer's MLP (kMlp:
// routing and the rank's experts) has no segments: the gather of the expert outputs, then every
// rank's combine.
enum class TpOpKind : uint8_t {
  kEmbed,
  kAttention,
  kAttentionSegments,
  kMlp,
  kMlpSegments,
  kGatherAttentionPartials,
  kGatherMlpPartials,
  kFoldAttention,
  kFoldMlp,
  kLogitsSlice,
  kGatherLogits,
  kGatherExpertOutputs,
  kCombineExperts,
};
struct TpOp {
  TpOpKind kind;
  int32_t rank;   // -1: every rank (a collective)
  int32_t layer;  // -1: none
  int32_t slab;   // -1: none
};
// The pass over layers (layer_experts[i]: layer i's num_experts, 0 for a dense MLP) and num_slabs
// slabs of rows per row-parallel matmul. Within a phase every rank's work is enqueued before the
// collective that needs it, and the collective before any rank's work that reads its result.
std::vector<TpOp> tp_schedule(const std::vector<int32_t>& layer_experts, int32_t size, int32_t num_slabs);

}  // namespace cuda
}  // namespace conduit
