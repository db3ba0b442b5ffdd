// A bit-exact software model of the instructions the amx kernel path depends on, written from
// the pseudo-code of Intel's SDM (vol. 2, "VDPBF16PS" and "TDPBF16PS"), for the tests alone: this
// project's machines may have no AMX, and no emulator runs it. The kernels' tiling, packing and
// reduction order run against ModelTiles here; VdpBf16ps is checked against the real instruction
// wherever the CPU has AVX512_BF16, which anchors the model's rounding (RNE), DAZ and FTZ.
//
// What the SDM says, and why it matters for batch invariance:
// - VDPBF16PS, per fp32 lane i: acc += a[2i+1] * b[2i+1], then acc += a[2i] * b[2i]: two fused
//   multiply-adds into the one accumulator, odd element first, each rounded (RNE) with DAZ in and
//   FTZ out.
// - TDPBF16PS, per output (m, n), per instruction: two fresh accumulators e and o start at +0;
//   over the tile's 16 pairs k in order, e += a[m][2k] * b[k][2n] and o += a[m][2k+1] * b[k][2n+1]
//   (fused, RNE, DAZ, FTZ); then dst = dst + (e + o), each add rounded (RNE, DAZ, FTZ).
// So the two do NOT round identically for the same pairs in the same order: one chain through
// every product against two chains per 16 pairs joined by two adds. A batch-1 GEMV with one
// vdpbf16ps per pair cannot give a tile's bits; the amx path's GEMV runs the tile's order instead
// (two vdpbf16ps per pair, each with the other element zeroed, then the two adds).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace amx_model {

