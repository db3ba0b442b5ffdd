// The amx path's numerics without AMX hardware (native/test/amx-model.test.ts runs this):
//  1. the model of VDPBF16PS (amx_model.h, from the SDM) equals the CPU's instruction, bit for bit,
//     on random and underflowing inputs;
//  2. the SDM's two instructions do not round alike: one vdpbf16ps chain per output (the avx512
//     path) differs from the tiles' order on random matmuls;
//  3. the tile kernel (kernels_amx_body.inc) on the modelled tiles equals a plain reference of the
//     tiles' order per output, for ragged k, partial panels, column ranges, 1 to 70 rows and
//     accumulation: its tiling, padding and packing are what TDPBF16PS needs;
//  4. the runtime's amx table on one row (real vdpbf16ps) equals the same reference, so a row's bits
//     do not depend on how many rows its step computes;
//  5. where the CPU has AMX and the OS grants it, the runtime's real tiles equal the reference too;
//  6. int8 weights: the tile kernel on modelled TDPBSSD/TDPBUSD (and the real ones where present)
//     gives the avx512 path's int8 bits exactly, for the same cases.
// Prints one line per check; exits nonzero on the first mismatch, naming it and the seed.
#include <immintrin.h>

#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "amx.h"
#include "amx_model.h"
#include "kernels.h"

namespace conduit {
namespace {
#include "kernels_amx_body.inc"
}  // namespace
}  // namespace conduit

using conduit::Activations;
using conduit::Matrix;
using conduit::MatrixFormat;
using conduit::kPanelColumns;
using amx_model::bits_to_float;
using amx_model::float_to_bits;

namespace {

uint32_t g_seed = 0;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "seed %u: %s\n", g_seed, what.c_str());
  std::exit(1);
}

uint16_t bf16_of(float x) { return uint16_t(float_to_bits(x) >> 16); }

// Weights as bf16 bits: mostly normal values, sometimes zeros of either sign, and, in the
// underflow draw, mostly magnitudes near 2^-63 whose products (2^-127 to 2^-124) straddle fp32's
// smallest normal, so products, chains and the closing adds flush to zero (FTZ) or not.
struct Draw {
  std::mt19937 rng;
  bool underflow;
  uint16_t weight() {
    const uint32_t r = rng();
    if (r % 29 == 0) return (r >> 8) & 1 ? 0x8000 : 0x0000;
    if (underflow && r % 16 != 0) return uint16_t(((r >> 9) & 0x8000) | ((64 + (r >> 12) % 2) << 7) | ((r >> 20) & 0x7F));
    return bf16_of(std::normal_distribution<float>(0.0f, 0.05f)(rng));
  }
  float activation() {
    const uint32_t r = rng();
    if (underflow && r % 16 != 0) return bits_to_float(((r >> 9) & 0x80000000u) | (uint32_t(63 + (r >> 12) % 2) << 23) | (r & 0x7FFFFF));
    return std::normal_distribution<float>(0.0f, 1.0f)(rng);
  }
};

// w [n][k] bf16 bits -> kBf16Panels: [ceil(n/64)][ceil(k/2)][64][2], zero padding (kernels.h).
std::vector<uint16_t> pack_panels(const std::vector<uint16_t>& w, int32_t n, int32_t k) {
  const int32_t num_pairs = (k + 1) / 2;
  const int32_t num_panels = (n + kPanelColumns - 1) / kPanelColumns;
  std::vector<uint16_t> panels(size_t(num_panels) * num_pairs * kPanelColumns * 2, 0);
  for (int32_t col = 0; col < n; ++col) {
    for (int32_t i = 0; i < k; ++i) {
      const size_t at = ((size_t(col / kPanelColumns) * num_pairs + i / 2) * kPanelColumns + col % kPanelColumns) * 2 + i % 2;
      panels[at] = w[size_t(col) * k + i];
    }
  }
  return panels;
}

