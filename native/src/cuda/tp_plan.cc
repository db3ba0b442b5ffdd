#include "cuda/tp_plan.h"

#include <algorithm>
#include <string>

#include "error.h"
#include "moe_parallel.h"

namespace conduit {
namespace cuda {

SegmentBounds segment_bounds(int32_t k) {
  SegmentBounds bounds{};
  for (int32_t s = 0; s <= kReductionSegments; ++s) bounds[size_t(s)] = segment_begin(k, s);
  return bounds;
}

namespace {

[[noreturn]] void refuse(const std::string& what) {
  throw Error(CD_ERR_INVALID_ARGUMENT, "device cuda, tensor parallelism: " + what);
}

}  // namespace

RankShard plan_rank(const cd_model_spec& spec, int32_t rank, int32_t size) {
  if (size != 1 && size != 2 && size != 4 && size != 8) refuse("size " + std::to_string(size) + " is not 1, 2, 4 or 8");
  if (rank < 0 || rank >= size) refuse("rank " + std::to_string(rank) + " is outside a group of " + std::to_string(size));
  const auto divides = [&](const char* field, int32_t value) {
    if (value % size != 0) refuse("size " + std::to_string(size) + " does not divide " + field + " (" + std::to_string(value) + ")");
  };
  divides("num_attention_heads", spec.num_heads);
  divides("intermediate_size", spec.intermediate_size);
  if (spec.num_kv_heads % size != 0 && size % spec.num_kv_heads != 0) {
    refuse("size " + std::to_string(size) + " neither divides nor is a multiple of num_key_value_heads (" +
           std::to_string(spec.num_kv_heads) + ")");
  }
  RankShard shard;
  shard.rank = rank;
  shard.size = size;
  shard.num_heads = spec.num_heads / size;
  shard.head_begin = rank * shard.num_heads;
  if (spec.num_kv_heads >= size) {
    shard.num_kv_heads = spec.num_kv_heads / size;
    shard.kv_head_begin = rank * shard.num_kv_heads;
  } else {
    shard.num_kv_heads = 1;
    shard.kv_head_begin = rank / (size / spec.num_kv_heads);
  }
  shard.intermediate_size = spec.intermediate_size / size;
  shard.intermediate_begin = rank * shard.intermediate_size;
  shard.first_segment = rank * kReductionSegments / size;
  shard.end_segment = (rank + 1) * kReductionSegments / size;
  shard.vocab_begin = int32_t(int64_t(spec.vocab_size) * rank / size);
  shard.vocab_end = int32_t(int64_t(spec.vocab_size) * (rank + 1) / size);
  return shard;
}

ExpertRange held_experts(int32_t rank, int32_t size, int32_t num_experts) {
  return ExpertRange{first_expert_of(rank, size, num_experts), first_expert_of(rank + 1, size, num_experts)};
}

std::vector<int32_t> expert_owners(int32_t size, int32_t num_experts) {
  std::vector<int32_t> owners(size_t(num_experts), 0);
  for (int32_t rank = 0; rank < size; ++rank) {
    const ExpertRange held = held_experts(rank, size, num_experts);
    for (int32_t e = held.begin; e < held.end; ++e) owners[size_t(e)] = rank;
  }
  return owners;
}

PartialsLayout partials_layout(int32_t size, int32_t num_rows, int32_t n) {
  PartialsLayout layout;
  layout.segment_floats = size_t(num_rows) * size_t(n);
  layout.segments_per_rank = kReductionSegments / size;
  return layout;
}

std::vector<GatherCopy> gather_copies(int32_t size, size_t rank_bytes, bool in_place) {
  std::vector<GatherCopy> copies;
  for (int32_t dst = 0; dst < size; ++dst) {
    for (int32_t src = 0; src < size; ++src) {
      if (in_place && src == dst) continue;
      copies.push_back(GatherCopy{dst, src, size_t(src) * rank_bytes});
    }
  }
  return copies;
}

static_assert(kReductionSegments == 8, "fold_segments (segment_fold.h) folds eight segments");

SegmentInputs segment_inputs(const SegmentBounds& bounds, int32_t k_step) {
  SegmentInputs inputs;
  for (int32_t s = 0; s < kReductionSegments; ++s) {
    const int32_t begin = bounds[size_t(s)];
    const int32_t width = bounds[size_t(s) + 1] - begin;
    if (begin % k_step != 0 || width % k_step != 0) inputs.packed = true;
    inputs.slot_columns = std::max(inputs.slot_columns, (width + k_step - 1) / k_step * k_step);
  }
  if (!inputs.packed) inputs.slot_columns = 0;
  return inputs;
}

std::vector<TpOp> tp_schedule(const std::vector<int32_t>& layer_experts, int32_t size, int32_t num_slabs) {
  const int32_t num_layers = int32_t(layer_experts.size());
  std::vector<TpOp> ops;
  const auto every_rank = [&](TpOpKind kind, int32_t layer, int32_t slab) {
    for (int32_t rank = 0; rank < size; ++rank) ops.push_back(TpOp{kind, rank, layer, slab});
  };
  const auto reduction = [&](TpOpKind segments, TpOpKind gather, TpOpKind fold, int32_t layer) {
    for (int32_t slab = 0; slab < num_slabs; ++slab) {
      every_rank(segments, layer, slab);
      ops.push_back(TpOp{gather, -1, layer, slab});
      every_rank(fold, layer, slab);
    }
  };
  every_rank(TpOpKind::kEmbed, -1, -1);
  for (int32_t layer = 0; layer < num_layers; ++layer) {
    every_rank(TpOpKind::kAttention, layer, -1);
    reduction(TpOpKind::kAttentionSegments, TpOpKind::kGatherAttentionPartials, TpOpKind::kFoldAttention, layer);
    every_rank(TpOpKind::kMlp, layer, -1);
    if (layer_experts[size_t(layer)] > 0) {
      ops.push_back(TpOp{TpOpKind::kGatherExpertOutputs, -1, layer, -1});
      every_rank(TpOpKind::kCombineExperts, layer, -1);
      continue;
    }
    reduction(TpOpKind::kMlpSegments, TpOpKind::kGatherMlpPartials, TpOpKind::kFoldMlp, layer);
  }
  every_rank(TpOpKind::kLogitsSlice, -1, -1);
  ops.push_back(TpOp{TpOpKind::kGatherLogits, -1, -1, -1});
  return ops;
}

}  // namespace cuda
}  // namespace conduit
