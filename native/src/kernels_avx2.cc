// AVX2 + FMA kernels: 8 fp32 lanes; bf16 widens by shifting, fp16 with F16C.
#include <immintrin.h>

#include "dtype.h"
#include "kernels.h"

namespace conduit {
namespace {

using Vec = __m256;
constexpr int32_t kLanes = 8;

inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vset1(float value) { return _mm256_set1_ps(value); }
inline Vec vload_f32(const float* p) { return _mm256_loadu_ps(p); }
inline Vec vload_bf16(const uint16_t* p) {
  const __m256i widened = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(widened, 16));
}
inline Vec vload_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline void vstore(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec vfma(Vec a, Vec b, Vec acc) { return _mm256_fmadd_ps(a, b, acc); }
inline float vsum(Vec v) {
  __m128 quarter = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  quarter = _mm_add_ps(quarter, _mm_movehl_ps(quarter, quarter));
  quarter = _mm_add_ss(quarter, _mm_movehdup_ps(quarter));
  return _mm_cvtss_f32(quarter);
}
inline float sfma(float a, float b, float acc) { return __builtin_fmaf(a, b, acc); }

#include "kernels_body.inc"

}  // namespace

const KernelTable& kernels_avx2() {
  static const KernelTable table{CD_KERNEL_AVX2, matmul, dot, axpy};
  return table;
}

}  // namespace conduit
