// Block reductions in one fixed order: each thread's strided partial in index order, a warp's
// lanes by a butterfly of shuffles, the warps' sums in warp order by lane 0 of warp 0. The same
// order for every row and every launch size.
#pragma once

#include <cuda_runtime.h>

namespace conduit {
namespace cuda {

__device__ __forceinline__ float warp_sum(float value) {
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

__device__ __forceinline__ double warp_sum(double value) {
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

__device__ __forceinline__ float warp_max(float value) {
  for (int offset = 16; offset > 0; offset >>= 1) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// The block's sum, returned to every thread. shared: blockDim.x / 32 elements.
template <typename T>
__device__ __forceinline__ T block_sum(T value, T* shared) {
  value = warp_sum(value);
  const int warp = threadIdx.x / 32;
  if ((threadIdx.x & 31) == 0) shared[warp] = value;
  __syncthreads();
  if (threadIdx.x == 0) {
    T total = shared[0];
    for (int w = 1; w < int(blockDim.x / 32); ++w) total += shared[w];
    shared[0] = total;
  }
  __syncthreads();
  const T total = shared[0];
  __syncthreads();
  return total;
}

__device__ __forceinline__ float block_max(float value, float* shared) {
  value = warp_max(value);
  const int warp = threadIdx.x / 32;
  if ((threadIdx.x & 31) == 0) shared[warp] = value;
  __syncthreads();
  if (threadIdx.x == 0) {
    float best = shared[0];
    for (int w = 1; w < int(blockDim.x / 32); ++w) best = fmaxf(best, shared[w]);
    shared[0] = best;
  }
  __syncthreads();
  const float best = shared[0];
  __syncthreads();
  return best;
}

}  // namespace cuda
}  // namespace conduit
