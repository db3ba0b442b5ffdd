#include "moe_parallel.h"

#include <algorithm>
#include <cstring>

namespace conduit {

void keep_held_experts(const ExpertShard& shard, int32_t num_experts, std::vector<int32_t>& active_experts) {
  const int32_t first = first_expert_of(shard.comm->rank(), shard.comm->size(), num_experts);
  const int32_t end = first_expert_of(shard.comm->rank() + 1, shard.comm->size(), num_experts);
  active_experts.erase(std::remove_if(active_experts.begin(), active_experts.end(),
                                      [&](int32_t e) { return e < first || e >= end; }),
                       active_experts.end());
}

void gather_expert_outputs(ExpertShard& shard, const std::vector<int32_t>& expert_starts, int32_t num_experts,
                           int32_t hidden_size, float* out) {
  const int32_t rank = shard.comm->rank(), size = shard.comm->size();
  // Rank r's rows: [run_begin(r), run_begin(r + 1)), the same on every rank.
  const auto run_begin = [&](int32_t r) { return expert_starts[size_t(first_expert_of(r, size, num_experts))]; };
  int32_t widest = 0;
  for (int32_t r = 0; r < size; ++r) widest = std::max(widest, run_begin(r + 1) - run_begin(r));
  const size_t run_floats = size_t(widest) * size_t(hidden_size);
  if (shard.gathered.size() < run_floats * size_t(size)) shard.gathered.resize(run_floats * size_t(size));
  float* mine = shard.gathered.data() + run_floats * size_t(rank);
  std::memcpy(mine, out + size_t(run_begin(rank)) * size_t(hidden_size),
              size_t(run_begin(rank + 1) - run_begin(rank)) * size_t(hidden_size) * sizeof(float));
  shard.comm->all_gather(mine, run_floats * sizeof(float), shard.gathered.data());
  for (int32_t r = 0; r < size; ++r) {
    if (r == rank) continue;
    std::memcpy(out + size_t(run_begin(r)) * size_t(hidden_size), shard.gathered.data() + run_floats * size_t(r),
                size_t(run_begin(r + 1) - run_begin(r)) * size_t(hidden_size) * sizeof(float));
  }
}

}  // namespace conduit
