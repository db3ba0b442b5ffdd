// Portable kernels: eight independent accumulators stand in for vector lanes, so the reduction
// order is fixed and the compiler may still vectorize them. Compiled with -ffp-contract=off, so a
// multiply-add is always two roundings on every CPU.
#include "dtype.h"
#include "kernels.h"

namespace conduit {
namespace {

constexpr int32_t kLanes = 8;
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

}  // namespace

const KernelTable& kernels_scalar() {
  static const KernelTable table{CD_KERNEL_SCALAR, matmul, dot, axpy};
  return table;
}

}  // namespace conduit
