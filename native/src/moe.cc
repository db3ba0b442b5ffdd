#include "moe.h"

#include <algorithm>
#include <cmath>

#include "model.h"

namespace conduit {

namespace {

template <typename T>
void grow(std::vector<T>& buffer, size_t size) {
  if (buffer.size() < size) buffer.resize(size);
}

// Experts are tasks of their own (run_whole_experts) when there are at least this many per
// thread: then the last task's wait is a small part of a thread's share. Fewer (a small batch)
// are split into tiles so that every thread has work.
constexpr int32_t kWholeExpertsPerThread = 8;
// Experts of equal rows (a batch-1 step's) are equal tasks, which the threads' claims balance
// with as few as this many per thread. Whole, each expert is one stream (int8 at hidden 1024:
// one 0.8 MB and one 0.4 MB run instead of 22 tile tasks of 26-136 KB, each started cold) and a
// layer drops two hand-offs (the pack pass, gate_up -> down). Batch-1 A/B, loaded machine, four
// runs: CPU 0.2-3.5 % lower (medians), 0.5-3.0 % (geometric means).
constexpr int32_t kWholeEqualExpertsPerThread = 2;

// The router's rows go to threads in blocks of this many: the widest row tile of the panel
// kernels (kPanelTileRows of kernels_avx512/avx2), so a block passes the router's panels once
// per tile. A batch of at most this many tokens (decode of a few sequences) routes on the caller
// alone, with no hand-off; a batch-32 step's router splits between the threads instead of one
// thread computing all of its 32 rows while the others wait.
constexpr int32_t kRouterRowsPerTask = 6;

bool rows_all_equal(const MoeScratch& scratch) {
  const auto rows_of = [&](int32_t e) { return scratch.expert_starts[size_t(e) + 1] - scratch.expert_starts[size_t(e)]; };
  for (const int32_t e : scratch.active_experts) {
    if (rows_of(e) != rows_of(scratch.active_experts[0])) return false;
  }
  return true;
}

int32_t num_tiles(int32_t num_columns) { return (num_columns + kPanelColumns - 1) / kPanelColumns; }

// A token's experts, best first (ties to the lower expert; softmax keeps the order of the
// logits, so the top k of either are the same), and their weights: a softmax over every expert
// restricted to the top k and renormalized when asked (Mixtral, Qwen3-MoE), or a softmax over the
// top k logits (gpt-oss). In double, from this token's logits alone. One pass over the experts
// keeps the k best so far in order: an expert enters only above the k-th (so a tie stays behind
// the lower expert), which most experts are not (a batch-32 step's routing took half the CPU
// time of the k passes with a search of the chosen ones in each).
void route(const float* logits, int32_t num_experts, int32_t top_k, cd_routing routing, bool norm_topk_prob,
           int32_t* experts, float* weights) {
  int32_t num_kept = 0;
  for (int32_t e = 0; e < num_experts; ++e) {
    const float logit = logits[e];
    if (num_kept == top_k && !(logit > logits[experts[top_k - 1]])) continue;
    int32_t place = num_kept < top_k ? num_kept++ : top_k - 1;
    for (; place > 0 && logit > logits[experts[place - 1]]; --place) experts[place] = experts[place - 1];
    experts[place] = e;
  }
  double max = logits[experts[0]];
  double denominator = 0.0;
  if (routing == CD_ROUTING_SOFTMAX_TOPK && !norm_topk_prob) {
    for (int32_t e = 0; e < num_experts; ++e) max = std::max(max, double(logits[e]));
    for (int32_t e = 0; e < num_experts; ++e) denominator += std::exp(double(logits[e]) - max);
  } else {
    for (int32_t k = 0; k < top_k; ++k) denominator += std::exp(double(logits[experts[k]]) - max);
  }
  for (int32_t k = 0; k < top_k; ++k) weights[k] = float(std::exp(double(logits[experts[k]]) - max) / denominator);
}

// One grouped matmul's operands: gate and up (with the gated activation) or down. Each matrix is
// read once per step whatever its rows. Gate and up: a 64-column tile computes its tile of both
// into one tile pair of y (gate's columns, then up's: with the expert's gate_up interleaved, one
// matmul over one run of weights), then applies the gated activation to the tile (elementwise, so
// a tile gives the bits the whole row would) into activated. Down: the tile into y.
struct GroupedMatmul {
  const Layer& layer;
  const MoeScratch& scratch;
  MatrixFormat format;
  int32_t k;
  const float* x;         // [assignments, k]
  const uint8_t* packed;  // x's rows packed for format, packed_stride apart (null when the kernel reads x)
  size_t packed_stride;
  int32_t num_columns;  // of each matrix
  float* y;             // down: [assignments, num_columns]; gate and up: [assignments, 2 × padded num_columns]
  size_t y_stride;
  float* activated;            // gate and up: [assignments, num_columns]; down: nullptr
  const Numerics* activation;  // gate and up: the activation's numerics; down: nullptr
  MatrixFormat up_format;      // up stored apart in another format: the rows it reads packed for it
  const uint8_t* up_packed;
  size_t up_packed_stride;
};

// One expert's rows as its matmul reads them, worked out once per expert rather than per tile.
struct ExpertInput {
  const Expert* expert;
  int32_t first_row;
  int32_t num_rows;
  Activations activations;
  Activations up_activations;  // an up of another format than gate's
};

ExpertInput expert_input(const KernelTable& kernels, const GroupedMatmul& job, int32_t expert_index, uint8_t* panel_scratch) {
  const int32_t first_row = job.scratch.expert_starts[size_t(expert_index)];
  const int32_t num_rows = job.scratch.expert_starts[size_t(expert_index) + 1] - first_row;
  const float* x = job.x + size_t(first_row) * size_t(job.k);
  const auto rows_for = [&](MatrixFormat format, const uint8_t* packed, size_t stride) {
    return Activations{x, size_t(job.k), stride > 0 ? packed + size_t(first_row) * stride : nullptr, stride,
                       kernels.panel_scratch_bytes(format, job.k, num_rows) > 0 ? panel_scratch : nullptr};
  };
  const Activations activations = rows_for(job.format, job.packed, job.packed_stride);
  return ExpertInput{&job.layer.experts[size_t(expert_index)], first_row, num_rows, activations,
                     job.up_format == job.format ? activations : rows_for(job.up_format, job.up_packed, job.up_packed_stride)};
}

// The gated activation of one tile: gate and up are the tile's columns column_begin.. of a row.
void activate_tile(const KernelTable& kernels, const Numerics& numerics, const Expert& expert, float* gate, float* up,
                   int32_t column_begin, int32_t width, float* out) {
  if (expert.gate_bias != nullptr) {
    for (int32_t i = 0; i < width; ++i) gate[i] += expert.gate_bias[column_begin + i];
  }
  if (expert.up_bias != nullptr) {
    for (int32_t i = 0; i < width; ++i) up[i] += expert.up_bias[column_begin + i];
  }
  switch (numerics.activation) {
    case CD_ACTIVATION_GELU_TANH: kernels.gelu_tanh_gate(gate, up, width, out); break;
    case CD_ACTIVATION_CLAMPED_SWIGLU: kernels.clamped_swiglu(gate, up, width, numerics.swiglu_alpha, numerics.swiglu_limit, out); break;
    default: kernels.swiglu(gate, up, width, out); break;
  }
}

// One 64-column tile of an expert's matmul.
void run_tile(const KernelTable& kernels, const GroupedMatmul& job, const ExpertInput& input, int32_t tile) {
  const Expert& expert = *input.expert;
  const int32_t column_begin = tile * kPanelColumns;
  const int32_t column_end = std::min(column_begin + kPanelColumns, job.num_columns);
  float* y = job.y + size_t(input.first_row) * job.y_stride;
  if (job.activation == nullptr) {
    kernels.matmul(input.activations, input.num_rows, job.k, expert.down_proj, column_begin, column_end, y, job.y_stride, false);
    return;
  }
  // Tile t's pair: gate's columns at 2 × 64 t, up's at 2 × 64 t + 64.
  if (expert.gate_up.data != nullptr) {
    kernels.matmul(input.activations, input.num_rows, job.k, expert.gate_up, 2 * column_begin, 2 * column_begin + 2 * kPanelColumns,
                   y, job.y_stride, false);
  } else {
    kernels.matmul(input.activations, input.num_rows, job.k, expert.gate_proj, column_begin, column_end, y + column_begin,
                   job.y_stride, false);
    kernels.matmul(input.up_activations, input.num_rows, job.k, expert.up_proj, column_begin, column_end,
                   y + column_begin + kPanelColumns, job.y_stride, false);
  }
  for (int32_t row = 0; row < input.num_rows; ++row) {
    float* gate = y + size_t(row) * job.y_stride + size_t(2 * column_begin);
    activate_tile(kernels, *job.activation, expert, gate, gate + kPanelColumns, column_begin, column_end - column_begin,
                  job.activated + size_t(input.first_row + row) * size_t(job.num_columns) + column_begin);
  }
}

// A grouped matmul split into (expert, tile) tasks, so a few experts (a small batch) still
// give every thread work.
void run_tiles(ThreadPool& pool, const KernelTable& kernels, const GroupedMatmul& job,
               std::vector<std::vector<uint8_t>>& panel_per_thread) {
  const std::vector<int32_t>& experts = job.scratch.active_experts;
  const int32_t tiles_per_expert = num_tiles(job.num_columns);
  pool.parallel_for(int32_t(experts.size()) * tiles_per_expert, 1, [&](int32_t thread_index, int32_t begin, int32_t end) {
    ExpertInput input{};
    for (int32_t task = begin; task < end; ++task) {
      if (task == begin || task % tiles_per_expert == 0) {
        uint8_t* panel_scratch = panel_per_thread.empty() ? nullptr : panel_per_thread[size_t(thread_index)].data();
        input = expert_input(kernels, job, experts[size_t(task / tiles_per_expert)], panel_scratch);
      }
      run_tile(kernels, job, input, task % tiles_per_expert);
    }
  });
}

// Both grouped matmuls with whole experts as tasks, largest first: a thread streams its own
// expert's gate_up then down front to back, packs the activated rows for down itself, and goes
// on to its next expert with no wait for the other threads in between (an expert's rows are
// its own). The results are the tile tasks' bits: the same chains over the same rows.
void run_whole_experts(ThreadPool& pool, const KernelTable& kernels, const GroupedMatmul& gate_up, const GroupedMatmul& down,
                       MoeScratch& scratch) {
  std::vector<int32_t>& order = scratch.expert_order;
  order.assign(scratch.active_experts.begin(), scratch.active_experts.end());
  const auto rows_of = [&](int32_t e) { return scratch.expert_starts[size_t(e) + 1] - scratch.expert_starts[size_t(e)]; };
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return rows_of(a) > rows_of(b); });
  pool.parallel_for(int32_t(order.size()), 1, [&](int32_t thread_index, int32_t begin, int32_t end) {
    uint8_t* panel_scratch = scratch.panel_per_thread.empty() ? nullptr : scratch.panel_per_thread[size_t(thread_index)].data();
    for (int32_t task = begin; task < end; ++task) {
      const int32_t expert_index = order[size_t(task)];
      const ExpertInput input = expert_input(kernels, gate_up, expert_index, panel_scratch);
      for (int32_t tile = 0; tile < num_tiles(gate_up.num_columns); ++tile) run_tile(kernels, gate_up, input, tile);
      if (down.packed_stride > 0) {
        kernels.pack_rows(down.x + size_t(input.first_row) * size_t(down.k), size_t(down.k), input.num_rows, down.k, down.format,
                          scratch.packed_down.data() + size_t(input.first_row) * down.packed_stride, down.packed_stride);
      }
      const ExpertInput down_input = expert_input(kernels, down, expert_index, panel_scratch);
      for (int32_t tile = 0; tile < num_tiles(down.num_columns); ++tile) run_tile(kernels, down, down_input, tile);
    }
  });
}

