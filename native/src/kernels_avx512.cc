// AVX-512 kernels (F, BW, VL, BF16, VNNI): 16 fp32 lanes. bf16 weights meet activations rounded
// to bf16 in vdpbf16ps, 32 products per instruction; int8 weight blocks, sign-extended to int16,
// meet int16 activations in vpdpwssd; fp32 and fp16 weights run fp32 FMAs.
#include <immintrin.h>

#include <type_traits>

#include "dtype.h"
#include "kernels.h"

namespace conduit {
namespace {

using Vec = __m512;
constexpr int32_t kLanes = 16;
// 6 x 4 accumulators plus operands fit the 32 zmm registers (measured: +8-10% GEMM over 4 x 4):
// a whole 64-column panel per tile, for bf16 (vdpbf16ps) and the other float formats alike.
constexpr int kPanelTileRows = 6;
constexpr int kPanelAccumulators = 24;
// int8 panels: 3 rows x 4 vectors of accumulators and as many block sums.
constexpr int kQ8TileRows = 3;
constexpr int kQ8TileVectors = 4;
constexpr int kQ8SingleRowVectors = 4;

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
inline Vec vmul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec vadd(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec vsub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec vdiv(Vec a, Vec b) { return _mm512_div_ps(a, b); }
inline Vec vmax(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline Vec vmin(Vec a, Vec b) { return _mm512_min_ps(a, b); }
inline Vec vselect_lt(Vec a, Vec b, Vec if_less, Vec otherwise) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), otherwise, if_less);
}
inline Vec vpow2(Vec n) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
using IVec = __m512i;
using Q8Pairs = __m512i;
inline IVec ivzero() { return _mm512_setzero_si512(); }
inline Q8Pairs vload_q8_pairs(const int8_t* p) {
  return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline IVec imadd_pairs(IVec acc, const int16_t* x_pair, Q8Pairs w) {
  int32_t bits;
  __builtin_memcpy(&bits, x_pair, sizeof bits);
  return _mm512_dpwssd_epi32(acc, _mm512_set1_epi32(bits), w);
}
inline Vec vcvt_i32(IVec v) { return _mm512_cvtepi32_ps(v); }
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

inline Vec vload_i8_f32(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline Vec vload_u8_f32(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// kQ4 code words (kernels.h): nibbles I of each column's word's bytes as 4 unsigned bytes,
// which vpdpbusd multiplies by 4 int8 activations, 64 products per instruction.
using Q4Words = __m512i;
using Q4Quads = __m512i;
inline Q4Words vload_q4_words(const uint8_t* p) { return _mm512_loadu_si512(p); }
template <int I>
inline Q4Quads q4_quads(Q4Words words) {
  return _mm512_and_si512(_mm512_srli_epi32(words, 4 * I), _mm512_set1_epi32(0x0f0f0f0f));
}
inline IVec imadd_quads(IVec acc, const int8_t* x, Q4Quads w) {
  int32_t bits;
  __builtin_memcpy(&bits, x, sizeof bits);
  return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(bits));
}
// Q4_K's 6-bit scale and min of sub-block j for kLanes columns: their low nibbles' bytes and
// high bits' words (kernels.h, kQ4KPanels).
inline void q4k_scale_min(const uint8_t* low_nibbles, const uint32_t* high_bits, int32_t j, IVec* scale, IVec* min) {
  const __m512i low = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(low_nibbles)));
  const __m512i high = _mm512_srl_epi32(_mm512_loadu_si512(high_bits), _mm_cvtsi32_si128(4 * j));
  *scale = _mm512_ternarylogic_epi32(_mm512_and_si512(low, _mm512_set1_epi32(0x0f)),
                                     _mm512_slli_epi32(high, 4), _mm512_set1_epi32(0x30), 0xf8);
  *min = _mm512_ternarylogic_epi32(_mm512_srli_epi32(low, 4), _mm512_slli_epi32(high, 2), _mm512_set1_epi32(0x30), 0xf8);
}
// acc + a * b per lane (int32, exact).
inline IVec imul_add(IVec acc, IVec a, IVec b) { return _mm512_add_epi32(acc, _mm512_mullo_epi32(a, b)); }
// acc + a * b per lane for 0 <= a < 2^15 and |b| < 2^15: a's high half is zero, so one vpdpwssd.
inline IVec imul_add_small(IVec acc, IVec a, int32_t b) { return _mm512_dpwssd_epi32(acc, a, _mm512_set1_epi32(b)); }

#include "kernels_body.inc"
#include "kernels_q4.inc"
#include "kernels_q8k.inc"

// One row against kQ8Panels on vpdpbusd (64 products an instruction) rather than vpdpwssd on
// weights sign-extended to int16 (32, and a vpmovsxbw per 32 weights): on Zen 4 a lone row's
// sign extensions and multiply-adds share the vector pipes and bound it in cache (76 GB/s).
// The row's int16 values x = 256 hi + lo are also packed as byte quads (q8_split_row: lo
// unsigned, hi signed), and each block's sum is the same exact int32 as vpdpwssd's:
//   sum = 256 ((w + 128) . hi - 128 sum(hi)) + lo . w,
// w + 128 (w ^ 0x80) being vpdpbusd's unsigned operand against hi, w the signed one against lo;
// the block's -32768 sum(hi) is packed with the quads. Two input pairs' rows of the panel
// interleave (vpunpck{l,h}wd) into the column quads vpdpbusd reads; that puts each 128-bit
// lane's columns 0-3 in one vector and 4-7 in the other, which a vpermt2d per 16 columns undoes
// before the block's scales. The rest is q8_panel_tile's: the same fp32 operations in the same
// order, so the bits are the multi-row tiles' and the other paths'.
// Unlike q8_panel_tile it fetches ahead only the blocks' scales, not every line: on Zen 4 the
// per-line fetches cost more CPU than they saved (int8 MoE batch-1 decode, 1 thread, CPU per step
// against q8_panel_tile's in the same process: 0.88x as fast with them, 1.15x without). Other
// CPUs unmeasured.

// The quads after q8_packed_row_bytes(k): lo bytes [padded k], hi bytes [padded k], then the
// blocks' int32 -32768 sum(hi) [padded k / 32].
size_t q8_split_row_bytes(int32_t k) {
  return q8_packed_row_bytes(k) + 2 * size_t(q8_padded_k(k)) + size_t(q8_padded_k(k) / 32) * sizeof(int32_t);
}

void q8_split_row(uint8_t* packed, int32_t k) {
  const int32_t padded_k = q8_padded_k(k);
  const int16_t* x = reinterpret_cast<const int16_t*>(packed);
  uint8_t* lo = packed + q8_packed_row_bytes(k);
  int8_t* hi = reinterpret_cast<int8_t*>(lo + padded_k);
  int32_t* corrections = reinterpret_cast<int32_t*>(lo + 2 * size_t(padded_k));
  for (int32_t block = 0; block < padded_k / 32; ++block) {
    int32_t hi_sum = 0;
    for (int32_t i = block * 32; i < block * 32 + 32; ++i) {
      lo[i] = uint8_t(x[i] & 0xFF);
      hi[i] = int8_t(x[i] >> 8);
      hi_sum += hi[i];
    }
    corrections[block] = -32768 * hi_sum;
  }
}

struct Q8SplitPanelRows {
  template <int R>
  struct Tile {
    static void run(const Activations& a, int32_t m0, int32_t k, const uint8_t* panel, int32_t num_columns, float* y,
                    size_t y_stride, bool accumulate) {
      if constexpr (R == 1) {
        run_one_row(a, m0, k, panel, num_columns, y, y_stride, accumulate);
      } else {
        Q8PanelRows<R>::run(a, m0, k, panel, num_columns, y, y_stride, accumulate);
      }
    }
  };