// The tiles' order for one output, written from the SDM directly: per 32 inputs, e over the even
// ones and o over the odd ones (fused, DAZ, FTZ), then acc = acc + (e + o).
float tile_order_dot(const uint16_t* x, const uint16_t* w, int32_t k) {
  float acc = 0.0f;
  for (int32_t base = 0; base < k; base += 32) {
    float even = 0.0f, odd = 0.0f;
    for (int32_t i = base; i < base + 32; i += 2) {
      const uint16_t x0 = i < k ? x[i] : 0, x1 = i + 1 < k ? x[i + 1] : 0;
      const uint16_t w0 = i < k ? w[i] : 0, w1 = i + 1 < k ? w[i + 1] : 0;
      even = amx_model::fma_daz_ftz(amx_model::make_fp32(x0), amx_model::make_fp32(w0), even);
      odd = amx_model::fma_daz_ftz(amx_model::make_fp32(x1), amx_model::make_fp32(w1), odd);
    }
    acc = amx_model::add_daz_ftz(acc, amx_model::add_daz_ftz(even, odd));
  }
  return acc;
}

bool same_bits(float a, float b) { return float_to_bits(a) == float_to_bits(b); }

void check_vdpbf16ps(std::mt19937& rng) {
  long lanes = 0;
  for (int round = 0; round < 50000; ++round) {
    Draw draw{std::mt19937(rng()), round % 2 == 1};
    alignas(64) uint16_t a[32], b[32];
    alignas(64) float acc[16], model[16], hardware[16];
    for (int i = 0; i < 32; ++i) {
      a[i] = draw.underflow ? bf16_of(draw.activation()) : draw.weight();
      b[i] = draw.weight();
    }
    for (int i = 0; i < 16; ++i) model[i] = acc[i] = draw.activation();
    amx_model::vdpbf16ps(model, a, b);
    _mm512_store_ps(hardware, _mm512_dpbf16_ps(_mm512_load_ps(acc), (__m512bh)_mm512_load_si512(a), (__m512bh)_mm512_load_si512(b)));
    for (int i = 0; i < 16; ++i, ++lanes) {
      if (!same_bits(model[i], hardware[i])) {
        char message[200];
        std::snprintf(message, sizeof message, "vdpbf16ps model %a != hardware %a (acc %a, lane %d)", model[i], hardware[i], acc[i], i);
        fail(message);
      }
    }
  }
  std::printf("vdpbf16ps model equals the CPU: %ld lanes\n", lanes);
}

struct Case {
  int32_t num_rows, k, n, n_begin, n_end;
  bool accumulate, underflow;
};

struct Problem {
  std::vector<uint16_t> x_bits;  // [rows][k] bf16, as packed
  std::vector<uint8_t> packed;   // the runtime's packing
  size_t packed_stride;
  std::vector<uint16_t> w;       // [n][k]
  std::vector<uint16_t> panels;
  std::vector<float> y0;         // what y holds before (accumulate)
};

Problem make_problem(const Case& c, std::mt19937& rng) {
  const conduit::KernelTable& amx = conduit::kernels_amx();
  Draw draw{std::mt19937(rng()), c.underflow};
  Problem p;
  std::vector<float> x(size_t(c.num_rows) * c.k);
  for (float& v : x) v = draw.activation();
  p.packed_stride = amx.packed_row_bytes(MatrixFormat::kBf16Panels, c.k);
  p.packed.assign(size_t(c.num_rows) * p.packed_stride, 0xAB);
  amx.pack_rows(x.data(), size_t(c.k), c.num_rows, c.k, MatrixFormat::kBf16Panels, p.packed.data(), p.packed_stride);
  p.x_bits.resize(x.size());
  for (int32_t m = 0; m < c.num_rows; ++m) {
    for (int32_t i = 0; i < c.k; ++i) {
      uint16_t bits;
      std::memcpy(&bits, p.packed.data() + size_t(m) * p.packed_stride + size_t(i) * 2, 2);
      p.x_bits[size_t(m) * c.k + i] = bits;
    }
  }
  p.w.resize(size_t(c.n) * c.k);
  for (uint16_t& v : p.w) v = draw.weight();
  p.panels = pack_panels(p.w, c.n, c.k);
  p.y0.resize(size_t(c.num_rows) * c.n);
  for (float& v : p.y0) v = std::normal_distribution<float>()(draw.rng);
  return p;
}

float reference_output(const Case& c, const Problem& p, int32_t m, int32_t col) {
  const float dot = tile_order_dot(&p.x_bits[size_t(m) * c.k], &p.w[size_t(col) * c.k], c.k);
  // The kernels add to y under the tile's FTZ and DAZ; y's draws are normal, so a plain add matches.
  return c.accumulate ? amx_model::add_daz_ftz(p.y0[size_t(m) * c.n + col], dot) : dot;
}

