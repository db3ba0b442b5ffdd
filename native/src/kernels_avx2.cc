// AVX2 + FMA kernels: 8 fp32 lanes; float weight panels against fp32 activations (bf16 widens by
// shifting and masking, fp16 with F16C); int8 weight rows by vpmaddwd against int16 activations.
#include <immintrin.h>

#include "dtype.h"
#include "kernels.h"

namespace conduit {
namespace {

using Vec = __m256;
constexpr int32_t kLanes = 8;
// 2 x 4 accumulators plus operands fit the 16 ymm registers (int8 rows).
constexpr int kTileRows = 2;
// Float panels: 4 rows x 2 vectors of accumulators, the step's weights (two per vector for bf16
// pairs) and one broadcast fit the 16 ymm registers.
constexpr int kPanelTileRows = 4;
constexpr int kPanelTileVectors = 2;

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
// Eight columns' bf16 pairs: the even input is the low half of each 32-bit lane, the odd the high.
inline void vload_bf16_pairs(const uint16_t* p, Vec& even, Vec& odd) {
  const __m256i pairs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  even = _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
  odd = _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(int32_t(0xFFFF0000u))));
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

// Two 32-blocks per step: weights sign-extended to int16 meet the int16 activations in
// vpmaddwd; each int32 lane (4 products, < 2^24) is exact, then lanes += lane * scale.
struct Q8Policy {
  static constexpr int kRows = kTileRows;
  using Row = Q8Row;
  using Acc = Vec;
  struct X {
    __m256i q[4];  // 16 int16 each
    float scales[2];
  };
  struct Wv {
    __m256i q[4];
    float scales[2];
  };
  static Row row(const Matrix& w, int32_t n, int32_t k) { return q8_row(w, n, k); }
  static int32_t num_steps(int32_t k) { return q8_padded_k(k) / 64; }
  static Acc zero() { return vzero(); }
  static X load_x(const Activations& a, int32_t m, int32_t step, int32_t k) {
    const int16_t* q = q8_x(a, m) + size_t(step) * 64;
    const float* scales = q8_x_scales(a, m, k) + size_t(step) * 2;
    X x;
    for (int i = 0; i < 4; ++i) x.q[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i * 16));
    x.scales[0] = scales[0];
    x.scales[1] = scales[1];
    return x;
  }
  static Wv load_w(Row w, int32_t step, int32_t k) {
    __builtin_prefetch(w.q + size_t(4) * size_t(q8_padded_k(k)) + size_t(step) * 64);
    Wv v;
    for (int i = 0; i < 4; ++i) {
      v.q[i] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.q + size_t(step) * 64 + i * 16)));
    }
    v.scales[0] = _cvtsh_ss(w.scales[size_t(step) * 2]);
    v.scales[1] = _cvtsh_ss(w.scales[size_t(step) * 2 + 1]);
    return v;
  }
  static Acc step(Acc acc, const X& x, const Wv& w) {
    for (int block = 0; block < 2; ++block) {
      const __m256i sums = _mm256_add_epi32(_mm256_madd_epi16(x.q[2 * block], w.q[2 * block]),
                                            _mm256_madd_epi16(x.q[2 * block + 1], w.q[2 * block + 1]));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(w.scales[block] * x.scales[block]), acc);
    }
    return acc;
  }
  static float finish(Acc acc, const Activations&, int32_t, Row, int32_t) { return vsum(acc); }
};

size_t packed_row_bytes(MatrixFormat format, int32_t k) {
  return format == MatrixFormat::kQ8 ? q8_packed_row_bytes(k) : 0;
}

void pack_rows(const float* x, size_t x_stride, int32_t num_rows, int32_t k, MatrixFormat format,
               uint8_t* packed, size_t packed_stride) {
  if (format != MatrixFormat::kQ8) return;
  for (int32_t m = 0; m < num_rows; ++m) pack_q8_row(x + size_t(m) * x_stride, k, packed + size_t(m) * packed_stride);
}

void matmul(const Activations& a, int32_t num_rows, int32_t k, const Matrix& w, int32_t n_begin,
            int32_t n_end, float* y, size_t y_stride, bool accumulate) {
  switch (w.format) {
    case MatrixFormat::kF32Panels: matmul_float_panels<PanelF32>(a, num_rows, k, w, n_begin, n_end, y, y_stride, accumulate); break;
    case MatrixFormat::kF16Panels: matmul_float_panels<PanelF16>(a, num_rows, k, w, n_begin, n_end, y, y_stride, accumulate); break;
    case MatrixFormat::kBf16Panels: matmul_float_panels<PanelBf16Pairs>(a, num_rows, k, w, n_begin, n_end, y, y_stride, accumulate); break;
    case MatrixFormat::kQ8: matmul_tiled<Q8Policy>(a, num_rows, k, w, n_begin, n_end, y, y_stride, accumulate); break;
    case MatrixFormat::kQ8Panels: break;  // never given: Model uses each kernel's own q8_format
  }
}

}  // namespace

const KernelTable& kernels_avx2() {
  static const KernelTable table{CD_KERNEL_AVX2, MatrixFormat::kQ8, packed_row_bytes, pack_rows, matmul, dot, dot_rows, softmax_numerators, sum_exp, swiglu, axpy_rows,
                                 nullptr, nullptr};
  return table;
}

}  // namespace conduit
