// ggml's quantized blocks as GGUF stores them (ggml-common.h; dequantization as
// ggml-quants.c's dequantize_row_*): element `index` of a tensor whose rows are whole blocks.
// Every value is exact in fp32 (fp16 scale x 6-bit scale x 6-bit code fits 24 bits; Q4_K / Q5_K
// subtract two such products, rounded once), which is also what ggml computes.
#pragma once

#include <cmath>
#include <cstdint>

#include "conduit.h"
#include "dtype.h"

namespace conduit {

inline bool is_ggml_encoding(cd_encoding encoding) {
  return encoding >= CD_ENCODING_GGML_Q8_0 && encoding <= CD_ENCODING_GGML_MXFP4;
}

inline int32_t ggml_block_elements(cd_encoding encoding) {
  return encoding == CD_ENCODING_GGML_Q8_0 || encoding == CD_ENCODING_GGML_Q4_0 || encoding == CD_ENCODING_GGML_MXFP4 ? 32 : 256;
}

inline int32_t ggml_block_bytes(cd_encoding encoding) {
  switch (encoding) {
    case CD_ENCODING_GGML_Q8_0: return 34;
    case CD_ENCODING_GGML_Q4_0: return 18;
    case CD_ENCODING_GGML_Q4_K: return 144;
    case CD_ENCODING_GGML_Q5_K: return 176;
    case CD_ENCODING_GGML_MXFP4: return 17;
    default: return 210;  // Q6_K
  }
}

inline float ggml_f16_at(const uint8_t* bytes) { return f16_to_f32(uint16_t(bytes[0] | (bytes[1] << 8))); }

// Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7), packed in 12 bytes.
inline void ggml_k4_scale_min(int32_t j, const uint8_t* packed, int32_t* scale, int32_t* min) {
  if (j < 4) {
    *scale = packed[j] & 63;
    *min = packed[j + 4] & 63;
  } else {
    *scale = (packed[j + 4] & 0x0f) | ((packed[j - 4] >> 6) << 4);
    *min = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
  }
}

inline float ggml_element(cd_encoding encoding, const uint8_t* data, int64_t index) {
  const int32_t block_elements = ggml_block_elements(encoding);
  const uint8_t* block = data + (index / block_elements) * ggml_block_bytes(encoding);
  const int32_t e = int32_t(index % block_elements);
  switch (encoding) {
    case CD_ENCODING_GGML_Q8_0:  // f16 d, int8 qs[32]
      return float(int8_t(block[2 + e])) * ggml_f16_at(block);
    case CD_ENCODING_GGML_Q4_0: {  // f16 d, qs[16]: element j low nibble, j + 16 high, minus 8
      const uint8_t byte = block[2 + e % 16];
      return float(int32_t(e < 16 ? byte & 0x0f : byte >> 4) - 8) * ggml_f16_at(block);
    }
    case CD_ENCODING_GGML_MXFP4: {  // E8M0 e, qs[16] as Q4_0's: E2M1 doubled times 2^(e - 128)
      static constexpr int8_t kDoubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
      const uint8_t byte = block[1 + e % 16];
      return float(kDoubled[e < 16 ? byte & 0x0f : byte >> 4]) * std::ldexp(1.0f, int32_t(block[0]) - 128);
    }
    case CD_ENCODING_GGML_Q4_K:    // f16 d, f16 dmin, scales[12], qs[128]
    case CD_ENCODING_GGML_Q5_K: {  // f16 d, f16 dmin, scales[12], qh[32], qs[128]
      const bool q5 = encoding == CD_ENCODING_GGML_Q5_K;
      // 64 elements per 32 bytes of qs: the first 32 in the low nibbles, the next 32 in the high.
      const int32_t chunk = e / 64, high = (e % 64) / 32, l = e % 32;
      const uint8_t* qs = block + 16 + (q5 ? 32 : 0);
      int32_t q = high ? qs[32 * chunk + l] >> 4 : qs[32 * chunk + l] & 0x0f;
      if (q5) q += ((block[16 + l] >> (2 * chunk + high)) & 1) << 4;
      int32_t scale, min;
      ggml_k4_scale_min(2 * chunk + high, block + 4, &scale, &min);
      const float d = ggml_f16_at(block) * float(scale);
      const float m = ggml_f16_at(block + 2) * float(min);
      return d * float(q) - m;
    }
    default: {  // Q6_K: ql[128], qh[64], int8 scales[16], f16 d
      const int32_t half = e / 128, quarter = (e % 128) / 32, l = e % 32;
      const uint8_t low_byte = block[64 * half + l + (quarter & 1) * 32];
      const int32_t low = quarter >= 2 ? low_byte >> 4 : low_byte & 0x0f;
      const int32_t high = (block[128 + 32 * half + l] >> (2 * quarter)) & 3;
      const int32_t scale = int8_t(block[192 + 8 * half + l / 16 + 2 * quarter]);
      return ggml_f16_at(block + 208) * float(scale) * float((low | (high << 4)) - 32);
    }
  }
}

// The 32-block of a Q4_0 or Q4_K row holding element `index` (a multiple of 32) as 4-bit codes
// with w = scale * q - min, exactly: Q4_0's d and 8 d; Q4_K's d * scale_j and dmin * min_j.
inline void ggml_q4_block(cd_encoding encoding, const uint8_t* data, int64_t index, uint8_t* codes, float* scale,
                          float* min) {
  const int32_t block_elements = ggml_block_elements(encoding);
  const uint8_t* block = data + (index / block_elements) * ggml_block_bytes(encoding);
  const int32_t first = int32_t(index % block_elements);
  if (encoding == CD_ENCODING_GGML_Q4_0) {
    *scale = ggml_f16_at(block);
    *min = 8.0f * *scale;
    for (int32_t i = 0; i < 32; ++i) codes[i] = i < 16 ? block[2 + i] & 0x0f : block[2 + i - 16] >> 4;
    return;
  }
  const int32_t sub = first / 32, chunk = sub / 2, high = sub % 2;
  int32_t sub_scale, sub_min;
  ggml_k4_scale_min(sub, block + 4, &sub_scale, &sub_min);
  *scale = ggml_f16_at(block) * float(sub_scale);
  *min = ggml_f16_at(block + 2) * float(sub_min);
  for (int32_t i = 0; i < 32; ++i) {
    const uint8_t byte = block[16 + 32 * chunk + i];
    codes[i] = high ? byte >> 4 : byte & 0x0f;
  }
}

// Sub-block j (inputs 32j..32j + 31) of a Q5_K or Q6_K block as int8 codes with w = d * scale_h *
// code - dmin * min for the half h of 16 it lies in, exactly: Q5_K's 5-bit q with its 6-bit scale
// and min (the same scale for both halves); Q6_K's q less 32, its int8 scales, no min.
inline void ggml_k8_sub_block(cd_encoding encoding, const uint8_t* block, int32_t j, int8_t* codes, int32_t* half_scales,
                              int32_t* min) {
  if (encoding == CD_ENCODING_GGML_Q5_K) {
    int32_t scale;
    ggml_k4_scale_min(j, block + 4, &scale, min);
    half_scales[0] = half_scales[1] = scale;
    const int32_t chunk = j / 2, high = j % 2;
    for (int32_t l = 0; l < 32; ++l) {
      const uint8_t byte = block[48 + 32 * chunk + l];
      const int32_t q = (high ? byte >> 4 : byte & 0x0f) | (((block[16 + l] >> j) & 1) << 4);
      codes[l] = int8_t(q);
    }
    return;
  }
  const int32_t half = j / 4, quarter = j % 4;
  for (int32_t l = 0; l < 32; ++l) {
    const uint8_t low_byte = block[64 * half + l + (quarter & 1) * 32];
    const int32_t low = quarter >= 2 ? low_byte >> 4 : low_byte & 0x0f;
    const int32_t high = (block[128 + 32 * half + l] >> (2 * quarter)) & 3;
    codes[l] = int8_t((low | (high << 4)) - 32);
  }
  half_scales[0] = int8_t(block[192 + 2 * j]);
  half_scales[1] = int8_t(block[192 + 2 * j + 1]);
  *min = 0;
}

}  // namespace conduit