using MatmulFn = void (*)(const Activations&, int32_t, int32_t, const Matrix&, int32_t, int32_t, float*, size_t, bool);

std::vector<float> run(MatmulFn matmul, const Case& c, const Problem& p, int32_t first_row, int32_t num_rows) {
  std::vector<uint8_t> scratch(conduit::amx_scratch_bytes(c.k) + 64);
  const Activations a{nullptr, 0, p.packed.data() + size_t(first_row) * p.packed_stride, p.packed_stride, scratch.data()};
  const Matrix w{p.panels.data(), MatrixFormat::kBf16Panels};
  std::vector<float> y(p.y0.begin() + size_t(first_row) * c.n, p.y0.begin() + size_t(first_row + num_rows) * c.n);
  matmul(a, num_rows, c.k, w, c.n_begin, c.n_end, y.data(), size_t(c.n), c.accumulate);
  return y;
}

// y (rows first_row.. of the case) against the reference inside [n_begin, n_end) and y0 outside.
void expect_reference(const char* what, const Case& c, const Problem& p, const std::vector<float>& y, int32_t first_row,
                      int32_t num_rows) {
  for (int32_t m = 0; m < num_rows; ++m) {
    for (int32_t col = 0; col < c.n; ++col) {
      const float got = y[size_t(m) * c.n + col];
      const bool inside = col >= c.n_begin && col < c.n_end;
      const float want = inside ? reference_output(c, p, first_row + m, col) : p.y0[size_t(first_row + m) * c.n + col];
      if (!same_bits(got, want)) {
        char message[300];
        std::snprintf(message, sizeof message, "%s: rows %d k %d n %d [%d, %d) acc %d underflow %d: row %d col %d got %a want %a",
                      what, c.num_rows, c.k, c.n, c.n_begin, c.n_end, c.accumulate, c.underflow, first_row + m, col, got, want);
        fail(message);
      }
    }
  }
}

void model_tiles(const Activations& a, int32_t num_rows, int32_t k, const Matrix& w, int32_t n_begin, int32_t n_end,
                 float* y, size_t y_stride, bool accumulate) {
  alignas(64) const conduit::AmxTileConfig config = conduit::amx_tile_config();
  amx_model::ModelTiles::configure(&config);
  conduit::matmul_bf16_tiles<amx_model::ModelTiles>(a, num_rows, k, w, n_begin, n_end, y, y_stride, accumulate);
}

std::vector<Case> cases(std::mt19937& rng) {
  std::vector<Case> all;
  const int32_t ks[] = {32, 64, 96, 17, 50, 130, 256};
  const int32_t row_counts[] = {1, 2, 5, 16, 31, 32, 33, 47, 64, 70};
  for (int32_t k : ks) {
    for (int32_t rows : row_counts) {
      const int32_t n = 64 * (1 + int32_t(rng() % 3)) - int32_t(rng() % 2) * 23;
      const int32_t panels = (n + 63) / 64;
      const int32_t n_begin = 64 * int32_t(rng() % panels);
      const int32_t n_end = std::min(n, n_begin + 64 * (1 + int32_t(rng() % (panels - n_begin / 64))));
      all.push_back(Case{rows, k, n, n_begin, n_end, rng() % 2 == 0, rng() % 4 == 0});
    }
  }
  return all;
}

}  // namespace

// Q8 panels (kernels.h): per panel and 32-block, int8 [16 pairs][64][2] then 64 fp16 scales;
// random values in [-127, 127] and scales in about [2^-10, 2^-4], zero padding.
std::vector<uint8_t> random_q8_panels(std::mt19937& rng, int32_t n, int32_t k) {
  const int32_t num_blocks = (k + 31) / 32;
  const int32_t num_panels = (n + kPanelColumns - 1) / kPanelColumns;
  std::vector<uint8_t> panels(size_t(num_panels) * num_blocks * conduit::kQ8PanelBlockBytes, 0);
  for (int32_t p = 0; p < num_panels; ++p) {
    for (int32_t b = 0; b < num_blocks; ++b) {
      uint8_t* block = panels.data() + (size_t(p) * num_blocks + b) * conduit::kQ8PanelBlockBytes;
      for (int32_t c = 0; c < kPanelColumns && p * kPanelColumns + c < n; ++c) {
        for (int32_t i = 0; i < 32 && b * 32 + i < k; ++i) block[((i / 2) * kPanelColumns + c) * 2 + i % 2] = uint8_t(int8_t(int32_t(rng() % 255) - 127));
        const uint16_t scale = uint16_t(_cvtss_sh(std::ldexp(1.0f + float(rng() % 1000) / 1000.0f, -4 - int(rng() % 7)), 0));
        std::memcpy(block + kPanelColumns * 32 + c * 2, &scale, 2);
      }
    }
  }
  return panels;
}

