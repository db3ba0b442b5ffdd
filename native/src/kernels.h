// The SIMD kernels, one table per instruction set. Each table lives in its own translation unit
// compiled with its own flags (kernels_avx512.cc, kernels_avx2.cc, kernels_scalar.cc); the model
// picks one at load.
//
// Batch invariance rests on these kernels: every dot product walks K in one fixed order (vector
// lanes over K in steps of the vector width, a fixed horizontal reduction, then a scalar tail),
// whatever the number of rows, the tile a row falls into, or the thread that computes it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "conduit.h"

namespace conduit {

struct KernelTable {
  cd_kernel kernel;
  // y[m * y_stride + n] = dot(x[m * x_stride .. + k], w[n * k .. + k]) for m in [0, num_rows) and
  // n in [n_begin, n_end). w is a row-major [N, k] matrix of dtype w_dtype.
  void (*matmul)(const float* x, size_t x_stride, int32_t num_rows, int32_t k, const void* w,
                 cd_dtype w_dtype, int32_t n_begin, int32_t n_end, float* y, size_t y_stride);
  // dot(a, b) over n elements; b is of dtype b_dtype. Same order as one matmul output.
  float (*dot)(const float* a, const void* b, cd_dtype b_dtype, int32_t n);
  // y[i] += alpha * x[i]; x is of dtype x_dtype.
  void (*axpy)(float alpha, const void* x, cd_dtype x_dtype, float* y, int32_t n);
};

const KernelTable& kernels_scalar();
const KernelTable& kernels_avx2();
const KernelTable& kernels_avx512();

}  // namespace conduit
