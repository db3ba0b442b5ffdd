// AVX-512F kernels: 16 fp32 lanes; bf16 widens by shifting, fp16 with vcvtph2ps.
#include <immintrin.h>

#include "dtype.h"
#include "kernels.h"

namespace conduit {
namespace {

using Vec = __m512;
constexpr int32_t kLanes = 16;

inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vset1(float value) { return _mm512_set1_ps(value); }
inline Vec vload_f32(const float* p) { return _mm512_loadu_ps(p); }
inline Vec vload_bf16(const uint16_t* p) {
  const __m512i widened = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(widened, 16));
}
inline Vec vload_f16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline void vstore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec vfma(Vec a, Vec b, Vec acc) { return _mm512_fmadd_ps(a, b, acc); }
inline float vsum(Vec v) {
  const __m256 halves = _mm256_add_ps(_mm512_castps512_ps256(v),
                                      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  __m128 quarter = _mm_add_ps(_mm256_castps256_ps128(halves), _mm256_extractf128_ps(halves, 1));
  quarter = _mm_add_ps(quarter, _mm_movehl_ps(quarter, quarter));
  quarter = _mm_add_ss(quarter, _mm_movehdup_ps(quarter));
  return _mm_cvtss_f32(quarter);
}
inline float sfma(float a, float b, float acc) { return __builtin_fmaf(a, b, acc); }

#include "kernels_body.inc"

}  // namespace

const KernelTable& kernels_avx512() {
  static const KernelTable table{CD_KERNEL_AVX512, matmul, dot, axpy};
  return table;
}

}  // namespace conduit