  static void run_one_row(const Activations& a, int32_t m, int32_t k, const uint8_t* panel, int32_t num_columns,
                          float* y, size_t y_stride, bool accumulate) {
    const int32_t num_blocks = (k + 31) / 32;
    const int32_t padded_k = q8_padded_k(k);
    const uint8_t* lo = a.packed + size_t(m) * a.packed_stride + q8_packed_row_bytes(k);
    const uint8_t* hi = lo + padded_k;
    const int32_t* corrections = reinterpret_cast<const int32_t*>(lo + 2 * size_t(padded_k));
    const float* x_scales = q8_x_scales(a, m, k);
    const __m512i sign_bits = _mm512_set1_epi8(int8_t(0x80));
    // vpunpcklwd leaves columns 0-3 of each 8-column lane of 32 columns, vpunpckhwd columns 4-7:
    // these pick columns 0-15, then 16-31, back in order from the two.
    const __m512i first_half = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i second_half = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    Vec acc[1][4] = {{vzero(), vzero(), vzero(), vzero()}};
    for (int32_t b = 0; b < num_blocks; ++b) {
      const uint8_t* block = panel + size_t(b) * kQ8PanelBlockBytes;
      __builtin_prefetch(block + kPanelColumns * 32 + kPanelPrefetchBytes);
      __builtin_prefetch(block + kPanelColumns * 32 + 64 + kPanelPrefetchBytes);
      // [32-column half][vpunpcklwd's columns, vpunpckhwd's]
      __m512i lo_sums[2][2], hi_sums[2][2];
      for (int h = 0; h < 2; ++h)
        for (int u = 0; u < 2; ++u) lo_sums[h][u] = hi_sums[h][u] = _mm512_setzero_si512();
      for (int32_t q = 0; q < 8; ++q) {
        const uint8_t* even = block + size_t(2 * q) * 2 * kPanelColumns;
        const uint8_t* odd = even + 2 * kPanelColumns;
        int32_t lo_bits, hi_bits;
        __builtin_memcpy(&lo_bits, lo + b * 32 + q * 4, sizeof lo_bits);
        __builtin_memcpy(&hi_bits, hi + b * 32 + q * 4, sizeof hi_bits);
        const __m512i lo_quad = _mm512_set1_epi32(lo_bits);
        const __m512i hi_quad = _mm512_set1_epi32(hi_bits);
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          __m512i even_pairs = _mm512_loadu_si512(even + h * 64);
          __m512i odd_pairs = _mm512_loadu_si512(odd + h * 64);
          // Each pair row loaded once (folded into both unpacks, it was loaded twice).
          asm("" : "+v"(even_pairs), "+v"(odd_pairs));
          const __m512i quads[2] = {_mm512_unpacklo_epi16(even_pairs, odd_pairs), _mm512_unpackhi_epi16(even_pairs, odd_pairs)};
#pragma GCC unroll 2
          for (int u = 0; u < 2; ++u) {
            lo_sums[h][u] = _mm512_dpbusd_epi32(lo_sums[h][u], lo_quad, quads[u]);
            hi_sums[h][u] = _mm512_dpbusd_epi32(hi_sums[h][u], _mm512_xor_si512(quads[u], sign_bits), hi_quad);
          }
        }
      }
      const __m512i correction = _mm512_set1_epi32(corrections[b]);
      IVec sums[4];
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        __m512i whole[2];
#pragma GCC unroll 2
        for (int u = 0; u < 2; ++u) {
          whole[u] = _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(hi_sums[h][u], 8), correction), lo_sums[h][u]);
        }
        sums[2 * h] = _mm512_permutex2var_epi32(whole[0], first_half, whole[1]);
        sums[2 * h + 1] = _mm512_permutex2var_epi32(whole[0], second_half, whole[1]);
      }
      const uint16_t* scales = reinterpret_cast<const uint16_t*>(block + kPanelColumns * 32);
      const Vec x_scale = vset1(x_scales[b]);
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) acc[0][v] = vfma(vcvt_i32(sums[v]), vmul(vload_f16(scales + v * kLanes), x_scale), acc[0][v]);
    }
    store_tile<1, 4>(acc, m, 0, num_columns, y, y_stride, accumulate);
  }
};

