// Benchmark probes: machine ceilings and single-matmul timings, for tools/bench-native.ts.
#pragma once

#include <cstddef>
#include <cstdint>

namespace conduit {

// Sum every 64-bit word of data (size a multiple of 256), so no load can be skipped.
uint64_t probe_stream_sum_avx512(const void* data, size_t size_bytes);
uint64_t probe_stream_sum_avx2(const void* data, size_t size_bytes);
// Run a register-resident vdpbf16ps (avx512) or fp32 FMA (avx2) loop; return a value the caller
// must consume.
float probe_bf16_peak_avx512(int64_t num_iterations, int64_t* out_flops);
float probe_fma_peak_avx2(int64_t num_iterations, int64_t* out_flops);
// TDPBF16PS on four accumulator tiles (kernels_amx.cc), only where amx_support().usable.
float probe_bf16_peak_amx(int64_t num_iterations, int64_t* out_flops);

}  // namespace conduit

#include "kernels.h"

namespace conduit {

// x86-64 only (CONDUIT_X86_KERNELS), for the avx512 and avx2 paths.
// Best streaming-read bandwidth, bytes per second, of num_threads threads each reading its slice
// of a size_bytes buffer (make it far larger than the last-level cache), with the path's loads.
double measure_stream_read(cd_kernel kernel, size_t size_bytes, int32_t num_threads, int32_t num_repeats);
// The path's multiply-add ceiling, flops per second over num_threads threads (each thread's flops
// over its own CPU time, summed): the TDPBF16PS peak on amx, the vdpbf16ps peak on avx512, the
// fp32 FMA peak on avx2.
double measure_peak(cd_kernel kernel, int32_t num_threads);
// Best seconds of one parallel matmul [num_rows, k] x [n, k]^T with random weights of format,
// split over num_threads threads as a forward pass splits it.
double measure_matmul(const KernelTable& kernels, MatrixFormat format, int32_t num_rows, int32_t k,
                      int32_t n, int32_t num_threads, int32_t num_repeats);

// A pool of num_threads threads: its wake-up latency measured at start, and the mean
// nanoseconds of a call of num_threads empty tasks over num_calls back-to-back calls (the
// hand-off between polling threads).
struct ThreadHandoff {
  double wake_latency_ns;
  double call_ns;
};
ThreadHandoff measure_thread_handoff(int32_t num_threads, int32_t num_calls);

}  // namespace conduit
