// Expert parallelism: a tensor-parallel group splits a MoE layer by whole experts. Rank r of size
// holds experts [E * r / size, E * (r + 1) / size) and runs them over the rows routed to them;
// the router (tiny, replicated) gives every rank the same choices and the same grouping of rows
// by expert, so the rows of a rank's experts are one contiguous run of the grouped buffers. One
// all-gather of those runs gives every rank every expert's output rows, computed by the same
// chains as at TP = 1, and each rank then combines a token's experts in its own slot order as
// TP = 1 does: bitwise the same outputs at every TP size.
#pragma once

#include <cstdint>
#include <vector>

#include "comm.h"

namespace conduit {

struct ExpertShard {
  Communicator* comm;
  std::vector<float> gathered;  // [ranks][widest run, hidden] the all-gather's buffer, reused
};

inline int32_t first_expert_of(int32_t rank, int32_t size, int32_t num_experts) {
  return int32_t(int64_t(num_experts) * rank / size);
}

// Drops from active_experts (ascending) the experts this rank does not hold.
void keep_held_experts(const ExpertShard& shard, int32_t num_experts, std::vector<int32_t>& active_experts);

// out[expert_starts[e] .. expert_starts[e + 1]) for every expert e, from the rank holding it;
// this rank's own experts' rows are already there.
void gather_expert_outputs(ExpertShard& shard, const std::vector<int32_t>& expert_starts, int32_t num_experts,
                           int32_t hidden_size, float* out);

}  // namespace conduit