void matmul_q8_split_panels(const Activations& a, int32_t num_rows, int32_t k, const Matrix& w, int32_t n_begin,
                            int32_t n_end, float* y, size_t y_stride, bool accumulate) {
  const size_t panel_bytes = size_t((k + 31) / 32) * kQ8PanelBlockBytes;
  matmul_by_panels<Q8SplitPanelRows::Tile, kQ8TileRows>(
      a, num_rows, k, StoredPanels{static_cast<const uint8_t*>(w.data), panel_bytes}, n_begin, n_end, y, y_stride, accumulate);
}

// pack_q4k_row (kernels_q4.inc) 16 inputs at a time, bitwise its values: the same max, the same
// division, vcvtps2dq's nearest-even rounding and the same clamp; a permute puts each group of 8
// in the order 0 4 1 5 2 6 3 7. The scalar loop cost ~3 ns an input, a fifth of a batch-1 matmul's time.
void pack_q4k_row_avx512(const float* x, int32_t k, uint8_t* packed) {
  int8_t* q = reinterpret_cast<int8_t*>(packed);
  float* scales = reinterpret_cast<float*>(packed + k);
  int32_t* block_sums = reinterpret_cast<int32_t*>(scales + k / kQ4KBlockInputs);
  const __m512i order = _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
  const __m512 limit = _mm512_set1_ps(127.0f);
  for (int32_t s = 0; s < k / kQ4KBlockInputs; ++s) {
    const float* first = x + s * kQ4KBlockInputs;
    __m512 max_abs = _mm512_setzero_ps();
    for (int32_t i = 0; i < kQ4KBlockInputs; i += 16) max_abs = _mm512_max_ps(max_abs, _mm512_abs_ps(_mm512_loadu_ps(first + i)));
    const float scale = _mm512_reduce_max_ps(max_abs) / 127.0f;
    scales[s] = scale;
    if (scale == 0.0f) {
      __builtin_memset(q + s * kQ4KBlockInputs, 0, kQ4KBlockInputs);
      for (int32_t block = 0; block < kQ4KBlockInputs / 32; ++block) block_sums[s * 8 + block] = 0;
      continue;
    }
    const __m512 scale_vector = _mm512_set1_ps(scale);
    for (int32_t block = 0; block < kQ4KBlockInputs / 32; ++block) {
      __m512i sum = _mm512_setzero_si512();
      for (int32_t half = 0; half < 2; ++half) {
        const int32_t offset = block * 32 + half * 16;
        __m512 value = _mm512_div_ps(_mm512_loadu_ps(first + offset), scale_vector);
        value = _mm512_max_ps(_mm512_min_ps(value, limit), _mm512_sub_ps(_mm512_setzero_ps(), limit));
        const __m512i rounded = _mm512_permutexvar_epi32(order, _mm512_cvtps_epi32(value));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + s * kQ4KBlockInputs + offset), _mm512_cvtepi32_epi8(rounded));
        sum = _mm512_add_epi32(sum, rounded);
      }
      block_sums[s * 8 + block] = _mm512_reduce_add_epi32(sum);
    }
  }
}

constexpr int32_t kBf16Chunk = 32;

int32_t bf16_padded_k(int32_t k) { return (k + kBf16Chunk - 1) / kBf16Chunk * kBf16Chunk; }

// Activations rounded to bf16 (nearest even), zero-padded to whole 32-element chunks.
void pack_bf16_row(const float* x, int32_t k, uint8_t* packed) {
  uint16_t* out = reinterpret_cast<uint16_t*>(packed);
  for (int32_t i = 0; i < k; ++i) out[i] = conduit::f32_to_bf16(x[i]);
  for (int32_t i = k; i < bf16_padded_k(k); ++i) out[i] = 0;
}

// kBf16Panels weights: per pair of inputs, a broadcast activation pair meets the pairs of a
// panel's 64 columns (four zmm) in vdpbf16ps, so every output is one lane of one accumulator:
// a single chain over the pairs in order, whatever the tile's row count, with no horizontal sum.
// acc (zeroed here) gets rows x[0..R) against the panel's first num_pairs pairs.
template <int R, bool kPrefetch = true>
__attribute__((always_inline)) inline void panel_chains(const uint32_t* const (&x)[R], int32_t num_pairs,
                                                        const uint16_t* panel, Vec (&acc)[R][4]) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) acc[r][v] = vzero();
  for (int32_t p = 0; p < num_pairs; ++p) {
    const uint16_t* w = panel + size_t(p) * kPanelColumns * 2;
    if (kPrefetch) {
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) __builtin_prefetch(reinterpret_cast<const uint8_t*>(w + 32 * v) + kPanelPrefetchBytes);
    }
    __m512bh wv[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) wv[v] = (__m512bh)_mm512_loadu_si512(w + 32 * v);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512bh xr = (__m512bh)_mm512_set1_epi32(int32_t(x[r][p]));
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], xr, wv[v]);
    }
  }
}