inline float bits_to_float(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

inline uint32_t float_to_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

// A denormal becomes a zero of its sign: DAZ on inputs, FTZ on results.
inline float flush_denormal(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }

inline float make_fp32(uint16_t bf16) { return bits_to_float(uint32_t(bf16) << 16); }

// "FP32 FMA with DAZ=FTZ=1, RNE rounding": fmaf rounds once, to nearest even (the test runs with
// the default MXCSR); tininess is judged on the rounded result.
inline float fma_daz_ftz(float a, float b, float c) {
  return flush_denormal(std::fmaf(flush_denormal(a), flush_denormal(b), flush_denormal(c)));
}

// "DAZ=FTZ=1, RNE rounding" for the tile's closing adds. volatile keeps the compiler from
// contracting or reordering (the file is built with -ffp-contract=off as well).
inline float add_daz_ftz(float a, float b) {
  volatile float sum = flush_denormal(a) + flush_denormal(b);
  return flush_denormal(sum);
}

// VDPBF16PS on 16 lanes: acc[i] += a[2i+1] b[2i+1], then += a[2i] b[2i].
inline void vdpbf16ps(float (&acc)[16], const uint16_t* a, const uint16_t* b) {
  for (int i = 0; i < 16; ++i) {
    acc[i] = fma_daz_ftz(make_fp32(a[2 * i + 1]), make_fp32(b[2 * i + 1]), acc[i]);
    acc[i] = fma_daz_ftz(make_fp32(a[2 * i]), make_fp32(b[2 * i]), acc[i]);
  }
}

// The 64-byte LDTILECFG operand (palette 1).
struct TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads 64 bytes");

[[noreturn]] inline void fault(const char* what) {
  std::fprintf(stderr, "amx model: %s (the hardware raises #UD)\n", what);
  std::abort();
}

// Eight tile registers of 16 rows x 64 bytes, shaped by the loaded configuration; the calls the
// kernels make, with the shape checks the SDM lists as #UD.
struct TileFile {
  TileConfig config{};
  bool configured = false;
  alignas(64) uint8_t data[8][16][64] = {};

  void load_config(const void* bytes) {
    std::memcpy(&config, bytes, sizeof config);
    if (config.palette != 1) fault("only palette 1 is modelled");
    for (int t = 0; t < 8; ++t) {
      if (config.rows[t] > 16 || config.colsb[t] > 64 || config.colsb[t] % 4 != 0) fault("tile shape out of palette 1");
    }
    std::memset(data, 0, sizeof data);
    configured = true;
  }
  void check(int t) const {
    if (!configured) fault("tile instruction before LDTILECFG");
    if (config.rows[t] == 0) fault("tile not configured");
  }
  void zero(int t) {
    check(t);
    std::memset(data[t], 0, sizeof data[t]);
  }
  void load(int t, const void* base, size_t stride) {
    check(t);
    std::memset(data[t], 0, sizeof data[t]);
    for (int r = 0; r < config.rows[t]; ++r) std::memcpy(data[t][r], static_cast<const uint8_t*>(base) + size_t(r) * stride, config.colsb[t]);
  }
  void store(int t, void* base, size_t stride) const {
    check(t);
    for (int r = 0; r < config.rows[t]; ++r) std::memcpy(static_cast<uint8_t*>(base) + size_t(r) * stride, data[t][r], config.colsb[t]);
  }
  // TDPBF16PS dst, a, b.
  void dpbf16ps(int dst, int a, int b) {
    check(dst);
    check(a);
    check(b);
    if (config.rows[dst] != config.rows[a] || config.colsb[a] / 4 != config.rows[b] ||
        config.colsb[dst] != config.colsb[b] || dst == a || dst == b || a == b) {
      fault("TDPBF16PS operand shapes disagree");
    }
    const int num_pairs = config.colsb[a] / 4;
    const int num_columns = config.colsb[dst] / 4;
    for (int m = 0; m < config.rows[dst]; ++m) {
      float even[16] = {};
      float odd[16] = {};
      for (int k = 0; k < num_pairs; ++k) {
        uint16_t a_pair[2];
        std::memcpy(a_pair, &data[a][m][4 * k], sizeof a_pair);
        for (int n = 0; n < num_columns; ++n) {
          uint16_t b_pair[2];
          std::memcpy(b_pair, &data[b][k][4 * n], sizeof b_pair);
          even[n] = fma_daz_ftz(make_fp32(a_pair[0]), make_fp32(b_pair[0]), even[n]);
          odd[n] = fma_daz_ftz(make_fp32(a_pair[1]), make_fp32(b_pair[1]), odd[n]);
        }
      }
      for (int n = 0; n < num_columns; ++n) {
        float c;
        std::memcpy(&c, &data[dst][m][4 * n], sizeof c);
        c = add_daz_ftz(c, add_daz_ftz(even[n], odd[n]));
        std::memcpy(&data[dst][m][4 * n], &c, sizeof c);
      }
    }
  }
};

// TDPBSSD / TDPBUSD dst, a, b: per (m, n), over the tile's quads k, the four products of a's
// signed (or unsigned) bytes and b's signed bytes, added into the int32 (wrapping; exact here).
inline void dpbd(TileFile& file, int dst, int a, int b, bool a_unsigned) {
  file.check(dst);
  file.check(a);
  file.check(b);
  const TileConfig& config = file.config;
  if (config.rows[dst] != config.rows[a] || config.colsb[a] / 4 != config.rows[b] || config.colsb[dst] != config.colsb[b] ||
      dst == a || dst == b || a == b) {
    fault("TDPBxxD operand shapes disagree");
  }
  for (int m = 0; m < config.rows[dst]; ++m) {
    for (int n = 0; n < config.colsb[dst] / 4; ++n) {
      int32_t c;
      std::memcpy(&c, &file.data[dst][m][4 * n], sizeof c);
      int64_t sum = c;
      for (int k = 0; k < config.colsb[a] / 4; ++k) {
        for (int j = 0; j < 4; ++j) {
          const uint8_t a_byte = file.data[a][m][4 * k + j];
          const int32_t a_value = a_unsigned ? int32_t(a_byte) : int32_t(int8_t(a_byte));
          sum += int64_t(a_value) * int8_t(file.data[b][k][4 * n + j]);
        }
      }
      c = int32_t(uint32_t(uint64_t(sum)));
      std::memcpy(&file.data[dst][m][4 * n], &c, sizeof c);
    }
  }
}

inline TileFile& tile_file() {
  static thread_local TileFile file;
  return file;
}

// The Tiles interface of kernels_amx_body.inc, on the model.
struct ModelTiles {
  static void configure(const void* config) { tile_file().load_config(config); }
  template <int T>
  static void zero() { tile_file().zero(T); }
  template <int T>
  static void load(const void* base, size_t stride) { tile_file().load(T, base, stride); }
  template <int T>
  static void store(void* base, size_t stride) { tile_file().store(T, base, stride); }
  template <int C, int A, int B>
  static void dpbf16ps() { tile_file().dpbf16ps(C, A, B); }
  template <int C, int A, int B>
  static void dpbssd() { dpbd(tile_file(), C, A, B, false); }
  template <int C, int A, int B>
  static void dpbusd() { dpbd(tile_file(), C, A, B, true); }
};

}  // namespace amx_model
