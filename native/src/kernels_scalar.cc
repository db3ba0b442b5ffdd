// Portable kernels: eight independent accumulators stand in for vector lanes, so the reduction
// order is fixed and the compiler may still vectorize them. Compiled with -ffp-contract=off, so a
// multiply-add is always two roundings on every CPU.
#include "dtype.h"
#include "kernels.h"

namespace conduit {
namespace {

constexpr int32_t kLanes = 8;
// Plain C++ has no registers to tile over: one row against a whole panel at a time.
constexpr int kPanelTileRows = 1;
constexpr int kPanelAccumulators = 8;
constexpr int kQ8TileRows = 1;
constexpr int kQ8TileVectors = 8;
constexpr int kQ8SingleRowVectors = 8;
struct Vec {
  float lane[kLanes];
};

inline Vec vzero() { return Vec{}; }
inline Vec vset1(float value) {
  Vec v;
  for (int32_t i = 0; i < kLanes; ++i) v.lane[i] = value;
  return v;
}
inline Vec vload_f32(const float* p) {
  Vec v;
  for (int32_t i = 0; i < kLanes; ++i) v.lane[i] = p[i];
  return v;
}
inline Vec vload_bf16(const uint16_t* p) {
  Vec v;
  for (int32_t i = 0; i < kLanes; ++i) v.lane[i] = conduit::bf16_to_f32(p[i]);
  return v;
}
inline Vec vload_f16(const uint16_t* p) {
  Vec v;
  for (int32_t i = 0; i < kLanes; ++i) v.lane[i] = conduit::f16_to_f32(p[i]);
  return v;
}
inline void vload_bf16_pairs(const uint16_t* p, Vec& even, Vec& odd) {
  for (int32_t i = 0; i < kLanes; ++i) {
    even.lane[i] = conduit::bf16_to_f32(p[2 * i]);
    odd.lane[i] = conduit::bf16_to_f32(p[2 * i + 1]);
  }
}
inline Vec vload_bf16_pair_input(const uint16_t* p, int32_t j) {
  Vec v;
  for (int32_t i = 0; i < kLanes; ++i) v.lane[i] = conduit::bf16_to_f32(p[2 * i + j]);
  return v;
}
inline void vstore(float* p, Vec v) {
  for (int32_t i = 0; i < kLanes; ++i) p[i] = v.lane[i];
}
inline Vec vfma(Vec a, Vec b, Vec acc) {
  for (int32_t i = 0; i < kLanes; ++i) acc.lane[i] += a.lane[i] * b.lane[i];
  return acc;
}
inline Vec vmul(Vec a, Vec b) {
  for (int32_t i = 0; i < kLanes; ++i) a.lane[i] *= b.lane[i];
  return a;
}
inline Vec vadd(Vec a, Vec b) {
  for (int32_t i = 0; i < kLanes; ++i) a.lane[i] += b.lane[i];
  return a;
}
inline Vec vsub(Vec a, Vec b) {
  for (int32_t i = 0; i < kLanes; ++i) a.lane[i] -= b.lane[i];
  return a;
}
inline Vec vdiv(Vec a, Vec b) {
  for (int32_t i = 0; i < kLanes; ++i) a.lane[i] /= b.lane[i];
  return a;
}
// As the SIMD instructions: the second operand when either is NaN.
inline Vec vmax(Vec a, Vec b) {
  for (int32_t i = 0; i < kLanes; ++i) a.lane[i] = a.lane[i] > b.lane[i] ? a.lane[i] : b.lane[i];
  return a;
}
inline Vec vmin(Vec a, Vec b) {
  for (int32_t i = 0; i < kLanes; ++i) a.lane[i] = a.lane[i] < b.lane[i] ? a.lane[i] : b.lane[i];
  return a;
}
inline Vec vselect_lt(Vec a, Vec b, Vec if_less, Vec otherwise) {
  for (int32_t i = 0; i < kLanes; ++i) if_less.lane[i] = a.lane[i] < b.lane[i] ? if_less.lane[i] : otherwise.lane[i];
  return if_less;
}
// 2^n for integral n in [-126, 127], from the exponent bits.
inline Vec vpow2(Vec n) {
  for (int32_t i = 0; i < kLanes; ++i) {
    const uint32_t bits = uint32_t(int32_t(n.lane[i]) + 127) << 23;
    __builtin_memcpy(&n.lane[i], &bits, sizeof bits);
  }
  return n;
}
struct IVec {
  int32_t lane[kLanes];
};
struct Q8Pairs {
  int16_t lane[2 * kLanes];
};
inline IVec ivzero() { return IVec{}; }
inline Q8Pairs vload_q8_pairs(const int8_t* p) {
  Q8Pairs w;
  for (int32_t i = 0; i < 2 * kLanes; ++i) w.lane[i] = p[i];
  return w;
}
inline IVec imadd_pairs(IVec acc, const int16_t* x_pair, const Q8Pairs& w) {
  for (int32_t i = 0; i < kLanes; ++i) {
    acc.lane[i] += int32_t(x_pair[0]) * w.lane[2 * i] + int32_t(x_pair[1]) * w.lane[2 * i + 1];
  }
  return acc;
}
inline Vec vcvt_i32(const IVec& v) {
  Vec out;
  for (int32_t i = 0; i < kLanes; ++i) out.lane[i] = float(v.lane[i]);
  return out;
}
inline float vsum(Vec v) {
  const float low = (v.lane[0] + v.lane[4]) + (v.lane[2] + v.lane[6]);
  const float high = (v.lane[1] + v.lane[5]) + (v.lane[3] + v.lane[7]);
  return low + high;
}
inline float sfma(float a, float b, float acc) { return acc + a * b; }

inline Vec vload_i8_f32(const int8_t* p) {
  Vec v;
  for (int32_t i = 0; i < kLanes; ++i) v.lane[i] = float(p[i]);
  return v;
}
inline Vec vload_u8_f32(const uint8_t* p) {
  Vec v;
  for (int32_t i = 0; i < kLanes; ++i) v.lane[i] = float(p[i]);
  return v;
}

// kQ4 code words (kernels.h): nibbles I of each column's word's bytes as 4 unsigned bytes.
struct Q4Words {
  uint32_t lane[kLanes];
};
struct Q4Quads {
  uint8_t lane[4 * kLanes];
};
inline Q4Words vload_q4_words(const uint8_t* p) {
  Q4Words words;
  __builtin_memcpy(words.lane, p, sizeof words.lane);
  return words;
}
template <int I>
inline Q4Quads q4_quads(const Q4Words& words) {
  Q4Quads w;
  for (int32_t i = 0; i < kLanes; ++i) {
    for (int32_t b = 0; b < 4; ++b) w.lane[4 * i + b] = uint8_t((words.lane[i] >> (8 * b + 4 * I)) & 0x0f);
  }
  return w;
}
inline IVec imadd_quads(IVec acc, const int8_t* x, const Q4Quads& w) {
  for (int32_t i = 0; i < kLanes; ++i) {
    for (int32_t b = 0; b < 4; ++b) acc.lane[i] += int32_t(x[b]) * w.lane[4 * i + b];
  }
  return acc;
}
// Q4_K's 6-bit scale and min of sub-block j for kLanes columns: their low nibbles' bytes and
// high bits' words (kernels.h, kQ4KPanels).
inline void q4k_scale_min(const uint8_t* low_nibbles, const uint32_t* high_bits, int32_t j, IVec* scale, IVec* min) {
  for (int32_t i = 0; i < kLanes; ++i) {
    const uint32_t high = high_bits[i] >> (4 * j);
    scale->lane[i] = int32_t((low_nibbles[i] & 0x0f) | ((high & 3) << 4));
    min->lane[i] = int32_t((low_nibbles[i] >> 4) | ((high & 12) << 2));
  }
}
inline IVec imul_add(IVec acc, const IVec& a, const IVec& b) {
  for (int32_t i = 0; i < kLanes; ++i) acc.lane[i] += a.lane[i] * b.lane[i];
  return acc;
}
inline IVec imul_add_small(IVec acc, const IVec& a, int32_t b) {
  for (int32_t i = 0; i < kLanes; ++i) acc.lane[i] += a.lane[i] * b;
  return acc;
}

#include "kernels_body.inc"
#include "kernels_q4.inc"
#include "kernels_q8k.inc"
#include "kernels_widened.inc"

}  // namespace

const KernelTable& kernels_scalar() {
  static const KernelTable table = widened_kernel_table(CD_KERNEL_SCALAR);
  return table;
}

}  // namespace conduit