template <int R>
__attribute__((always_inline)) inline void panel_tile(const Activations& a, int32_t m0, int32_t num_pairs,
                                                      const uint16_t* panel, int32_t num_columns, float* y,
                                                      size_t y_stride, bool accumulate) {
  const uint32_t* x[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) x[r] = reinterpret_cast<const uint32_t*>(a.packed + size_t(m0 + r) * a.packed_stride);
  Vec acc[R][4];
  panel_chains<R>(x, num_pairs, panel, acc);
  store_tile<R, 4>(acc, m0, 0, num_columns, y, y_stride, accumulate);
}

template <int R>
struct Bf16DotRows {
  static void run(const Activations& a, int32_t m0, int32_t k, const uint8_t* panel, int32_t num_columns, float* y,
                  size_t y_stride, bool accumulate) {
    panel_tile<R>(a, m0, (k + 1) / 2, reinterpret_cast<const uint16_t*>(panel), num_columns, y, y_stride, accumulate);
  }
};

void matmul_bf16_dot_panels(const Activations& a, int32_t num_rows, int32_t k, const Matrix& w, int32_t n_begin,
                            int32_t n_end, float* y, size_t y_stride, bool accumulate) {
  const size_t panel_bytes = size_t((k + 1) / 2) * kPanelColumns * 2 * sizeof(uint16_t);
  matmul_by_panels<Bf16DotRows, kPanelTileRows>(a, num_rows, k, StoredPanels{static_cast<const uint8_t*>(w.data), panel_bytes},
                                                n_begin, n_end, y, y_stride, accumulate);
}

// A row-parallel matmul's segments (kernels.h) in one pass, R rows against one panel of each:
// the eight chains of an output run one after another and meet in the tree as they finish, the
// pending sums in an L1 tile (3 x R x 64 floats) instead of partials a whole matmul apart that a
// second pass adds. Each chain is panel_chains' and each add the tree's, in its order, so the bits
// are those of matmul per segment and then the tree. A segment's panel is read again for every
// row tile from L2, never streamed from memory ahead of use, so its chains skip the prefetch
// (measured on Zen 4: +1 % with it off, within the noise).
struct SummedBf16Segments {
  const uint8_t* const* packed;
  size_t packed_stride;
  const int32_t* segment_k;
  const Matrix* segments;
};

template <int R>
__attribute__((noinline)) void summed_segments_tile(const SummedBf16Segments& s, int32_t m0, int32_t panel,
                                                    int32_t num_columns, float* y, size_t y_stride, bool accumulate) {
  static_assert(kSummedSegments == 8, "the tree below combines eight segments");
  alignas(64) float pending[3][R][kPanelColumns];  // sums waiting for their sibling
  Vec acc[R][4];
  const auto keep = [&](int node) __attribute__((always_inline)) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) vstore(pending[node][r] + v * kLanes, acc[r][v]);
  };
  // pending[into] = pending[into] + acc (from = -1) or + pending[from].
  const auto add_into = [&](int into, int from) __attribute__((always_inline)) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) {
        const Vec sum = vadd(vload_f32(pending[into][r] + v * kLanes), from < 0 ? acc[r][v] : vload_f32(pending[from][r] + v * kLanes));
        vstore(pending[into][r] + v * kLanes, sum);
      }
  };
  for (int32_t segment = 0; segment < kSummedSegments; ++segment) {
    const int32_t num_pairs = (s.segment_k[segment] + 1) / 2;
    const uint16_t* weights = static_cast<const uint16_t*>(s.segments[segment].data) + size_t(panel) * size_t(num_pairs) * kPanelColumns * 2;
    const uint32_t* x[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) x[r] = reinterpret_cast<const uint32_t*>(s.packed[segment] + size_t(m0 + r) * s.packed_stride);
    panel_chains<R, false>(x, num_pairs, weights, acc);
    switch (segment) {
      case 0: keep(0); break;                          // c0
      case 1: add_into(0, -1); break;                  // c0 + c1
      case 2: keep(1); break;                          // c2
      case 3: add_into(1, -1); add_into(0, 1); break;  // (c0 + c1) + (c2 + c3)
      case 4: keep(1); break;                          // c4
      case 5: add_into(1, -1); break;                  // c4 + c5
      case 6: keep(2); break;                          // c6
      default:
        // ((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7)), then into y.
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
          for (int v = 0; v < 4; ++v) {
            const Vec right = vadd(vload_f32(pending[1][r] + v * kLanes), vadd(vload_f32(pending[2][r] + v * kLanes), acc[r][v]));
            acc[r][v] = vadd(vload_f32(pending[0][r] + v * kLanes), right);
          }
        store_tile<R, 4>(acc, m0, 0, num_columns, y, y_stride, accumulate);
        break;
    }
  }
}

void matmul_summed_bf16_segments(const uint8_t* const* packed, size_t packed_stride, const int32_t* segment_k,
                                 const Matrix* segments, int32_t num_rows, int32_t n_begin, int32_t n_end, float* y,
                                 size_t y_stride, bool accumulate) {
  const SummedBf16Segments s{packed, packed_stride, segment_k, segments};
  for (int32_t n0 = n_begin; n0 < n_end; n0 += kPanelColumns) {
    const int32_t num_columns = n_end - n0 < kPanelColumns ? n_end - n0 : kPanelColumns;
    float* y_panel = y + n0;
    const int32_t panel = n0 / kPanelColumns;
    int32_t m = 0;
    for (; m + kPanelTileRows <= num_rows; m += kPanelTileRows) summed_segments_tile<kPanelTileRows>(s, m, panel, num_columns, y_panel, y_stride, accumulate);
    switch (num_rows - m) {
      case 5: summed_segments_tile<5>(s, m, panel, num_columns, y_panel, y_stride, accumulate); break;
      case 4: summed_segments_tile<4>(s, m, panel, num_columns, y_panel, y_stride, accumulate); break;
      case 3: summed_segments_tile<3>(s, m, panel, num_columns, y_panel, y_stride, accumulate); break;
      case 2: summed_segments_tile<2>(s, m, panel, num_columns, y_panel, y_stride, accumulate); break;
      case 1: summed_segments_tile<1>(s, m, panel, num_columns, y_panel, y_stride, accumulate); break;
      default: break;
    }
  }
}