void model_q8_tiles(const Activations& a, int32_t num_rows, int32_t k, const Matrix& w, int32_t n_begin, int32_t n_end,
                    float* y, size_t y_stride, bool accumulate) {
  alignas(64) const conduit::AmxTileConfig config = conduit::amx_int8_tile_config();
  amx_model::ModelTiles::configure(&config);
  const size_t avx512_row_bytes = conduit::kernels_avx512().packed_row_bytes(MatrixFormat::kQ8Panels, k);
  conduit::matmul_q8_tiles<amx_model::ModelTiles>(a, avx512_row_bytes, num_rows, k, w, n_begin, n_end, y, y_stride, accumulate);
}

// The amx path's int8 row: avx512's, then the high and low bytes (on any CPU, for the model).
std::vector<uint8_t> pack_q8_rows_for_tiles(const std::vector<float>& x, int32_t num_rows, int32_t k, size_t* stride) {
  const conduit::KernelTable& avx512 = conduit::kernels_avx512();
  const size_t avx512_bytes = avx512.packed_row_bytes(MatrixFormat::kQ8Panels, k);
  *stride = avx512_bytes + 2 * size_t(conduit::q8_padded_k(k));
  std::vector<uint8_t> packed(size_t(num_rows) * *stride);
  avx512.pack_rows(x.data(), size_t(k), num_rows, k, MatrixFormat::kQ8Panels, packed.data(), *stride);
  for (int32_t m = 0; m < num_rows; ++m) conduit::amx_q8_split_row(packed.data() + size_t(m) * *stride, avx512_bytes, k);
  return packed;
}

// The int8 tiles (modelled, and the runtime's real ones where present) against avx512's int8 path.
void check_int8(const std::vector<Case>& all, std::mt19937& rng, bool hardware) {
  long outputs = 0;
  for (const Case& c : all) {
    if (c.num_rows < 2) continue;
    const conduit::KernelTable& avx512 = conduit::kernels_avx512();
    std::vector<float> x(size_t(c.num_rows) * c.k);
    for (float& v : x) v = std::normal_distribution<float>()(rng);
    const size_t stride = avx512.packed_row_bytes(MatrixFormat::kQ8Panels, c.k);
    std::vector<uint8_t> packed(size_t(c.num_rows) * stride);
    avx512.pack_rows(x.data(), size_t(c.k), c.num_rows, c.k, MatrixFormat::kQ8Panels, packed.data(), stride);
    const std::vector<uint8_t> panels = random_q8_panels(rng, c.n, c.k);
    std::vector<float> y0(size_t(c.num_rows) * c.n);
    for (float& v : y0) v = std::normal_distribution<float>()(rng);
    size_t tile_stride = 0;
    const std::vector<uint8_t> tile_packed = pack_q8_rows_for_tiles(x, c.num_rows, c.k, &tile_stride);
    if (hardware && conduit::kernels_amx().packed_row_bytes(MatrixFormat::kQ8Panels, c.k) != tile_stride) fail("the amx table packs int8 rows otherwise");
    const Matrix w{panels.data(), MatrixFormat::kQ8Panels};
    auto run_q8 = [&](MatmulFn matmul) {
      const bool tiles = matmul != avx512.matmul;
      std::vector<uint8_t> scratch(conduit::amx_q8_scratch_bytes(c.k) + 64);
      const Activations a{nullptr, 0, tiles ? tile_packed.data() : packed.data(), tiles ? tile_stride : stride, scratch.data()};
      std::vector<float> y = y0;
      matmul(a, c.num_rows, c.k, w, c.n_begin, c.n_end, y.data(), size_t(c.n), c.accumulate);
      return y;
    };
    const std::vector<float> want = run_q8(avx512.matmul);
    const std::pair<const char*, MatmulFn> paths[] = {{"modelled int8 tiles", model_q8_tiles}, {"hardware int8 tiles", conduit::kernels_amx().matmul}};
    for (const auto& [what, matmul] : paths) {
      if (matmul != model_q8_tiles && !hardware) continue;
      const std::vector<float> got = run_q8(matmul);
      for (size_t i = 0; i < got.size(); ++i) {
        if (!same_bits(got[i], want[i])) {
          char message[300];
          std::snprintf(message, sizeof message, "%s vs avx512 int8: rows %d k %d n %d [%d, %d) acc %d: row %zu col %zu got %a want %a",
                        what, c.num_rows, c.k, c.n, c.n_begin, c.n_end, c.accumulate, i / c.n, i % c.n, got[i], want[i]);
          fail(message);
        }
      }
    }
    // One row at a time through the amx table (its GEMV), on the rows as the tiles' packing lays them out.
    for (int32_t m = 0; m < c.num_rows; ++m) {
      const Activations a{nullptr, 0, tile_packed.data() + size_t(m) * tile_stride, tile_stride, nullptr};
      std::vector<float> y(y0.begin() + size_t(m) * c.n, y0.begin() + size_t(m + 1) * c.n);
      conduit::kernels_amx().matmul(a, 1, c.k, w, c.n_begin, c.n_end, y.data(), size_t(c.n), c.accumulate);
      for (int32_t col = 0; col < c.n; ++col) {
        if (!same_bits(y[size_t(col)], want[size_t(m) * c.n + col])) fail("the amx table's one-row int8 path differs from avx512's");
      }
    }
    outputs += long(c.num_rows) * (c.n_end - c.n_begin);
  }
  std::printf("%s int8 tiles and the one-row int8 path equal the avx512 int8 path: %ld outputs\n", hardware ? "modelled and hardware" : "modelled", outputs);
}

