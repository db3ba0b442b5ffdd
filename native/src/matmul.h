// The parallel matmul of the forward pass: activation rows packed for the kernel, then output
// panels claimed by the pool's threads. Shared with the benchmark probes so they time
// exactly what a forward pass runs.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "kernels.h"
#include "thread_pool.h"

namespace conduit {

struct MatmulJob {
  Matrix weight;
  int32_t num_columns;
  float* y;  // [rows, num_columns]
  bool accumulate = false;  // y += x · W^T (the residual add, fused)
};

// A matmul's input rows: x itself, or rows that prepare() computes from other data (the RMS norm
// of the residual stream, SwiGLU of gate and up). prepare runs inside the matmul's parallel_for
// on every thread for a batch of one or two rows, so decode pays no hand-off for it; otherwise it
// fills x (which may be one of its own inputs: it goes row by row, element by element) first.
struct MatmulInput {
  float* x;  // [rows, k]
  void (*prepare)(const void* context, int32_t row, float* out) = nullptr;
  const void* context = nullptr;
};

// Packed activations: one shared copy for many rows, or a private copy per thread for a few.
struct MatmulScratch {
  std::vector<uint8_t> shared;
  std::vector<std::vector<uint8_t>> per_thread;
  std::vector<std::vector<float>> prepared_per_thread;
  std::vector<std::vector<uint8_t>> panel_per_thread;  // panels the kernel converts before use
  std::vector<Activations> activations_per_thread;  // what each thread's chunks read
};

// y_j = input · W_j^T for each job, all sharing the input (of any weight formats).
void parallel_matmuls(ThreadPool& pool, const KernelTable& kernels, const MatmulInput& input,
                      int32_t num_rows, int32_t k, std::initializer_list<MatmulJob> jobs,
                      MatmulScratch& scratch);

}  // namespace conduit