// Sixteen keys' dot products at once (attention's scores): each key accumulates its chunks in
// order in its own register, then one transposing tree sums all sixteen registers' lanes, every
// key's lanes in the same pattern whatever its place in the group or the group's size. A third of
// the shuffles and adds of sixteen vsum calls.
inline Vec sum_halves_of_pair(Vec a, Vec b) {  // low 256 bits: a's halves summed; high: b's
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}

inline Vec sum_quarters_of_pairs(Vec ab, Vec cd) {  // 128-bit quarters: a, b, c, d
  return _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
}

inline Vec transpose_sum16(const Vec (&acc)[16]) {
  Vec quarters[4];
  for (int g = 0; g < 4; ++g) {
    quarters[g] = sum_quarters_of_pairs(sum_halves_of_pair(acc[4 * g], acc[4 * g + 1]),
                                        sum_halves_of_pair(acc[4 * g + 2], acc[4 * g + 3]));
  }
  // Per quarter q: keys q and 4 + q (then 8 + q, 12 + q), lanes 0 + 2 and 1 + 3.
  const Vec low = _mm512_add_ps(_mm512_unpacklo_ps(quarters[0], quarters[1]), _mm512_unpackhi_ps(quarters[0], quarters[1]));
  const Vec high = _mm512_add_ps(_mm512_unpacklo_ps(quarters[2], quarters[3]), _mm512_unpackhi_ps(quarters[2], quarters[3]));
  const Vec sums = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(low), _mm512_castps_pd(high))),
                                 _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(low), _mm512_castps_pd(high))));
  // Lane 4q + j holds key q + 4j.
  const __m512i key_order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(key_order, sums);
}

template <typename W>
void dot_rows16(const float* a, const typename W::Element* rows, int32_t num_rows, int32_t n, float* out) {
  for (int32_t first = 0; first < num_rows; first += 16) {
    const int32_t count = num_rows - first < 16 ? num_rows - first : 16;
    const typename W::Element* group = rows + size_t(first) * size_t(n);
    Vec acc[16];
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) acc[r] = vzero();
    for (int32_t i = 0; i < n; i += kLanes) {
      const Vec q = vload_f32(a + i);
#pragma GCC unroll 16
      for (int r = 0; r < 16; ++r) {
        if (r < count) acc[r] = vfma(q, W::load(group + size_t(r) * size_t(n) + i), acc[r]);
      }
    }
    _mm512_mask_storeu_ps(out + first, __mmask16((1u << count) - 1), transpose_sum16(acc));
  }
}

// Head dims that are not whole vectors take the one-key-at-a-time kernel.
void dot_rows_grouped(const float* a, const void* rows, cd_dtype dtype, int32_t num_rows, int32_t n, float* out) {
  if (n % kLanes != 0) {
    dot_rows(a, rows, dtype, num_rows, n, out);
    return;
  }
  switch (dtype) {
    case CD_DTYPE_BF16: dot_rows16<WeightBf16>(a, static_cast<const uint16_t*>(rows), num_rows, n, out); break;
    case CD_DTYPE_F16: dot_rows16<WeightF16>(a, static_cast<const uint16_t*>(rows), num_rows, n, out); break;
    default: dot_rows16<WeightF32>(a, static_cast<const float*>(rows), num_rows, n, out); break;
  }
}

// Attention over a kBf16Pairs cache. The query and the softmax numerators are each split into two
// bf16 halves, x = high + low with low = bf16(x - high), and both halves meet the cache: about 16
// bits of mantissa instead of 8, which keeps the tail of the logit error well inside the bf16
// bound on long prompts (one draw: 2.01e-2 rounded once, 1.39e-2 split), at two vdpbf16ps per
// load instead of one.

// fp32 -> bf16 high and low halves, nearest even, 16 at a time (the last chunk masked).
void split_to_bf16(const float* x, int32_t n, uint16_t* high, uint16_t* low) {
  for (int32_t i = 0; i < n; i += 16) {
    const __mmask16 valid = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    const Vec value = _mm512_maskz_loadu_ps(valid, x + i);
    const __m256bh rounded = _mm512_cvtneps_pbh(value);
    const Vec widened = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)rounded), 16));
    _mm256_mask_storeu_epi16(high + i, valid, (__m256i)rounded);
    _mm256_mask_storeu_epi16(low + i, valid, (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(value, widened)));
  }
}