// Rows of x as the kernel reads them for this format, into packed; returns the stride.
size_t pack_rows(ThreadPool& pool, const KernelTable& kernels, MatrixFormat format, const float* x, int32_t num_rows,
                 int32_t k, std::vector<uint8_t>& packed) {
  const size_t stride = kernels.packed_row_bytes(format, k);
  if (stride == 0) return 0;
  pool.parallel_for(num_rows, 1, [&](int32_t, int32_t begin, int32_t end) {
    kernels.pack_rows(x + size_t(begin) * size_t(k), size_t(k), end - begin, k, format, packed.data() + size_t(begin) * stride, stride);
  });
  return stride;
}

void grow_panel_scratch(const KernelTable& kernels, MatrixFormat format, int32_t k, int32_t max_rows, int32_t num_threads,
                        MoeScratch& scratch) {
  const size_t bytes = kernels.panel_scratch_bytes(format, k, max_rows);
  if (bytes == 0) return;
  scratch.panel_per_thread.resize(size_t(num_threads));
  for (std::vector<uint8_t>& buffer : scratch.panel_per_thread) grow(buffer, bytes);
}

void add_bias(float* row, const float* bias, int32_t n) {
  if (bias == nullptr) return;
  for (int32_t i = 0; i < n; ++i) row[i] += bias[i];
}

}  // namespace

