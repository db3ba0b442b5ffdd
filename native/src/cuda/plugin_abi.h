// The one symbol libconduit_cuda.so exports, conduit_cuda_plugin(), and the table it returns:
// the runtime (src/cuda_loader.cc) opens the plugin with dlopen only when a model asks for
// device CUDA, so a machine without a GPU, a driver or the plugin never loads any CUDA code.
// Plain C types from conduit.h only; the version guards a runtime and a plugin built apart.
#pragma once

#include "conduit.h"

#define CONDUIT_CUDA_PLUGIN_ABI_VERSION 2
#define CONDUIT_CUDA_PLUGIN_SYMBOL "conduit_cuda_plugin"
#define CONDUIT_CUDA_PLUGIN_FILE "libconduit_cuda.so"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cdc_plugin {
  int32_t abi_version;
  /* -1 with the reason when CUDA cannot run (cudaGetDeviceCount's error name and text). */
  int32_t (*device_count)(char* why, size_t why_capacity);
  cd_status (*device_info)(int32_t device_index, cd_device_info* out_info, char* error, size_t error_capacity);
  /* Uploads the weights and allocates the KV cache on options->device_index. */
  cd_status (*model_load)(const cd_model_spec* spec, const cd_load_options* options, void** out_model,
                          uint64_t* out_kv_bytes_per_block, char* error, size_t error_capacity);
  /* As model_load, with weights drawn on the device from seed instead of read from files (the
     spec's tensor refs are ignored; an optional tensor is present where size_bytes > 0): the GPU
     check program's benchmark models, which no file holds. */
  cd_status (*model_load_synthetic)(const cd_model_spec* spec, const cd_load_options* options, uint64_t seed,
                                    void** out_model, uint64_t* out_kv_bytes_per_block, char* error,
                                    size_t error_capacity);
  /* One forward pass, synchronous: the runtime calls it on the model's driver thread. */
  cd_status (*model_forward)(void* model, const cd_batch* batch, cd_forward_output* output, char* error,
                             size_t error_capacity);
  void (*model_free)(void* model);
  cd_status (*probe_read_bandwidth)(int32_t device_index, size_t size_bytes, int32_t num_repeats,
                                    double* out_bytes_per_second, char* error, size_t error_capacity);
  cd_status (*probe_mma_peak)(int32_t device_index, double* out_flops_per_second, char* error, size_t error_capacity);
  /* num_ranks ranks of one in-process group on one device gather rank_bytes each, checked
     bitwise; describe: which communicator ran (device copies, or NCCL) and why. */
  cd_status (*probe_all_gather)(int32_t device_index, int32_t num_ranks, size_t rank_bytes, double* out_seconds,
                                char* describe, size_t describe_capacity, char* error, size_t error_capacity);
} cdc_plugin;

typedef const cdc_plugin* (*cdc_plugin_entry)(void);

#ifdef __cplusplus
}
#endif