// Scores: per group of 16 keys, the broadcast query pair's halves meet 16 keys' pair in
// vdpbf16ps, so the scores land one per lane with no horizontal sum. Each group runs two chains
// (even and odd pairs, summed at the end); up to four groups interleave, which changes no value,
// only how many chains are in flight.
template <int G>
__attribute__((always_inline)) inline void score_groups(const uint32_t* q_high, const uint32_t* q_low,
                                                        const uint16_t* const* groups, size_t pair_stride,
                                                        int32_t num_pairs, float* scores) {
  Vec even[G], odd[G];
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) even[g] = odd[g] = vzero();
  int32_t d = 0;
  for (; d + 2 <= num_pairs; d += 2) {
    const __m512bh high_even = (__m512bh)_mm512_set1_epi32(int32_t(q_high[d]));
    const __m512bh low_even = (__m512bh)_mm512_set1_epi32(int32_t(q_low[d]));
    const __m512bh high_odd = (__m512bh)_mm512_set1_epi32(int32_t(q_high[d + 1]));
    const __m512bh low_odd = (__m512bh)_mm512_set1_epi32(int32_t(q_low[d + 1]));
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const __m512bh keys_even = (__m512bh)_mm512_loadu_si512(groups[g] + size_t(d) * pair_stride);
      const __m512bh keys_odd = (__m512bh)_mm512_loadu_si512(groups[g] + size_t(d + 1) * pair_stride);
      even[g] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(even[g], high_even, keys_even), low_even, keys_even);
      odd[g] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(odd[g], high_odd, keys_odd), low_odd, keys_odd);
    }
  }
  if (d < num_pairs) {
    const __m512bh high_last = (__m512bh)_mm512_set1_epi32(int32_t(q_high[d]));
    const __m512bh low_last = (__m512bh)_mm512_set1_epi32(int32_t(q_low[d]));
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const __m512bh keys = (__m512bh)_mm512_loadu_si512(groups[g] + size_t(d) * pair_stride);
      even[g] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(even[g], high_last, keys), low_last, keys);
    }
  }
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) vstore(scores + 16 * g, _mm512_add_ps(even[g], odd[g]));
}

void score_key_groups_of_head(const float* q, uint16_t* q_scratch, const uint16_t* const* key_groups, int32_t num_groups,
                              size_t key_pair_stride, int32_t head_dim, float* scores) {
  split_to_bf16(q, head_dim, q_scratch, q_scratch + head_dim);
  const uint32_t* q_high = reinterpret_cast<const uint32_t*>(q_scratch);
  const uint32_t* q_low = reinterpret_cast<const uint32_t*>(q_scratch + head_dim);
  const int32_t num_pairs = head_dim / 2;
  int32_t g = 0;
  // Eight groups' 16 chains keep vdpbf16ps busy through its latency; a key's sum is the same in
  // any group count.
  for (; g + 8 <= num_groups; g += 8) {
    score_groups<8>(q_high, q_low, key_groups + g, key_pair_stride, num_pairs, scores + 16 * g);
  }
  for (; g + 4 <= num_groups; g += 4) {
    score_groups<4>(q_high, q_low, key_groups + g, key_pair_stride, num_pairs, scores + 16 * g);
  }
  for (; g < num_groups; ++g) score_groups<1>(q_high, q_low, key_groups + g, key_pair_stride, num_pairs, scores + 16 * g);
}

// Value sums: the halves of a broadcast pair of numerators meet 16 dims of a pair of slots in
// vdpbf16ps. Each lane sums its pairs in order in two chains (even and odd pairs), added at the
// end. H query heads of one kv head go together: each pair of slots is loaded once for all, and
// the H x V x 2 chains overlap vdpbf16ps's latency (a head of 32 dims alone has only four).
// A lane's sums are the same whatever H and V.
template <int H, int V>
__attribute__((always_inline)) inline void sum_value_dims(const uint32_t* const (&prob_high)[H],
                                                          const uint32_t* const (&prob_low)[H],
                                                          const uint16_t* const* groups,
                                                          int32_t pair_begin, int32_t pair_end, __mmask32 first_mask,
                                                          __mmask32 last_mask, int32_t head_dim, int32_t dim,
                                                          float* out) {
  Vec even[H][V], odd[H][V];
#pragma GCC unroll 4
  for (int h = 0; h < H; ++h)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) even[h][v] = odd[h][v] = vzero();
  const auto add_pair = [&](Vec(&acc)[H][V], int32_t j) __attribute__((always_inline)) {
    const uint16_t* pair = groups[j / 8] + size_t(j % 8) * 2 * size_t(head_dim) + size_t(dim) * 2;
    const __mmask32 mask = j == pair_begin ? first_mask : j == pair_end - 1 ? last_mask : __mmask32(~0u);
    __m512bh values[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) values[v] = (__m512bh)_mm512_maskz_loadu_epi16(mask, pair + 32 * v);
#pragma GCC unroll 4
    for (int h = 0; h < H; ++h) {
      const __m512bh high = (__m512bh)_mm512_set1_epi32(int32_t(prob_high[h][j]));
      const __m512bh low = (__m512bh)_mm512_set1_epi32(int32_t(prob_low[h][j]));
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[h][v] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(acc[h][v], high, values[v]), low, values[v]);
    }
  };
  int32_t j = pair_begin;
  for (; j + 2 <= pair_end; j += 2) {
    add_pair(even, j);
    add_pair(odd, j + 1);
  }
  if (j < pair_end) add_pair(even, j);
#pragma GCC unroll 4
  for (int h = 0; h < H; ++h)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) vstore(out + size_t(h) * size_t(head_dim) + dim + 16 * v, _mm512_add_ps(even[h][v], odd[h][v]));
}

// The visible pairs [pair_begin, pair_end) and the masks of their half-visible ends.
struct VisiblePairs {
  int32_t begin;
  int32_t end;
  __mmask32 first_mask;
  __mmask32 last_mask;
};

inline VisiblePairs visible_pairs(int32_t skip, int32_t num_visible) {
  // A half-visible pair weighs its other slot by zero and does not load it (masked lanes: within
  // a pair's 32 bf16 lanes, even lanes hold the even slot, odd lanes the odd one).
  VisiblePairs pairs{skip / 2, (skip + num_visible + 1) / 2, __mmask32(~0u), __mmask32(~0u)};
  if (skip % 2 == 1) pairs.first_mask = __mmask32(0xAAAAAAAAu);
  if ((skip + num_visible) % 2 == 1) pairs.last_mask = __mmask32(0x55555555u);
  if (pairs.end - pairs.begin == 1) pairs.first_mask = pairs.last_mask = pairs.first_mask & pairs.last_mask;
  return pairs;
}

