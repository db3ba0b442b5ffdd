// The CPU backend: host memory, copies that are memcpy, nothing queued, and the SIMD kernel table
// the CPU's flags allow.
#include <cstring>
#include <string>

#include "device.h"
#include "error.h"
#include "weights.h"

namespace conduit {

namespace {

int cpu_available(char*, size_t) { return 1; }

void* cpu_allocate(size_t size_bytes) { return allocate_aligned(size_bytes).release(); }

void cpu_release(void* data) { FreeDeleter{}(data); }

void cpu_copy(void* destination, const void* source, size_t size_bytes) { std::memcpy(destination, source, size_bytes); }

void cpu_synchronize() {}

const KernelTable& cpu_kernels(cd_kernel requested) {
  cd_kernel kernel = requested;
  if (kernel == CD_KERNEL_AUTO) {
    kernel = cd_kernel_supported(CD_KERNEL_AVX512) ? CD_KERNEL_AVX512
             : cd_kernel_supported(CD_KERNEL_AVX2) ? CD_KERNEL_AVX2
                                                   : CD_KERNEL_SCALAR;
  } else if (!cd_kernel_supported(kernel)) {
    throw Error(CD_ERR_UNSUPPORTED_KERNEL, std::string("kernel '") + cd_kernel_name(kernel) + "' is not supported by this CPU");
  }
#ifdef CONDUIT_X86_KERNELS
  if (kernel == CD_KERNEL_AVX512) return kernels_avx512();
  if (kernel == CD_KERNEL_AVX2) return kernels_avx2();
#endif
  return kernels_scalar();
}

}  // namespace

const DeviceBackend& cpu_backend() {
  static const DeviceBackend backend{CD_DEVICE_CPU, "cpu",     cpu_available, cpu_allocate, cpu_release,
                                     cpu_copy,      cpu_copy,  cpu_synchronize, cpu_kernels};
  return backend;
}

}  // namespace conduit
