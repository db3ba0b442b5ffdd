// Portable kernels: eight independent accumulators stand in for vector lanes, so the reduction
// order is fixed and the compiler may still vectorize them. Compiled with -ffp-contract=off, so a
// multiply-add is always two roundings on every CPU.
#include "dtype.h"
#include "kernels.h"

namespace conduit {
namespace {

constexpr int32_t kLanes = 8;
// Plain C++ has no registers to tile over; one row at a time.
constexpr int kTileRows = 1;
constexpr int kPanelTileRows = 1;
constexpr int kPanelTileVectors = 1;
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
inline void vstore(float* p, Vec v) {
  for (int32_t i = 0; i < kLanes; ++i) p[i] = v.lane[i];
}
inline Vec vfma(Vec a, Vec b, Vec acc) {
  for (int32_t i = 0; i < kLanes; ++i) acc.lane[i] += a.lane[i] * b.lane[i];
  return acc;
}
inline float vsum(Vec v) {
  const float low = (v.lane[0] + v.lane[4]) + (v.lane[2] + v.lane[6]);
  const float high = (v.lane[1] + v.lane[5]) + (v.lane[3] + v.lane[7]);
  return low + high;
}
inline float sfma(float a, float b, float acc) { return acc + a * b; }

#include "kernels_body.inc"

// Two 32-blocks per step: each block's integer dot is exact, then scaled into one fp32 sum.
struct Q8Policy {
  static constexpr int kRows = kTileRows;
  using Row = Q8Row;
  using Acc = float;
  struct X {
    const int16_t* q;
    const float* scales;
  };
  using Wv = Q8Row;
  static Row row(const Matrix& w, int32_t n, int32_t k) { return q8_row(w, n, k); }
  static int32_t num_steps(int32_t k) { return q8_padded_k(k) / 64; }
  static Acc zero() { return 0.0f; }
  static X load_x(const Activations& a, int32_t m, int32_t step, int32_t k) {
    return X{q8_x(a, m) + size_t(step) * 64, q8_x_scales(a, m, k) + size_t(step) * 2};
  }
  static Wv load_w(Row w, int32_t step, int32_t) {
    return Wv{w.q + size_t(step) * 64, w.scales + size_t(step) * 2};
  }
  static Acc step(Acc acc, const X& x, const Wv& w) {
    for (int32_t block = 0; block < 2; ++block) {
      int32_t dot = 0;
      for (int32_t i = block * 32; i < block * 32 + 32; ++i) dot += int32_t(x.q[i]) * int32_t(w.q[i]);
      const float scale = conduit::f16_to_f32(w.scales[block]) * x.scales[block];
      acc = acc + float(dot) * scale;
    }
    return acc;
  }
  static float finish(Acc acc, const Activations&, int32_t, Row, int32_t) { return acc; }
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

const KernelTable& kernels_scalar() {
  static const KernelTable table{CD_KERNEL_SCALAR, MatrixFormat::kQ8, packed_row_bytes, pack_rows, matmul, dot, dot_rows, softmax_numerators, sum_exp, swiglu, axpy_rows,
                                 nullptr, nullptr};
  return table;
}

}  // namespace conduit