// A head's numerators as bf16 halves in scratch (high at [0, 2 * pairs.end), low right after,
// indexed like the numerators), a half-visible pair's other slot weighed zero.
inline void split_numerators(const float* numerators, int32_t skip, int32_t num_visible, const VisiblePairs& pairs,
                             uint16_t* scratch, const uint32_t** prob_high, const uint32_t** prob_low) {
  uint16_t* high = scratch;
  uint16_t* low = scratch + 2 * pairs.end;
  split_to_bf16(numerators + 2 * pairs.begin, 2 * (pairs.end - pairs.begin), high + 2 * pairs.begin, low + 2 * pairs.begin);
  if (skip % 2 == 1) high[skip - 1] = low[skip - 1] = 0;
  if ((skip + num_visible) % 2 == 1) high[skip + num_visible] = low[skip + num_visible] = 0;
  *prob_high = reinterpret_cast<const uint32_t*>(high);
  *prob_low = reinterpret_cast<const uint32_t*>(low);
}

template <int H>
void sum_value_groups_of_heads(const float* numerators, size_t numerators_stride, int32_t skip, int32_t num_visible,
                               uint16_t* probs_scratch, const uint16_t* const* value_groups, int32_t head_dim,
                               float* out) {
  const VisiblePairs pairs = visible_pairs(skip, num_visible);
  const uint32_t* prob_high[H];
  const uint32_t* prob_low[H];
  for (int h = 0; h < H; ++h) {
    split_numerators(numerators + size_t(h) * numerators_stride, skip, num_visible, pairs,
                     probs_scratch + size_t(h) * 4 * size_t(pairs.end), &prob_high[h], &prob_low[h]);
  }
  const auto sum_dims = [&](auto vectors, int32_t dim) __attribute__((always_inline)) {
    sum_value_dims<H, decltype(vectors)::value>(prob_high, prob_low, value_groups, pairs.begin, pairs.end,
                                                pairs.first_mask, pairs.last_mask, head_dim, dim, out);
  };
  int32_t dim = 0;
  for (; dim + 64 <= head_dim; dim += 64) sum_dims(std::integral_constant<int, 4>{}, dim);
  if (dim + 32 <= head_dim) {
    sum_dims(std::integral_constant<int, 2>{}, dim);
    dim += 32;
  }
  for (; dim < head_dim; dim += 16) sum_dims(std::integral_constant<int, 1>{}, dim);
}

// Two query heads against the same groups: each key pair is loaded once for both (a kv head's
// keys outgrow L1 at a few hundred positions, so a head at a time reads them twice from L2).
// Every score is the chain score_groups builds, so the values are the same.
template <int G>
__attribute__((always_inline)) inline void score_groups_two_heads(const uint32_t* const (&q_high)[2],
                                                                  const uint32_t* const (&q_low)[2],
                                                                  const uint16_t* const* groups, size_t pair_stride,
                                                                  int32_t num_pairs, float* scores, size_t scores_stride) {
  Vec even[2][G], odd[2][G];
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h)
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) even[h][g] = odd[h][g] = vzero();
  int32_t d = 0;
  for (; d + 2 <= num_pairs; d += 2) {
    __m512bh high_even[2], low_even[2], high_odd[2], low_odd[2];
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      high_even[h] = (__m512bh)_mm512_set1_epi32(int32_t(q_high[h][d]));
      low_even[h] = (__m512bh)_mm512_set1_epi32(int32_t(q_low[h][d]));
      high_odd[h] = (__m512bh)_mm512_set1_epi32(int32_t(q_high[h][d + 1]));
      low_odd[h] = (__m512bh)_mm512_set1_epi32(int32_t(q_low[h][d + 1]));
    }
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const __m512bh keys_even = (__m512bh)_mm512_loadu_si512(groups[g] + size_t(d) * pair_stride);
      const __m512bh keys_odd = (__m512bh)_mm512_loadu_si512(groups[g] + size_t(d + 1) * pair_stride);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        even[h][g] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(even[h][g], high_even[h], keys_even), low_even[h], keys_even);
        odd[h][g] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(odd[h][g], high_odd[h], keys_odd), low_odd[h], keys_odd);
      }
    }
  }
  if (d < num_pairs) {
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const __m512bh keys = (__m512bh)_mm512_loadu_si512(groups[g] + size_t(d) * pair_stride);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m512bh high_last = (__m512bh)_mm512_set1_epi32(int32_t(q_high[h][d]));
        const __m512bh low_last = (__m512bh)_mm512_set1_epi32(int32_t(q_low[h][d]));
        even[h][g] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(even[h][g], high_last, keys), low_last, keys);
      }
    }
  }
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h)
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) vstore(scores + size_t(h) * scores_stride + 16 * g, _mm512_add_ps(even[h][g], odd[h][g]));
}

