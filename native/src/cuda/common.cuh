// What every CUDA translation unit of the plugin shares: error checks that become conduit::Error
// with the CUDA error's name, and the bf16 helpers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <string>

#include "error.h"

namespace conduit {
namespace cuda {

inline std::string describe(cudaError_t error) {
  return std::string(cudaGetErrorName(error)) + " (" + cudaGetErrorString(error) + ")";
}

#define CDC_CHECK(call)                                                                                   \
  do {                                                                                                    \
    const cudaError_t cdc_error_ = (call);                                                                \
    if (cdc_error_ != cudaSuccess) {                                                                      \
      throw ::conduit::Error(cdc_error_ == cudaErrorMemoryAllocation ? CD_ERR_OUT_OF_MEMORY : CD_ERR_INTERNAL, \
                             std::string(#call) + " failed: " + ::conduit::cuda::describe(cdc_error_));  \
    }                                                                                                     \
  } while (0)

// A launch's configuration errors surface at once; its execution errors at the next sync.
#define CDC_CHECK_LAUNCH() CDC_CHECK(cudaGetLastError())

// Sets a kernel's dynamic shared-memory limit once per device (the attribute is per device; up to
// 32 devices tracked in `configured`, one static per kernel).
template <typename Kernel>
void allow_shared_memory(Kernel kernel, int bytes, std::atomic<uint32_t>& configured) {
  int device = 0;
  CDC_CHECK(cudaGetDevice(&device));
  const uint32_t bit = 1u << (device & 31);
  if (configured.load(std::memory_order_acquire) & bit) return;
  CDC_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  configured.fetch_or(bit, std::memory_order_acq_rel);
}

__host__ __device__ inline int32_t ceil_div(int32_t a, int32_t b) { return (a + b - 1) / b; }

}  // namespace cuda
}  // namespace conduit