int main(int argc, char** argv) {
  g_seed = argc > 1 ? uint32_t(std::strtoul(argv[1], nullptr, 10)) : std::random_device()();
  std::mt19937 rng(g_seed);
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512bf16")) {
    std::printf("skipped: the CPU has no AVX512_BF16\n");
    return 0;
  }
  check_vdpbf16ps(rng);

  // 2. The avx512 path's single chain against the tiles' order, same pairs, same order of pairs.
  {
    const Case c{64, 256, 128, 0, 128, false, false};
    const Problem p = make_problem(c, rng);
    const std::vector<float> y = run(conduit::kernels_avx512().matmul, c, p, 0, c.num_rows);
    long differing = 0;
    for (int32_t m = 0; m < c.num_rows; ++m)
      for (int32_t col = 0; col < c.n; ++col) differing += !same_bits(y[size_t(m) * c.n + col], reference_output(c, p, m, col));
    if (differing == 0) fail("vdpbf16ps's single chain gave the tiles' bits on every output: the model's premise is wrong");
    std::printf("vdpbf16ps chain vs TDPBF16PS order: %ld of %d outputs differ\n", differing, c.num_rows * c.n);
  }

  const std::vector<Case> all = cases(rng);
  const bool hardware = conduit::amx_support().usable;
  long outputs = 0;
  for (const Case& c : all) {
    const Problem p = make_problem(c, rng);
    // 3. Tiles, modelled.
    expect_reference("modelled tiles", c, p, run(model_tiles, c, p, 0, c.num_rows), 0, c.num_rows);
    // 4. The runtime's amx table, one row at a time (the GEMV path, real vdpbf16ps).
    for (int32_t m = 0; m < c.num_rows; ++m) expect_reference("one-row path", c, p, run(conduit::kernels_amx().matmul, c, p, m, 1), m, 1);
    // 5. The runtime's amx table on all rows: real tiles where the CPU has them.
    if (hardware) expect_reference("hardware tiles", c, p, run(conduit::kernels_amx().matmul, c, p, 0, c.num_rows), 0, c.num_rows);
    outputs += long(c.num_rows) * (c.n_end - c.n_begin);
  }
  check_int8(all, rng, hardware && conduit::amx_support().cpu_has_amx_int8);
  std::printf("modelled tiles equal the tiles' order: %zu matmuls, %ld outputs\n", all.size(), outputs);
  std::printf("one-row path equals the tiles' order: %zu matmuls, %ld outputs\n", all.size(), outputs);
  if (hardware) {
    std::printf("hardware tiles equal the tiles' order: %zu matmuls, %ld outputs\n", all.size(), outputs);
  } else {
    std::printf("hardware tiles: not run (%s)\n", conduit::amx_support().reason);
  }
  return 0;
}
