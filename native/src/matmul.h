// The parallel matmul of the forward pass: activation rows packed for the kernel, then output
// columns split over the pool's threads in tiles. Shared with the benchmark probes so they time
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

// Packed activations: one shared copy for many rows, or a private copy per thread for a few.
struct MatmulScratch {
  std::vector<uint8_t> shared;
  std::vector<std::vector<uint8_t>> per_thread;
};

// y_j = x · W_j^T for each job, all sharing x and so one weight format.
void parallel_matmuls(ThreadPool& pool, const KernelTable& kernels, const float* x, int32_t num_rows,
                      int32_t k, std::initializer_list<MatmulJob> jobs, MatmulScratch& scratch);

}  // namespace conduit
