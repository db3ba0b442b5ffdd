// AVX2 + FMA kernels: 8 fp32 lanes; float weight panels against fp32 activations (bf16 widens by
// shifting and masking, fp16 with F16C); int8 panels by vpmaddwd against int16 activations.
#include <immintrin.h>

#include "dtype.h"
#include "kernels.h"

namespace conduit {
namespace {

using Vec = __m256;
constexpr int32_t kLanes = 8;
// Float panels: 6 rows x 2 vectors of accumulators, one input's weights, a broadcast and the bf16
// mask fit the 16 ymm registers.
constexpr int kPanelTileRows = 6;
constexpr int kPanelAccumulators = 12;
// int8 panels: 3 rows x 2 vectors of accumulators and block sums; one row takes the whole panel,
// its eight block sums in registers and its accumulators (touched once per 32-block) spilled to
// L1, so a decode streams each panel once (in two passes of four vectors it streamed every other
// cache line twice: 125 M model, int8 batch-1 decode 144-169 -> 220 tok/s, 64% -> 83% of the
// read bound, Intel Xeon).
constexpr int kQ8TileRows = 3;
constexpr int kQ8TileVectors = 2;
constexpr int kQ8SingleRowVectors = 8;

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
// Input j of eight columns' bf16 pairs, loaded and widened in one step: the shift and the mask take
// their operand from memory, so no register holds the pairs.
inline Vec vload_bf16_pair_input(const uint16_t* p, int32_t j) {
  const __m256i pairs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm256_castsi256_ps(j == 0 ? _mm256_slli_epi32(pairs, 16) : _mm256_and_si256(pairs, _mm256_set1_epi32(int32_t(0xFFFF0000u))));
}
inline void vstore(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec vmul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec vadd(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec vsub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec vdiv(Vec a, Vec b) { return _mm256_div_ps(a, b); }
inline Vec vmax(Vec a, Vec b) { return _mm256_max_ps(a, b); }
inline Vec vmin(Vec a, Vec b) { return _mm256_min_ps(a, b); }
inline Vec vselect_lt(Vec a, Vec b, Vec if_less, Vec otherwise) {
  return _mm256_blendv_ps(otherwise, if_less, _mm256_cmp_ps(a, b, _CMP_LT_OQ));
}
inline Vec vpow2(Vec n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
using IVec = __m256i;
using Q8Pairs = __m256i;
inline IVec ivzero() { return _mm256_setzero_si256(); }
inline Q8Pairs vload_q8_pairs(const int8_t* p) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline IVec imadd_pairs(IVec acc, const int16_t* x_pair, Q8Pairs w) {
  int32_t bits;
  __builtin_memcpy(&bits, x_pair, sizeof bits);
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_set1_epi32(bits), w));
}
inline Vec vcvt_i32(IVec v) { return _mm256_cvtepi32_ps(v); }
inline Vec vfma(Vec a, Vec b, Vec acc) { return _mm256_fmadd_ps(a, b, acc); }
inline float vsum(Vec v) {
  __m128 quarter = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  quarter = _mm_add_ps(quarter, _mm_movehl_ps(quarter, quarter));
  quarter = _mm_add_ss(quarter, _mm_movehdup_ps(quarter));
  return _mm_cvtss_f32(quarter);
}
inline float sfma(float a, float b, float acc) { return __builtin_fmaf(a, b, acc); }

inline Vec vload_i8_f32(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline Vec vload_u8_f32(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// kQ4 code words (kernels.h): nibbles I of each column's word's bytes as 4 unsigned bytes;
// vpmaddubsw makes int16 pair sums (at most 2 * 15 * 127, no saturation), vpmaddwd the lane's sum.
using Q4Words = __m256i;
using Q4Quads = __m256i;
inline Q4Words vload_q4_words(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
template <int I>
inline Q4Quads q4_quads(Q4Words words) {
  return _mm256_and_si256(_mm256_srli_epi32(words, 4 * I), _mm256_set1_epi32(0x0f0f0f0f));
}
inline IVec imadd_quads(IVec acc, const int8_t* x, Q4Quads w) {
  int32_t bits;
  __builtin_memcpy(&bits, x, sizeof bits);
  const __m256i pair_sums = _mm256_maddubs_epi16(w, _mm256_set1_epi32(bits));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pair_sums, _mm256_set1_epi16(1)));
}
// Q4_K's 6-bit scale and min of sub-block j for kLanes columns: their low nibbles' bytes and
// high bits' words (kernels.h, kQ4KPanels).
inline void q4k_scale_min(const uint8_t* low_nibbles, const uint32_t* high_bits, int32_t j, IVec* scale, IVec* min) {
  const __m256i low = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(low_nibbles)));
  const __m256i high = _mm256_srl_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(high_bits)),
                                        _mm_cvtsi32_si128(4 * j));
  *scale = _mm256_or_si256(_mm256_and_si256(low, _mm256_set1_epi32(0x0f)),
                           _mm256_slli_epi32(_mm256_and_si256(high, _mm256_set1_epi32(3)), 4));
  *min = _mm256_or_si256(_mm256_srli_epi32(low, 4), _mm256_slli_epi32(_mm256_and_si256(high, _mm256_set1_epi32(12)), 2));
}
// acc + a * b per lane (int32, exact).
inline IVec imul_add(IVec acc, IVec a, IVec b) { return _mm256_add_epi32(acc, _mm256_mullo_epi32(a, b)); }
// acc + a * b per lane for 0 <= a < 2^15 and |b| < 2^15: a's high half is zero, so one vpmaddwd.
inline IVec imul_add_small(IVec acc, IVec a, int32_t b) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, _mm256_set1_epi32(b)));
}

#include "kernels_body.inc"
#include "kernels_q4.inc"
#include "kernels_q8k.inc"
#include "kernels_widened.inc"

}  // namespace

const KernelTable& kernels_avx2() {
  static const KernelTable table = widened_kernel_table(CD_KERNEL_AVX2);
  return table;
}

}  // namespace conduit
