// The machine ceilings the benchmark reports against, measured with AVX-512 code: streaming-read
// bandwidth and the vdpbf16ps peak. Compiled with the AVX-512 flags; called only when the CPU
// runs the avx512 kernel path.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "probes.h"

namespace conduit {

uint64_t probe_stream_sum_avx512(const void* data, size_t size_bytes) {
  const uint8_t* bytes = static_cast<const uint8_t*>(data);
  __m512i acc0 = _mm512_setzero_si512(), acc1 = _mm512_setzero_si512();
  __m512i acc2 = _mm512_setzero_si512(), acc3 = _mm512_setzero_si512();
  for (size_t i = 0; i + 256 <= size_bytes; i += 256) {
    acc0 = _mm512_add_epi64(acc0, _mm512_load_si512(bytes + i));
    acc1 = _mm512_add_epi64(acc1, _mm512_load_si512(bytes + i + 64));
    acc2 = _mm512_add_epi64(acc2, _mm512_load_si512(bytes + i + 128));
    acc3 = _mm512_add_epi64(acc3, _mm512_load_si512(bytes + i + 192));
  }
  const __m512i sum = _mm512_add_epi64(_mm512_add_epi64(acc0, acc1), _mm512_add_epi64(acc2, acc3));
  return uint64_t(_mm512_reduce_add_epi64(sum));
}

// 24 independent accumulators hide the instruction's latency where two issue a cycle (AMD Zen 5:
// 12 reached 92 % of 24's rate); each iteration is 24 x 16 lanes x 2 products x 2 flops.
float probe_bf16_peak_avx512(int64_t num_iterations, int64_t* out_flops) {
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80);  // 1.0
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3400);  // 2^-23
  __m512 acc[24];
  for (__m512& v : acc) v = _mm512_setzero_ps();
  for (int64_t i = 0; i < num_iterations; ++i) {
    // Unrolled, so the accumulators stay in registers (GCC 12 left 24 of them in memory).
#pragma GCC unroll 24
    for (__m512& v : acc) v = _mm512_dpbf16_ps(v, a, b);
  }
  __m512 total = _mm512_setzero_ps();
  for (const __m512& v : acc) total = _mm512_add_ps(total, v);
  *out_flops = num_iterations * 24 * 16 * 2 * 2;
  return _mm512_reduce_add_ps(total);
}

}  // namespace conduit
