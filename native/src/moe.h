// A mixture-of-experts MLP over one step's tokens: the router picks each token's experts, the
// tokens are grouped by expert, and each expert's matrices run once over all of its tokens (a
// grouped matmul: every expert's weights are read once per step, whatever the batch).
//
// Batch invariance holds as for the dense MLP: a token's routing reads only its own router
// logits; every matmul output is one chain over the inputs whatever rows share the expert's
// matmul (kernels.h); and the token's expert outputs are combined in its own slot order (the
// router's ranking), in one fixed chain per element, by one thread, with no atomics. Which other
// tokens chose the same experts changes nothing but how many rows pass each panel.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels.h"
#include "moe_parallel.h"
#include "thread_pool.h"

namespace conduit {

struct Layer;
struct Dimensions;
struct Numerics;

// Per-step buffers, grown to the largest step seen and reused.
struct MoeScratch {
  std::vector<float> router_logits;      // [tokens, experts]
  std::vector<int32_t> slot_experts;     // [tokens, top_k] the router's choices, best first
  std::vector<float> slot_weights;       // [tokens, top_k]
  std::vector<int32_t> slot_rows;        // [tokens, top_k] each choice's row in the grouped buffers
  std::vector<const float*> slot_outputs;  // [tokens, top_k] each choice's expert output row
  std::vector<const float*> slot_biases;   // [tokens, top_k] its expert's down bias, or null
  std::vector<int32_t> expert_starts;    // [experts + 1] first grouped row of each expert
  std::vector<int32_t> expert_cursors;   // [experts]
  std::vector<int32_t> active_experts;   // experts with rows this step, ascending
  std::vector<float> rows;               // [assignments, hidden] each row's token, normed (when the kernel reads fp32 rows)
  std::vector<float> gate_up;            // [assignments, 2 × moe_intermediate padded to panels] gate's and up's tiles in pairs
  std::vector<float> gate;               // [assignments, moe_intermediate] the gated activation
  std::vector<float> out;                // [assignments, hidden] each expert's output for the row
  std::vector<uint8_t> packed;           // rows as the kernel reads them (bf16, int16 blocks)
  std::vector<uint8_t> packed_up;        // the same rows for an up of another format than gate
  std::vector<uint8_t> packed_down;      // the activated rows as down reads them
  std::vector<int32_t> expert_order;     // active experts, most rows first
  std::vector<std::vector<uint8_t>> panel_per_thread;
};

// hidden[t] += the MoE output for the normed rows normed[t] (hidden_size wide), t < num_tokens.
// shard: this rank's experts in a tensor-parallel group (moe_parallel.h), or null (all of them).
void run_moe(ThreadPool& pool, const KernelTable& kernels, const Layer& layer, const Dimensions& dims,
             const Numerics& numerics, const float* normed, int32_t num_tokens, float* hidden, MoeScratch& scratch,
             ExpertShard* shard);

}  // namespace conduit
