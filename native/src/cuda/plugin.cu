// The plugin's one exported symbol: the table of cuda/plugin_abi.h. Every entry catches, so no
// exception crosses into the runtime.
#include <cstdio>
#include <new>

#include "backend.h"
#include "common.cuh"
#include "cuda/device_group.h"
#include "cuda/plugin_abi.h"
#include "kernels.cuh"

namespace conduit {
namespace cuda {
namespace {

void write_error(char* error, size_t capacity, const char* message) {
  if (error != nullptr && capacity > 0) std::snprintf(error, capacity, "%s", message);
}

template <typename Body>
cd_status guarded(char* error, size_t capacity, Body body) {
  try {
    body();
    return CD_OK;
  } catch (const Error& e) {
    write_error(error, capacity, e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    write_error(error, capacity, "out of host memory");
    return CD_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    write_error(error, capacity, e.what());
    return CD_ERR_INTERNAL;
  } catch (...) {
    write_error(error, capacity, "unknown error in the CUDA plugin");
    return CD_ERR_INTERNAL;
  }
}

int32_t device_count(char* why, size_t why_capacity) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    // cudaErrorInsufficientDriver without a driver, cudaErrorNoDevice without a GPU.
    write_error(why, why_capacity, ("no usable CUDA device: cudaGetDeviceCount returned " + describe(status)).c_str());
    return -1;
  }
  if (count == 0) {
    write_error(why, why_capacity, "no usable CUDA device: the driver reports 0 devices");
    return -1;
  }
  return count;
}

cd_status device_info(int32_t index, cd_device_info* out, char* error, size_t capacity) {
  return guarded(error, capacity, [&] {
    cudaDeviceProp props{};
    CDC_CHECK(cudaGetDeviceProperties(&props, index));
    std::snprintf(out->name, sizeof out->name, "%s", props.name);
    out->compute_capability_major = props.major;
    out->compute_capability_minor = props.minor;
    out->num_sms = props.multiProcessorCount;
    out->memory_bytes = props.totalGlobalMem;
    CDC_CHECK(cudaDriverGetVersion(&out->driver_version));
    CDC_CHECK(cudaRuntimeGetVersion(&out->runtime_version));
    if (props.major < 8) {
      throw Error(CD_ERR_UNSUPPORTED_DEVICE, std::string(props.name) + " has compute capability " +
                                                 std::to_string(props.major) + "." + std::to_string(props.minor) +
                                                 "; the CUDA backend needs 8.0 or newer (bf16 mma)");
    }
  });
}

cd_status model_load(const cd_model_spec* spec, const cd_load_options* options, void** out_model,
                     uint64_t* out_kv_bytes_per_block, char* error, size_t capacity) {
  return guarded(error, capacity, [&] {
    cd_device_info info{};
    char info_error[512] = {};
    const cd_status status = device_info(options->device_index, &info, info_error, sizeof info_error);
    if (status != CD_OK) throw Error(status, info_error);
    CudaModelHandle* handle = load_model(*spec, *options, 0);
    *out_kv_bytes_per_block = kv_bytes_per_block(*handle);
    *out_model = handle;
  });
}

cd_status model_load_synthetic(const cd_model_spec* spec, const cd_load_options* options, uint64_t seed,
                               void** out_model, uint64_t* out_kv_bytes_per_block, char* error, size_t capacity) {
  return guarded(error, capacity, [&] {
    if (seed == 0) throw Error(CD_ERR_INVALID_ARGUMENT, "a synthetic model needs a nonzero seed");
    CudaModelHandle* handle = load_model(*spec, *options, seed);
    *out_kv_bytes_per_block = kv_bytes_per_block(*handle);
    *out_model = handle;
  });
}

cd_status model_forward(void* model, const cd_batch* batch, cd_forward_output* output, char* error, size_t capacity) {
  return guarded(error, capacity, [&] { forward(*static_cast<CudaModelHandle*>(model), *batch, *output); });
}

void model_free(void* model) {
  try {
    free_model(static_cast<CudaModelHandle*>(model));
  } catch (...) {
  }
}

cd_status read_bandwidth(int32_t device, size_t size_bytes, int32_t repeats, double* out, char* error, size_t capacity) {
  return guarded(error, capacity, [&] { *out = probe_read_bandwidth(device, size_bytes, repeats); });
}

cd_status mma_peak(int32_t device, double* out, char* error, size_t capacity) {
  return guarded(error, capacity, [&] { *out = probe_mma_peak(device); });
}

cd_status all_gather(int32_t device, int32_t num_ranks, size_t rank_bytes, double* out, char* describe,
                     size_t describe_capacity, char* error, size_t capacity) {
  return guarded(error, capacity, [&] {
    std::string text;
    *out = probe_all_gather(device, num_ranks, rank_bytes, text);
    std::snprintf(describe, describe_capacity, "%s", text.c_str());
  });
}

const cdc_plugin kPlugin{CONDUIT_CUDA_PLUGIN_ABI_VERSION, device_count, device_info, model_load, model_load_synthetic,
                         model_forward, model_free, read_bandwidth, mma_peak, all_gather};

}  // namespace
}  // namespace cuda
}  // namespace conduit

extern "C" __attribute__((visibility("default"))) const cdc_plugin* conduit_cuda_plugin(void) {
  return &conduit::cuda::kPlugin;
}
