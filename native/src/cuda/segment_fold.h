// The fold of a row-parallel matmul's eight segment partials, in src/row_parallel.cc
// combine_segments' fixed tree: one header for the GPU's fold kernel and its host test, so the
// device adds in the order the CPU does (tp_plan.cc checks the segment count).
#pragma once

#include <cstddef>

namespace conduit {
namespace cuda {

// Element e of partials [8][partial_size]: ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)).
#if defined(__CUDACC__)
__host__ __device__
#endif
inline float fold_segments(const float* e, size_t partial_size) {
  return ((e[0] + e[partial_size]) + (e[2 * partial_size] + e[3 * partial_size])) +
         ((e[4 * partial_size] + e[5 * partial_size]) + (e[6 * partial_size] + e[7 * partial_size]));
}

}  // namespace cuda
}  // namespace conduit
