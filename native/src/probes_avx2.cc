// The machine ceilings measured with AVX2 code, for CPUs without the avx512 kernel path:
// streaming-read bandwidth and the fp32 FMA peak, the ceiling of the avx2 kernels (every weight
// format widens to fp32 multiply-adds there). Compiled with the AVX2 flags.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "probes.h"

namespace conduit {

uint64_t probe_stream_sum_avx2(const void* data, size_t size_bytes) {
  const uint8_t* bytes = static_cast<const uint8_t*>(data);
  __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
  __m256i acc2 = _mm256_setzero_si256(), acc3 = _mm256_setzero_si256();
  for (size_t i = 0; i + 256 <= size_bytes; i += 256) {
    acc0 = _mm256_add_epi64(acc0, _mm256_add_epi64(_mm256_load_si256(reinterpret_cast<const __m256i*>(bytes + i)),
                                                   _mm256_load_si256(reinterpret_cast<const __m256i*>(bytes + i + 32))));
    acc1 = _mm256_add_epi64(acc1, _mm256_add_epi64(_mm256_load_si256(reinterpret_cast<const __m256i*>(bytes + i + 64)),
                                                   _mm256_load_si256(reinterpret_cast<const __m256i*>(bytes + i + 96))));
    acc2 = _mm256_add_epi64(acc2, _mm256_add_epi64(_mm256_load_si256(reinterpret_cast<const __m256i*>(bytes + i + 128)),
                                                   _mm256_load_si256(reinterpret_cast<const __m256i*>(bytes + i + 160))));
    acc3 = _mm256_add_epi64(acc3, _mm256_add_epi64(_mm256_load_si256(reinterpret_cast<const __m256i*>(bytes + i + 192)),
                                                   _mm256_load_si256(reinterpret_cast<const __m256i*>(bytes + i + 224))));
  }
  const __m256i sum = _mm256_add_epi64(_mm256_add_epi64(acc0, acc1), _mm256_add_epi64(acc2, acc3));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), sum);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

// 12 independent accumulators cover the FMA latency (4-5 cycles) on two ports; each iteration
// is 12 x 8 lanes x 2 flops.
float probe_fma_peak_avx2(int64_t num_iterations, int64_t* out_flops) {
  const __m256 a = _mm256_set1_ps(1.0f);
  const __m256 b = _mm256_set1_ps(0x1.0p-23f);
  __m256 acc[12];
  for (__m256& v : acc) v = _mm256_setzero_ps();
  for (int64_t i = 0; i < num_iterations; ++i) {
#pragma GCC unroll 12
    for (int v = 0; v < 12; ++v) acc[v] = _mm256_fmadd_ps(a, b, acc[v]);
  }
  __m256 total = _mm256_setzero_ps();
  for (const __m256& v : acc) total = _mm256_add_ps(total, v);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, total);
  *out_flops = num_iterations * 12 * 8 * 2;
  return lanes[0];
}

}  // namespace conduit
