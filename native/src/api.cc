// The C API: every entry point catches, so no exception ever crosses the boundary.
#include <cstdio>
#include <new>

#include "amx.h"
#include "conduit.h"
#include "cuda_loader.h"
#include "batch_broadcast.h"
#include "comm.h"
#include "device.h"
#include "numa.h"
#include "error.h"
#include "kernels.h"
#include "model.h"
#include "probes.h"

namespace {

void write_error(char* error, size_t error_capacity, const char* message) {
  if (error != nullptr && error_capacity > 0) std::snprintf(error, error_capacity, "%s", message);
}

const conduit::KernelTable& select_kernels(cd_kernel requested) { return conduit::cpu_backend().kernels(requested); }

template <typename Body>
cd_status guarded(char* error, size_t error_capacity, Body body) {
  try {
    body();
    return CD_OK;
  } catch (const conduit::Error& e) {
    write_error(error, error_capacity, e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    write_error(error, error_capacity, "out of memory");
    return CD_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    write_error(error, error_capacity, e.what());
    return CD_ERR_INTERNAL;
  } catch (...) {
    write_error(error, error_capacity, "unknown native error");
    return CD_ERR_INTERNAL;
  }
}

constexpr size_t kForwardErrorCapacity = 1024;

// The driver thread's task. Nothing of the model is touched after done: the caller may free it.
void run_forward(void* context) {
  cd_model* model = static_cast<cd_model*>(context);
  char error[kForwardErrorCapacity] = {};
  const cd_status status = guarded(error, sizeof error, [&] { model->model->forward(*model->batch, *model->output); });
  model->done(model->user_data, status, status == CD_OK ? nullptr : error);
}

void run_device_forward(void* context) {
  cd_model* model = static_cast<cd_model*>(context);
  char error[kForwardErrorCapacity] = {};
  const cd_status status = model->plugin->model_forward(model->device_model, model->batch, model->output, error,
                                                         sizeof error);
  model->done(model->user_data, status, status == CD_OK ? nullptr : error);
}

const cdc_plugin& require_cuda() {
  std::string why;
  const cdc_plugin* plugin = conduit::cuda_plugin(why);
  if (plugin == nullptr) throw conduit::Error(CD_ERR_UNSUPPORTED_DEVICE, "device 'cuda' is not available: " + why);
  return *plugin;
}

// seed 0: the weights come from the spec's files; else they are drawn on the device.
cd_model* load_on_device(const cd_model_spec& spec, const cd_load_options& options, uint64_t seed) {
  const cdc_plugin& plugin = require_cuda();
  char why[512] = {};
  const int32_t count = plugin.device_count(why, sizeof why);
  if (count < 0) throw conduit::Error(CD_ERR_UNSUPPORTED_DEVICE, std::string("device 'cuda' is not available: ") + why);
  if (options.device_index < 0 || options.device_index >= count) {
    throw conduit::Error(CD_ERR_UNSUPPORTED_DEVICE, "device 'cuda' is not available: index " + std::to_string(options.device_index) +
                                                        " asked for, but this machine has " + std::to_string(count) +
                                                        " CUDA device(s)");
  }
  auto model = std::make_unique<cd_model>();
  char error[1024] = {};
  const cd_status status =
      seed == 0 ? plugin.model_load(&spec, &options, &model->device_model, &model->device_kv_bytes_per_block, error,
                                    sizeof error)
                : plugin.model_load_synthetic(&spec, &options, seed, &model->device_model,
                                              &model->device_kv_bytes_per_block, error, sizeof error);
  if (status != CD_OK) throw conduit::Error(status, std::string("device 'cuda': ") + error);
  model->plugin = &plugin;
  model->device_driver = std::make_unique<conduit::ThreadPool>(1);
  return model.release();
}

// The driver thread's task on a rank > 0.
void run_rank(void* context) {
  cd_model* model = static_cast<cd_model*>(context);
  char error[kForwardErrorCapacity] = {};
  const cd_status status = guarded(error, sizeof error, [&] { model->model->serve_rank(); });
  model->served_to_stop = status == CD_OK;
  model->done(model->user_data, status, status == CD_OK ? nullptr : error);
}

}  // namespace

extern "C" {

int cd_kernel_supported(cd_kernel kernel) {
#ifdef CONDUIT_X86_KERNELS
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  switch (kernel) {
    case CD_KERNEL_AVX512:
      return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
             __builtin_cpu_supports("avx512bf16");
    case CD_KERNEL_AVX2: return avx2;
    case CD_KERNEL_AMX: return cd_kernel_supported(CD_KERNEL_AVX512) && conduit::amx_support().usable;
    default: return 1;
  }
#else
  return kernel == CD_KERNEL_AUTO || kernel == CD_KERNEL_SCALAR;
#endif
}

const char* cd_kernel_name(cd_kernel kernel) {
  switch (kernel) {
    case CD_KERNEL_AMX: return "amx";
    case CD_KERNEL_AVX512: return "avx512";
    case CD_KERNEL_AVX2: return "avx2";
    case CD_KERNEL_SCALAR: return "scalar";
    default: return "auto";
  }
}

cd_status cd_model_load(const cd_model_spec* spec, const cd_load_options* options,
                        cd_model** out_model, char* error, size_t error_capacity) {
  return guarded(error, error_capacity, [&] {
    if (options->device == CD_DEVICE_CUDA) {
      // One process drives every GPU rank of a group (src/cuda/backend.cu TpGroup), as rank 0.
      if (options->tp_size > 1 && options->tp_rank != 0) {
        throw conduit::Error(CD_ERR_INVALID_ARGUMENT,
                             "device cuda: one process runs every rank of a tensor-parallel group; load rank 0 only, "
                             "with no rank processes (got rank " + std::to_string(options->tp_rank) + ")");
      }
      *out_model = load_on_device(*spec, *options, 0);
      return;
    }
    const conduit::KernelTable& kernels = conduit::device_backend(options->device).kernels(options->kernel);
    // A rank reaches its group before loading, so an unreachable group fails at once.
    std::unique_ptr<conduit::Communicator> comm;
    const bool over_mpi = options->tp_size > 1 && conduit::is_mpi_group(options->tp_group);
    if (over_mpi) {
      comm = conduit::open_mpi_communicator(options->tp_rank, options->tp_size);
    } else if (options->tp_size > 1) {
      comm = conduit::open_shm_communicator(options->tp_group, options->tp_rank, options->tp_size,
                                            options->tp_connect_timeout_ms);
    }
    // A rank's threads start pinned to its NUMA node, where its shard's pages are then first touched.
    const int32_t numa_node = options->tp_size > 1 ? conduit::numa_node_for_rank(options->tp_rank) : -1;
    std::unique_ptr<conduit::Model> model;
    {
      const conduit::NodeAffinity affinity(numa_node);
      model = std::make_unique<conduit::Model>(*spec, *options, kernels, std::move(comm));
    }
    model->numa_node = numa_node;
    if (over_mpi) {
      conduit::mpi_barrier(*model->tp.comm, options->tp_connect_timeout_ms);
    } else if (model->tp.comm != nullptr) {
      if (model->tp.rank == 0) {
        conduit::wait_for_ranks(*model->tp.comm, options->tp_connect_timeout_ms, options->tp_rank_pids);
      } else {
        conduit::mark_ready(*model->tp.comm);
      }
    }
    auto* loaded = new cd_model{};
    loaded->model = std::move(model);
    loaded->over_mpi = over_mpi;
    loaded->tp_connect_timeout_ms = options->tp_connect_timeout_ms;
    *out_model = loaded;
  });
}

void cd_model_get_info(const cd_model* model, cd_model_info* out_info) {
  if (model->device_model != nullptr) {
    // The host's share of a GPU pass (sampling the device sampler leaves to it) runs these.
    out_info->kernel = CD_KERNEL_SCALAR;
    out_info->kv_bytes_per_block = model->device_kv_bytes_per_block;
    out_info->device = CD_DEVICE_CUDA;
    out_info->numa_node = -1;
    return;
  }
  out_info->device = CD_DEVICE_CPU;
  out_info->kernel = model->model->kernels.kernel;
  out_info->kv_bytes_per_block = model->model->kv_cache.bytes_per_block();
  out_info->numa_node = model->model->numa_node;
}

void cd_model_forward(cd_model* model, const cd_batch* batch, cd_forward_output* output, cd_forward_done done,
                      void* user_data) {
  model->batch = batch;
  model->output = output;
  model->done = done;
  model->user_data = user_data;
  if (model->device_model != nullptr) {
    model->device_driver->submit(run_device_forward, model);
    return;
  }
  model->model->pool.submit(run_forward, model);
}

cd_status cd_model_load_synthetic(const cd_model_spec* spec, const cd_load_options* options, uint64_t seed,
                                  cd_model** out_model, char* error, size_t error_capacity) {
  return guarded(error, error_capacity, [&] {
    if (options->device != CD_DEVICE_CUDA || seed == 0) {
      throw conduit::Error(CD_ERR_INVALID_ARGUMENT, "synthetic models load on device cuda with a nonzero seed");
    }
    *out_model = load_on_device(*spec, *options, seed);
  });
}

int32_t cd_cuda_device_count(char* why, size_t why_capacity) {
  std::string reason;
  const cdc_plugin* plugin = conduit::cuda_plugin(reason);
  if (plugin == nullptr) {
    write_error(why, why_capacity, reason.c_str());
    return -1;
  }
  return plugin->device_count(why, why_capacity);
}

cd_status cd_cuda_device_info(int32_t device_index, cd_device_info* out_info, char* error, size_t error_capacity) {
  return guarded(error, error_capacity, [&] {
    const cd_status status = require_cuda().device_info(device_index, out_info, error, error_capacity);
    if (status != CD_OK) throw conduit::Error(status, error);
  });
}

cd_status cd_cuda_probe_read_bandwidth(int32_t device_index, size_t size_bytes, int32_t num_repeats,
                                       double* out_bytes_per_second, char* error, size_t error_capacity) {
  return guarded(error, error_capacity, [&] {
    const cd_status status = require_cuda().probe_read_bandwidth(device_index, size_bytes, num_repeats,
                                                                 out_bytes_per_second, error, error_capacity);
    if (status != CD_OK) throw conduit::Error(status, error);
  });
}

cd_status cd_cuda_probe_mma_peak(int32_t device_index, double* out_flops_per_second, char* error,
                                 size_t error_capacity) {
  return guarded(error, error_capacity, [&] {
    const cd_status status = require_cuda().probe_mma_peak(device_index, out_flops_per_second, error, error_capacity);
    if (status != CD_OK) throw conduit::Error(status, error);
  });
}

cd_status cd_cuda_probe_all_gather(int32_t device_index, int32_t num_ranks, size_t rank_bytes, double* out_seconds,
                                   char* describe, size_t describe_capacity, char* error, size_t error_capacity) {
  return guarded(error, error_capacity, [&] {
    const cd_status status = require_cuda().probe_all_gather(device_index, num_ranks, rank_bytes, out_seconds, describe,
                                                             describe_capacity, error, error_capacity);
    if (status != CD_OK) throw conduit::Error(status, error);
  });
}
void cd_model_serve_rank(cd_model* model, cd_forward_done done, void* user_data) {
  model->done = done;
  model->user_data = user_data;
  model->model->pool.submit(run_rank, model);
}

uint64_t cd_model_collective_ns(const cd_model* model) {
  if (model->model == nullptr) return 0;
  const auto& comm = model->model->tp.comm;
  return comm == nullptr ? 0 : comm->collective_ns();
}

void cd_model_set_active_threads(cd_model* model, const int32_t* num_threads_cell) {
  if (model->model != nullptr) model->model->pool.set_active_threads(num_threads_cell);
}

void cd_model_free(cd_model* model) {
  if (model == nullptr) return;
  if (model->device_model != nullptr) {
    model->device_driver.reset();  // no pass runs once its thread has joined
    model->plugin->model_free(model->device_model);
    delete model;
    return;
  }
  // Rank 0 stops its group's serving loops; a group already failed has no one to tell.
  auto& tp = model->model->tp;
  bool ends_job = model->over_mpi && model->served_to_stop;
  if (tp.comm != nullptr && tp.rank == 0) {
    char error[kForwardErrorCapacity] = {};
    const cd_status status = guarded(error, sizeof error, [&] { conduit::send_stop(*tp.comm); });
    ends_job = model->over_mpi && status == CD_OK;
  }
  // Free returns nothing, so a failed end of an MPI job is said on stderr, where mpiexec shows it.
  if (ends_job) {
    char error[kForwardErrorCapacity] = {};
    if (guarded(error, sizeof error, [&] { conduit::end_mpi_job(*tp.comm, model->tp_connect_timeout_ms); }) != CD_OK) {
      std::fprintf(stderr, "%s\n", error);
    }
  }
  delete model;
}

cd_status cd_probe_stream_read(size_t size_bytes, int32_t num_threads, int32_t num_repeats,
                               double* out_bytes_per_second, char* error, size_t error_capacity) {
  return guarded(error, error_capacity, [&] {
#ifdef CONDUIT_X86_KERNELS
    const cd_kernel widest = cd_kernel_supported(CD_KERNEL_AVX512) ? CD_KERNEL_AVX512 : CD_KERNEL_AVX2;
    select_kernels(widest);
    *out_bytes_per_second = conduit::measure_stream_read(widest, size_bytes, num_threads, num_repeats);
#else
    select_kernels(CD_KERNEL_AVX2);
#endif
  });
}

cd_status cd_probe_peak(cd_kernel kernel, int32_t num_threads, double* out_flops_per_second, char* error,
                        size_t error_capacity) {
  return guarded(error, error_capacity, [&] {
    if (kernel != CD_KERNEL_AMX && kernel != CD_KERNEL_AVX512 && kernel != CD_KERNEL_AVX2) {
      throw conduit::Error(CD_ERR_INVALID_ARGUMENT, "the peak probe measures the amx, avx512 or avx2 path");
    }
    select_kernels(kernel);
#ifdef CONDUIT_X86_KERNELS
    *out_flops_per_second = conduit::measure_peak(kernel, num_threads);
#endif
  });
}

cd_status cd_probe_thread_handoff(int32_t num_threads, int32_t num_calls, double* out_wake_latency_ns,
                                  double* out_call_ns, char* error, size_t error_capacity) {
  return guarded(error, error_capacity, [&] {
    const conduit::ThreadHandoff handoff = conduit::measure_thread_handoff(num_threads, num_calls);
    *out_wake_latency_ns = handoff.wake_latency_ns;
    *out_call_ns = handoff.call_ns;
  });
}

cd_status cd_probe_matmul(const cd_matmul_probe* probe, double* out_seconds, char* error,
                          size_t error_capacity) {
  return guarded(error, error_capacity, [&] {
    const conduit::KernelTable& kernels = select_kernels(probe->kernel);
    const conduit::MatrixFormat format =
        probe->quantization == CD_QUANTIZATION_INT8   ? conduit::MatrixFormat::kQ8Panels
        : probe->quantization == CD_QUANTIZATION_INT4 ? conduit::MatrixFormat::kQ4Panels
        : probe->dtype == CD_DTYPE_BF16             ? conduit::MatrixFormat::kBf16Panels
        : probe->dtype == CD_DTYPE_F16              ? conduit::MatrixFormat::kF16Panels
                                                    : conduit::MatrixFormat::kF32Panels;
    *out_seconds = conduit::measure_matmul(kernels, format, probe->num_rows, probe->k, probe->n,
                                           probe->num_threads, probe->num_repeats);
  });
}

}  // extern "C"
