// Portable conversions between fp32 and the 16-bit storage dtypes. Used at load (weight
// conversion), when writing the KV cache and by the scalar kernels; the SIMD kernels widen with
// their own instructions, which give the same exact results (widening is lossless).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "conduit.h"

namespace conduit {

// Internal linkage throughout: kernel translation units compiled for AVX-512 include this header
// too, and a shared inline copy could carry AVX-512 instructions into the scalar path.

static inline size_t dtype_bytes(cd_dtype dtype) { return dtype == CD_DTYPE_F32 ? 4 : 2; }

static inline float bits_to_f32(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

static inline uint32_t f32_to_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

static inline float bf16_to_f32(uint16_t bits) { return bits_to_f32(uint32_t(bits) << 16); }

// Round to nearest even; NaN stays NaN.
static inline uint16_t f32_to_bf16(float value) {
  uint32_t bits = f32_to_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

static inline float f16_to_f32(uint16_t half) {
  const uint32_t sign = uint32_t(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  const uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0x1f) return bits_to_f32(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return bits_to_f32(sign | ((exponent + 112) << 23) | (mantissa << 13));
  // Subnormal (or zero): mantissa * 2^-24, exact in fp32.
  const float magnitude = float(mantissa) * 5.9604644775390625e-8f;
  return sign ? -magnitude : magnitude;
}

// Round to nearest even, overflow to infinity, NaN stays NaN.
static inline uint16_t f32_to_f16(float value) {
  const uint32_t bits = f32_to_bits(value);
  const uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return uint16_t(sign | 0x7e00u);
  if (magnitude >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds past 65504
  if (magnitude < 0x38800000u) {
    // Subnormal half: round magnitude / 2^-24 to an integer, ties to even.
    const float scaled = bits_to_f32(magnitude) * 16777216.0f;
    uint32_t integer = uint32_t(scaled);
    const float remainder = scaled - float(integer);
    if (remainder > 0.5f || (remainder == 0.5f && (integer & 1u))) ++integer;
    return uint16_t(sign | integer);
  }
  uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
  return uint16_t(sign | ((rounded - 0x38000000u) >> 13));
}

static inline float load_as_f32(const void* data, cd_dtype dtype, size_t index) {
  switch (dtype) {
    case CD_DTYPE_BF16: return bf16_to_f32(static_cast<const uint16_t*>(data)[index]);
    case CD_DTYPE_F16: return f16_to_f32(static_cast<const uint16_t*>(data)[index]);
    default: return static_cast<const float*>(data)[index];
  }
}

static inline void store_from_f32(void* data, cd_dtype dtype, size_t index, float value) {
  switch (dtype) {
    case CD_DTYPE_BF16: static_cast<uint16_t*>(data)[index] = f32_to_bf16(value); break;
    case CD_DTYPE_F16: static_cast<uint16_t*>(data)[index] = f32_to_f16(value); break;
    default: static_cast<float*>(data)[index] = value; break;
  }
}

// value rounded to the nearest value of dtype, kept as fp32.
static inline float round_to(cd_dtype dtype, float value) {
  switch (dtype) {
    case CD_DTYPE_BF16: return bf16_to_f32(f32_to_bf16(value));
    case CD_DTYPE_F16: return f16_to_f32(f32_to_f16(value));
    default: return value;
  }
}

// Converts count elements; the buffers may not overlap.
static inline void convert_elements(const void* source, cd_dtype source_dtype, void* target,
                                    cd_dtype target_dtype, size_t count) {
  if (source_dtype == target_dtype) {
    std::memcpy(target, source, count * dtype_bytes(source_dtype));
    return;
  }
  for (size_t i = 0; i < count; ++i) {
    store_from_f32(target, target_dtype, i, load_as_f32(source, source_dtype, i));
  }
}

// As above, rounding each value to precision on the way unless the source is already that dtype
// (widening: rounding to fp32 or to the stored dtype changes nothing).
static inline void convert_elements(const void* source, cd_dtype source_dtype, void* target,
                                    cd_dtype target_dtype, cd_dtype precision, size_t count) {
  if (precision == CD_DTYPE_F32 || precision == source_dtype) {
    convert_elements(source, source_dtype, target, target_dtype, count);
    return;
  }
  for (size_t i = 0; i < count; ++i) {
    store_from_f32(target, target_dtype, i, round_to(precision, load_as_f32(source, source_dtype, i)));
  }
}

}  // namespace conduit