void run_moe(ThreadPool& pool, const KernelTable& kernels, const Layer& layer, const Dimensions& dims,
             const Numerics& numerics, const float* normed, int32_t num_tokens, float* hidden, MoeScratch& scratch,
             ExpertShard* shard) {
  const int32_t num_experts = int32_t(layer.experts.size());
  const int32_t top_k = dims.num_experts_per_token;
  const int32_t hidden_size = dims.hidden_size;
  const int32_t intermediate = dims.moe_intermediate_size;
  const int32_t num_slots = num_tokens * top_k;

  // Router logits and each token's choices, in one parallel call over blocks of tokens: a block's
  // rows of logits (fp32 weights and activations: a choice of experts is discontinuous, so the
  // logits are kept as exact as the residual stream allows), then their routing. Every logit is
  // one chain whatever rows share the matmul (kernels.h), so no bit depends on the blocks. The
  // router is fp32 panels (model.cc), which every kernel reads from x as stored (nothing packed,
  // no panel scratch).
  grow(scratch.router_logits, size_t(num_tokens) * size_t(num_experts));
  grow(scratch.slot_experts, size_t(num_slots));
  grow(scratch.slot_weights, size_t(num_slots));
  const int32_t num_router_blocks = (num_tokens + kRouterRowsPerTask - 1) / kRouterRowsPerTask;
  pool.parallel_for(num_router_blocks, 1, [&](int32_t, int32_t block_begin, int32_t block_end) {
    const int32_t begin = block_begin * kRouterRowsPerTask;
    const int32_t end = std::min(num_tokens, block_end * kRouterRowsPerTask);
    const Activations rows{normed + size_t(begin) * size_t(hidden_size), size_t(hidden_size), nullptr, 0, nullptr};
    kernels.matmul(rows, end - begin, hidden_size, layer.router, 0, num_experts,
                   &scratch.router_logits[size_t(begin) * size_t(num_experts)], size_t(num_experts), false);
    for (int32_t t = begin; t < end; ++t) {
      float* logits = &scratch.router_logits[size_t(t) * size_t(num_experts)];
      add_bias(logits, layer.router_bias, num_experts);
      route(logits, num_experts, top_k, numerics.routing, numerics.norm_topk_prob, &scratch.slot_experts[size_t(t) * top_k],
            &scratch.slot_weights[size_t(t) * top_k]);
    }
  });

  // Group the slots by expert (a counting sort: within an expert, tokens in batch order).
  scratch.expert_starts.assign(size_t(num_experts) + 1, 0);
  for (int32_t slot = 0; slot < num_slots; ++slot) ++scratch.expert_starts[size_t(scratch.slot_experts[size_t(slot)]) + 1];
  scratch.active_experts.clear();
  int32_t max_rows = 0;
  for (int32_t e = 0; e < num_experts; ++e) {
    const int32_t count = scratch.expert_starts[size_t(e) + 1];
    if (count > 0) scratch.active_experts.push_back(e);
    max_rows = std::max(max_rows, count);
    scratch.expert_starts[size_t(e) + 1] += scratch.expert_starts[size_t(e)];
  }
  if (shard != nullptr) keep_held_experts(*shard, num_experts, scratch.active_experts);
  scratch.expert_cursors.assign(scratch.expert_starts.begin(), scratch.expert_starts.end() - 1);
  grow(scratch.slot_rows, size_t(num_slots));
  for (int32_t slot = 0; slot < num_slots; ++slot) {
    scratch.slot_rows[size_t(slot)] = scratch.expert_cursors[size_t(scratch.slot_experts[size_t(slot)])]++;
  }
  // Each token's row into its slots' grouped rows: packed once and the bytes copied where the
  // kernel reads packed rows (they read nothing else), else the fp32 row copied.
  // Under expert parallelism this rank holds only its own experts' weights: their format is the layer's.
  const Expert& held =
      layer.experts[size_t(shard == nullptr ? 0 : first_expert_of(shard->comm->rank(), shard->comm->size(), num_experts))];
  const MatrixFormat format = (held.gate_up.data != nullptr ? held.gate_up : held.gate_proj).format;
  // A gate and up of two formats (a mixed quantization) read rows packed each for its own.
  const MatrixFormat up_format = held.gate_up.data != nullptr ? format : held.up_proj.format;
  const MatrixFormat down_format = held.down_proj.format;
  const size_t rows_stride = kernels.packed_row_bytes(format, hidden_size);
  const size_t up_rows_stride = up_format == format ? 0 : kernels.packed_row_bytes(up_format, hidden_size);
  const bool fp32_rows = rows_stride == 0 || (up_format != format && up_rows_stride == 0);
  grow(scratch.rows, size_t(num_slots) * size_t(hidden_size));
  if (rows_stride > 0) grow(scratch.packed, size_t(num_slots) * rows_stride);
  if (up_rows_stride > 0) grow(scratch.packed_up, size_t(num_slots) * up_rows_stride);
  const auto pack_slots = [&](const float* x, const int32_t* rows, MatrixFormat packed_format, size_t stride, std::vector<uint8_t>& packed) {
    uint8_t* first = packed.data() + size_t(rows[0]) * stride;
    kernels.pack_rows(x, size_t(hidden_size), 1, hidden_size, packed_format, first, stride);
    for (int32_t k = 1; k < top_k; ++k) std::copy_n(first, stride, packed.data() + size_t(rows[k]) * stride);
  };
  pool.parallel_for(num_tokens, 1, [&](int32_t, int32_t begin, int32_t end) {
    for (int32_t t = begin; t < end; ++t) {
      const float* x = normed + size_t(t) * size_t(hidden_size);
      const int32_t* rows = &scratch.slot_rows[size_t(t) * top_k];
      if (fp32_rows) {
        for (int32_t k = 0; k < top_k; ++k) std::copy_n(x, hidden_size, &scratch.rows[size_t(rows[k]) * size_t(hidden_size)]);
      }
      if (rows_stride > 0) pack_slots(x, rows, format, rows_stride, scratch.packed);
      if (up_rows_stride > 0) pack_slots(x, rows, up_format, up_rows_stride, scratch.packed_up);
    }
  });

  for (const MatrixFormat used : {format, up_format, down_format}) {
    grow_panel_scratch(kernels, used, std::max(hidden_size, intermediate), max_rows, pool.num_threads(), scratch);
  }
  const size_t pairs_stride = size_t(2 * num_tiles(intermediate) * kPanelColumns);
  grow(scratch.gate_up, size_t(num_slots) * pairs_stride);
  grow(scratch.gate, size_t(num_slots) * size_t(intermediate));
  grow(scratch.out, size_t(num_slots) * size_t(hidden_size));
  // down's own format: a mixed quantization stores it in another type than gate and up.
  const size_t gate_stride = kernels.packed_row_bytes(down_format, intermediate);
  grow(scratch.packed_down, size_t(num_slots) * gate_stride);
  const GroupedMatmul gate_up{layer, scratch, format, hidden_size, scratch.rows.data(), scratch.packed.data(), rows_stride,
                              intermediate, scratch.gate_up.data(), pairs_stride, scratch.gate.data(), &numerics, up_format,
                              scratch.packed_up.data(), up_rows_stride};
  const GroupedMatmul down{layer, scratch, down_format, intermediate, scratch.gate.data(), scratch.packed_down.data(), gate_stride,
                           hidden_size, scratch.out.data(), size_t(hidden_size), nullptr, nullptr, down_format, nullptr, 0};
  const int32_t num_active = int32_t(scratch.active_experts.size());
  if (num_active >= kWholeExpertsPerThread * pool.active_threads() ||
      (num_active >= kWholeEqualExpertsPerThread * pool.active_threads() && rows_all_equal(scratch))) {
    run_whole_experts(pool, kernels, gate_up, down, scratch);
  } else {
    run_tiles(pool, kernels, gate_up, scratch.panel_per_thread);
    pack_rows(pool, kernels, down_format, scratch.gate.data(), num_slots, intermediate, scratch.packed_down);
    run_tiles(pool, kernels, down, scratch.panel_per_thread);
  }
  if (shard != nullptr) gather_expert_outputs(*shard, scratch.expert_starts, num_experts, hidden_size, scratch.out.data());

  // Each token's experts in its own slot order, one chain per element: acc = w0 o0, then
  // acc + w_k o_k, added to the residual stream last (kernels.h: add_weighted_rows).
  grow(scratch.slot_outputs, size_t(num_slots));
  grow(scratch.slot_biases, size_t(num_slots));
  pool.parallel_for(num_tokens, 1, [&](int32_t, int32_t begin, int32_t end) {
    for (int32_t slot = begin * top_k; slot < end * top_k; ++slot) {
      scratch.slot_outputs[size_t(slot)] = &scratch.out[size_t(scratch.slot_rows[size_t(slot)]) * size_t(hidden_size)];
      scratch.slot_biases[size_t(slot)] = layer.experts[size_t(scratch.slot_experts[size_t(slot)])].down_bias;
    }
    for (int32_t t = begin; t < end; ++t) {
      const size_t first = size_t(t) * size_t(top_k);
      kernels.add_weighted_rows(&scratch.slot_outputs[first], &scratch.slot_biases[first], &scratch.slot_weights[first], top_k,
                                hidden_size, hidden + size_t(t) * size_t(hidden_size));
    }
  });
}

}  // namespace conduit
