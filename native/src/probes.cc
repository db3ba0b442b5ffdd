#include "probes.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <vector>

#include "dtype.h"
#include "matmul.h"
#include "thread_pool.h"
#include "weights.h"

namespace conduit {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Deterministic filler; the values only need to be ordinary numbers.
uint32_t next_random(uint32_t& state) {
  state = state * 1664525u + 1013904223u;
  return state >> 8;
}

float random_unit(uint32_t& state) { return float(next_random(state) % 2001) / 1000.0f - 1.0f; }

double thread_cpu_seconds() {
  timespec now;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return double(now.tv_sec) + double(now.tv_nsec) * 1e-9;
}

}  // namespace

#ifdef CONDUIT_X86_KERNELS
double measure_stream_read(cd_kernel kernel, size_t size_bytes, int32_t num_threads, int32_t num_repeats) {
  const auto stream_sum = kernel == CD_KERNEL_AVX512 || kernel == CD_KERNEL_AMX ? probe_stream_sum_avx512 : probe_stream_sum_avx2;
  const size_t slice_bytes = size_bytes / size_t(num_threads) / 256 * 256;
  AlignedBuffer buffer = allocate_aligned(slice_bytes * size_t(num_threads));
  std::memset(buffer.get(), 1, slice_bytes * size_t(num_threads));
  ThreadPool pool(num_threads);
  std::vector<uint64_t> sums(static_cast<size_t>(num_threads));
  double best_seconds = 1e30;
  for (int32_t repeat = 0; repeat < num_repeats; ++repeat) {
    const auto start = std::chrono::steady_clock::now();
    pool.on_every_thread([&](int32_t slice) {
      sums[size_t(slice)] = stream_sum(static_cast<const uint8_t*>(buffer.get()) + size_t(slice) * slice_bytes, slice_bytes);
    });
    best_seconds = std::min(best_seconds, seconds_since(start));
  }
  return double(slice_bytes) * num_threads / best_seconds;
}

double measure_peak(cd_kernel kernel, int32_t num_threads) {
  // A TDPBF16PS iteration (four tile instructions) does 1024x the work of a vector one.
  const int64_t kIterations = kernel == CD_KERNEL_AMX ? 200'000 : 20'000'000;
  const auto peak_loop = kernel == CD_KERNEL_AMX      ? probe_bf16_peak_amx
                         : kernel == CD_KERNEL_AVX512 ? probe_bf16_peak_avx512
                                                      : probe_fma_peak_avx2;
  ThreadPool pool(num_threads);
  std::vector<float> sinks(static_cast<size_t>(num_threads));
  std::vector<int64_t> flops(static_cast<size_t>(num_threads));
  std::vector<double> cpu_seconds(static_cast<size_t>(num_threads));
  double best = 0;
  for (int32_t repeat = 0; repeat < 3; ++repeat) {
    // Each thread's own CPU time, not the wall clock: a neighbour's process that preempts one
    // thread would otherwise pass for a lower ceiling (the register loop waits on nothing else).
    pool.on_every_thread([&](int32_t t) {
      const double start = thread_cpu_seconds();
      sinks[size_t(t)] = peak_loop(kIterations, &flops[size_t(t)]);
      cpu_seconds[size_t(t)] = thread_cpu_seconds() - start;
    });
    double rate = 0;
    for (size_t t = 0; t < flops.size(); ++t) rate += double(flops[t]) / cpu_seconds[t];
    best = std::max(best, rate);
  }
  return best;
}

#endif

double measure_matmul(const KernelTable& kernels, MatrixFormat format, int32_t num_rows, int32_t k,
                      int32_t n, int32_t num_threads, int32_t num_repeats) {
  uint32_t state = 12345;
  std::vector<float> x(size_t(num_rows) * size_t(k));
  for (float& value : x) value = random_unit(state);
  std::vector<float> y(size_t(num_rows) * size_t(n));
  MatmulScratch scratch;
  AlignedBuffer data;
  Matrix matrix{nullptr, format};
  if (format == MatrixFormat::kQ8Panels) {
    const size_t size_bytes = q8_panels_bytes(n, k);
    data = allocate_aligned(size_bytes);
    uint8_t* bytes = static_cast<uint8_t*>(data.get());
    for (size_t block = 0; block < size_bytes / kQ8PanelBlockBytes; ++block) {
      uint8_t* values = bytes + block * kQ8PanelBlockBytes;
      for (int32_t i = 0; i < kPanelColumns * 32; ++i) values[i] = uint8_t(int32_t(next_random(state) % 255) - 127);
      uint16_t* scales = reinterpret_cast<uint16_t*>(values + kPanelColumns * 32);
      for (int32_t i = 0; i < kPanelColumns; ++i) scales[i] = f32_to_f16(0.01f);
    }
  } else if (format == MatrixFormat::kQ4Panels) {
    const size_t size_bytes = q4_panels_bytes(n, k);
    data = allocate_aligned(size_bytes);
    uint8_t* bytes = static_cast<uint8_t*>(data.get());
    for (size_t block = 0; block < size_bytes / kQ4PanelBlockBytes; ++block) {
      uint8_t* codes = bytes + block * kQ4PanelBlockBytes;
      for (int32_t i = 0; i < kPanelColumns * 16; ++i) codes[i] = uint8_t(next_random(state));
      float* scales = reinterpret_cast<float*>(codes + kPanelColumns * 16);
      for (int32_t i = 0; i < kPanelColumns; ++i) scales[i] = 0.01f, scales[kPanelColumns + i] = -0.08f;
    }
  } else {
    const cd_dtype dtype = format == MatrixFormat::kBf16Panels  ? CD_DTYPE_BF16
                           : format == MatrixFormat::kF16Panels ? CD_DTYPE_F16
                                                                : CD_DTYPE_F32;
    const size_t count = size_t(num_panels(n)) * panel_elements(format, k);
    data = allocate_aligned(count * dtype_bytes(dtype));
    for (size_t i = 0; i < count; ++i) store_from_f32(data.get(), dtype, i, random_unit(state) * 0.05f);
  }
  matrix.data = data.get();
  ThreadPool pool(num_threads);
  double best_seconds = 1e30;
  for (int32_t repeat = 0; repeat <= num_repeats; ++repeat) {
    const auto start = std::chrono::steady_clock::now();
    parallel_matmuls(pool, kernels, MatmulInput{x.data()}, num_rows, k, {{matrix, n, y.data()}}, scratch);
    if (repeat > 0) best_seconds = std::min(best_seconds, seconds_since(start));
  }
  return best_seconds;
}

ThreadHandoff measure_thread_handoff(int32_t num_threads, int32_t num_calls) {
  ThreadPool pool(num_threads);
  std::vector<int32_t> sinks(static_cast<size_t>(num_threads));
  const auto call = [&] {
    pool.parallel_for(num_threads, 1, [&](int32_t thread_index, int32_t begin, int32_t) { sinks[size_t(thread_index)] += begin; });
  };
  call();  // workers awake and polling
  const auto start = std::chrono::steady_clock::now();
  for (int32_t i = 0; i < num_calls; ++i) call();
  return ThreadHandoff{double(pool.wake_latency_ns()), seconds_since(start) * 1e9 / num_calls};
}

}  // namespace conduit