// vdpbf16ps needs each head's query split: pairs of heads share their key loads
// (q_scratch holds 4 x head_dim), an odd last head goes alone.
void score_key_groups(const float* q, int32_t num_heads, uint16_t* q_scratch, const uint16_t* const* key_groups,
                      int32_t num_groups, size_t key_pair_stride, int32_t head_dim, float* scores, size_t scores_stride) {
  const int32_t num_pairs = head_dim / 2;
  int32_t h = 0;
  for (; h + 2 <= num_heads; h += 2) {
    uint16_t* scratch[2] = {q_scratch, q_scratch + 2 * size_t(head_dim)};
    const uint32_t* q_high[2];
    const uint32_t* q_low[2];
    for (int i = 0; i < 2; ++i) {
      split_to_bf16(q + size_t(h + i) * head_dim, head_dim, scratch[i], scratch[i] + head_dim);
      q_high[i] = reinterpret_cast<const uint32_t*>(scratch[i]);
      q_low[i] = reinterpret_cast<const uint32_t*>(scratch[i] + head_dim);
    }
    float* head_scores = scores + size_t(h) * scores_stride;
    int32_t g = 0;
    for (; g + 4 <= num_groups; g += 4) {
      score_groups_two_heads<4>(q_high, q_low, key_groups + g, key_pair_stride, num_pairs, head_scores + 16 * g, scores_stride);
    }
    for (; g < num_groups; ++g) {
      score_groups_two_heads<1>(q_high, q_low, key_groups + g, key_pair_stride, num_pairs, head_scores + 16 * g, scores_stride);
    }
  }
  if (h < num_heads) {
    score_key_groups_of_head(q + size_t(h) * head_dim, q_scratch, key_groups, num_groups, key_pair_stride, head_dim,
                             scores + size_t(h) * scores_stride);
  }
}

// Two heads at a time: probs_scratch holds both heads' halves (KernelTable::sum_value_groups).
void sum_value_groups(const float* numerators, size_t numerators_stride, int32_t num_heads, int32_t skip,
                      int32_t num_visible, uint16_t* probs_scratch, const uint16_t* const* value_groups,
                      int32_t head_dim, float* out) {
  int32_t h = 0;
  for (; h + 2 <= num_heads; h += 2) {
    sum_value_groups_of_heads<2>(numerators + size_t(h) * numerators_stride, numerators_stride, skip, num_visible,
                                 probs_scratch, value_groups, head_dim, out + size_t(h) * head_dim);
  }
  if (h < num_heads) {
    sum_value_groups_of_heads<1>(numerators + size_t(h) * numerators_stride, numerators_stride, skip, num_visible,
                                 probs_scratch, value_groups, head_dim, out + size_t(h) * head_dim);
  }
}

// vdpbf16ps reads every format as stored.
size_t no_panel_scratch(MatrixFormat, int32_t, int32_t) { return 0; }

size_t packed_row_bytes(MatrixFormat format, int32_t k) {
  if (format == MatrixFormat::kQ8Panels) return q8_split_row_bytes(k);
  if (format == MatrixFormat::kQ4Panels) return q4_int8_packed_row_bytes(k);
  if (format == MatrixFormat::kQ4KPanels) return q4k_packed_row_bytes(k);
  if (format == MatrixFormat::kQ8KPanels) return q4_packed_row_bytes(k);
  if (format == MatrixFormat::kBf16Panels) return size_t(bf16_padded_k(k)) * 2;
  return 0;
}

void pack_rows(const float* x, size_t x_stride, int32_t num_rows, int32_t k, MatrixFormat format,
               uint8_t* packed, size_t packed_stride) {
  for (int32_t m = 0; m < num_rows; ++m) {
    const float* row = x + size_t(m) * x_stride;
    uint8_t* out = packed + size_t(m) * packed_stride;
    if (format == MatrixFormat::kQ8Panels) {
      pack_q8_row(row, k, out);
      q8_split_row(out, k);
    }
    if (format == MatrixFormat::kQ4Panels) pack_q4_int8_row(row, k, out);
    if (format == MatrixFormat::kQ4KPanels) pack_q4k_row_avx512(row, k, out);
    if (format == MatrixFormat::kQ8KPanels) pack_q4_row(row, k, out);
    if (format == MatrixFormat::kBf16Panels) pack_bf16_row(row, k, out);
  }
}

void matmul(const Activations& a, int32_t num_rows, int32_t k, const Matrix& w, int32_t n_begin,
            int32_t n_end, float* y, size_t y_stride, bool accumulate) {
  switch (w.format) {
    case MatrixFormat::kF32Panels: matmul_float_panels<PanelF32>(a, num_rows, k, w, n_begin, n_end, y, y_stride, accumulate); break;
    case MatrixFormat::kF16Panels: matmul_float_panels<PanelF16>(a, num_rows, k, w, n_begin, n_end, y, y_stride, accumulate); break;
    case MatrixFormat::kBf16Panels: matmul_bf16_dot_panels(a, num_rows, k, w, n_begin, n_end, y, y_stride, accumulate); break;
    case MatrixFormat::kQ8Panels: matmul_q8_split_panels(a, num_rows, k, w, n_begin, n_end, y, y_stride, accumulate); break;
    case MatrixFormat::kQ4Panels: matmul_q4_panels(a, num_rows, k, w, n_begin, n_end, y, y_stride, accumulate); break;
    case MatrixFormat::kQ4KPanels: matmul_q4k_panels(a, num_rows, k, w, n_begin, n_end, y, y_stride, accumulate); break;
    case MatrixFormat::kQ8KPanels: matmul_q8k_panels(a, num_rows, k, w, n_begin, n_end, y, y_stride, accumulate); break;
  }
}

}  // namespace

const KernelTable& kernels_avx512() {
  static const KernelTable table{CD_KERNEL_AVX512, packed_row_bytes, no_panel_scratch, pack_rows, matmul, dot, dot_rows_grouped, argmax, softmax_numerators, softcap,
                                 sum_exp, swiglu, gelu_tanh_gate, clamped_swiglu, axpy_rows, add_weighted_rows, score_key_groups, sum_value_groups,
                                 matmul_summed_bf16_segments};
  return table;
}

}  // namespace conduit
