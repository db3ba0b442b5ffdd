// Benchmark probes: machine ceilings and single-matmul timings, for tools/bench-native.ts.
#pragma once

#include <cstddef>
#include <cstdint>

namespace conduit {

// Sums every 64-bit word of data (size a multiple of 256), so no load can be skipped.
uint64_t probe_stream_sum_avx512(const void* data, size_t size_bytes);
// Runs a register-resident vdpbf16ps loop; returns a value the caller must consume.
float probe_bf16_peak_avx512(int64_t num_iterations, int64_t* out_flops);

}  // namespace conduit

#include "kernels.h"

namespace conduit {

// x86-64 only (CONDUIT_X86_KERNELS). Best streaming-read bandwidth, bytes per second, of num_threads threads each reading its slice
// of a size_bytes buffer (make it far larger than the last-level cache).
double measure_stream_read(size_t size_bytes, int32_t num_threads, int32_t num_repeats);
// Best vdpbf16ps flops per second over num_threads threads.
double measure_bf16_peak(int32_t num_threads);
// Best seconds of one parallel matmul [num_rows, k] x [n, k]^T with random weights of format,
// split over num_threads threads as a forward pass splits it.
double measure_matmul(const KernelTable& kernels, MatrixFormat format, int32_t num_rows, int32_t k,
                      int32_t n, int32_t num_threads, int32_t num_repeats);

}  // namespace conduit
