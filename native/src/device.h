// The device interface (ggml-backend style): one table of functions per backend, for the memory a
// model holds on its device, the copies between host and device, the kernels a forward pass
// calls, and the wait for queued work. The CPU backend (device_cpu.cc) is the first; a CUDA
// backend lives in a plugin, libconduit_cuda.so, opened on first use (device.cc) so a build or a
// machine without CUDA loads and runs everything else.
#pragma once

#include <cstddef>

#include "conduit.h"
#include "kernels.h"

namespace conduit {

struct DeviceBackend {
  cd_device device;
  const char* name;  // "cpu", "cuda": LoadOptions.device
  // Nonzero when this build and machine can run the backend; otherwise why not, into why.
  int (*available)(char* why, size_t why_capacity);
  // Device memory (weights, the KV cache, a pass's buffers), aligned to 64 bytes at least, its
  // contents undefined; throws Error(CD_ERR_OUT_OF_MEMORY) when it cannot be had.
  void* (*allocate)(size_t size_bytes);
  void (*release)(void* data);
  void (*copy_to_device)(void* device_destination, const void* host_source, size_t size_bytes);
  void (*copy_to_host)(void* host_destination, const void* device_source, size_t size_bytes);
  // Returns once every copy and kernel queued so far has completed.
  void (*synchronize)();
  // The kernels a forward pass calls on this device, for the path asked for (CD_KERNEL_AUTO: the
  // best the device has); throws Error(CD_ERR_UNSUPPORTED_KERNEL) naming a path it lacks.
  const KernelTable& (*kernels)(cd_kernel requested);
};

// The backend for a device: the CPU's, or a plugin's registered before or opened now. Throws
// Error(CD_ERR_UNSUPPORTED_DEVICE) saying why a device cannot be used here.
const DeviceBackend& device_backend(cd_device device);

// Makes a backend available to device_backend; a plugin's conduit_device_backend() result is
// registered this way when it is opened. The table must outlive the process's models.
void register_device_backend(const DeviceBackend& backend);

const DeviceBackend& cpu_backend();

}  // namespace conduit

extern "C" {
// What a device plugin (libconduit_<name>.so) exports: its backend table, or nullptr with why.
typedef const conduit::DeviceBackend* (*conduit_device_backend_fn)(char* why, size_t why_capacity);
}
