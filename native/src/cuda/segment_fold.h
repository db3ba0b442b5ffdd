// The fold of a row-parallel matmul's eight segment partials in src/row_parallel.cc
// combine_segments' fixed tree, and where a packed segment slot reads its inputs: one header for
// the GPU's kernels and their host test, so the device adds in the order the CPU does (tp_plan.cc
// checks the segment count).
#pragma once

#include <cstddef>
#include <cstdint>

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

// Column j of a rank's packed segment slots (SegmentInputs, tp_plan.h): the rank's local input
// column it copies, or -1 where it is the slot's zero padding. bounds: the whole matrix's segment
// bounds [9]; the rank holds segments from first, each in a slot of slot columns.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline int32_t packed_source_column(const int32_t* bounds, int32_t first, int32_t slot, int32_t j) {
  const int32_t segment = first + j / slot;
  const int32_t i = j % slot;
  return i < bounds[segment + 1] - bounds[segment] ? bounds[segment] - bounds[first] + i : -1;
}

}  // namespace cuda
}  // namespace conduit
