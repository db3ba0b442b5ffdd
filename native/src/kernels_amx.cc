// AMX kernels (AMX-TILE, AMX-BF16, AMX-INT8 on top of avx512): bf16 matmuls of more than one row
// run on tiles (TDPBF16PS, 32 rows x 32 columns per block, kernels_amx_body.inc); one row runs the
// tiles' reduction order with vdpbf16ps, so both give the same bits. int8 matmuls of more than one
// row run on TDPBSSD/TDPBUSD with the avx512 path's exact block sums, so they give its bits and
// one row stays on its GEMV. Everything else (fp32 and fp16 weights, attention, the elementwise
// kernels) is the avx512 table's. Each thread that computes loads the tile configuration itself,
// on its first matmul (and again when it switches between the bf16 and int8 shapes).
#include <immintrin.h>

#include "amx.h"
#include "kernels.h"

namespace conduit {
namespace {

// GCC's tile intrinsics are macros that paste the register number into the assembly, so each
// register the body uses is spelled out.
#define CONDUIT_EACH_TILE(op) \
  if constexpr (T == 0) op(0);  \
  else if constexpr (T == 1) op(1); \
  else if constexpr (T == 2) op(2); \
  else if constexpr (T == 3) op(3); \
  else if constexpr (T == 4) op(4); \
  else if constexpr (T == 5) op(5); \
  else if constexpr (T == 6) op(6); \
  else op(7)

struct HardwareTiles {
  static void configure(const void* config) { _tile_loadconfig(config); }
  template <int T>
  static void zero() {
#define CONDUIT_ZERO(t) _tile_zero(t)
    CONDUIT_EACH_TILE(CONDUIT_ZERO);
#undef CONDUIT_ZERO
  }
  template <int T>
  static void load(const void* base, size_t stride) {
#define CONDUIT_LOAD(t) _tile_loadd(t, base, stride)
    CONDUIT_EACH_TILE(CONDUIT_LOAD);
#undef CONDUIT_LOAD
  }
  template <int T>
  static void store(void* base, size_t stride) {
#define CONDUIT_STORE(t) _tile_stored(t, base, stride)
    CONDUIT_EACH_TILE(CONDUIT_STORE);
#undef CONDUIT_STORE
  }
  // The four products of a 32 x 32 block (kernels_amx_body.inc).
  template <int C, int A, int B>
  static void dpbf16ps() {
    static_assert((C == 0 && A == 4 && B == 6) || (C == 1 && A == 4 && B == 7) || (C == 2 && A == 5 && B == 6) ||
                      (C == 3 && A == 5 && B == 7),
                  "only the block's four products are spelled out");
    if constexpr (C == 0) _tile_dpbf16ps(0, 4, 6);
    else if constexpr (C == 1) _tile_dpbf16ps(1, 4, 7);
    else if constexpr (C == 2) _tile_dpbf16ps(2, 5, 6);
    else _tile_dpbf16ps(3, 5, 7);
  }
  // The int8 block's products: high bytes (signed) in 0 and 1, low bytes (unsigned) in 2 and 3.
  template <int C, int A, int B>
  static void dpbssd() {
    static_assert((C == 0 && A == 4 && B == 6) || (C == 1 && A == 4 && B == 7), "only the block's products are spelled out");
    if constexpr (C == 0) _tile_dpbssd(0, 4, 6);
    else _tile_dpbssd(1, 4, 7);
  }
  template <int C, int A, int B>
  static void dpbusd() {
    static_assert((C == 2 && A == 5 && B == 6) || (C == 3 && A == 5 && B == 7), "only the block's products are spelled out");
    if constexpr (C == 2) _tile_dpbusd(2, 5, 6);
    else _tile_dpbusd(3, 5, 7);
  }
};
#undef CONDUIT_EACH_TILE

#include "kernels_amx_body.inc"

// One row gains nothing from tiles (a memory-bound GEMV); two rows and more read the weights once
// for up to 32 rows. Not tuned: which count is faster is unmeasured (no AMX machine yet), and the
// bits are the same either way.
constexpr int32_t kMinTileRows = 2;

// AMX-INT8 comes with AMX-TILE on every CPU so far, but is its own CPUID bit.
bool int8_tiles() {
  static const bool present = amx_support().cpu_has_amx_int8;
  return present;
}

// The shapes a thread's tiles hold now: loaded on its first matmul, again when the format changes.
enum class TileShapes { kNone, kBf16, kInt8 };

void configure_tiles(TileShapes shapes) {
  static thread_local TileShapes loaded = TileShapes::kNone;
  if (loaded == shapes) return;
  alignas(64) const AmxTileConfig config = shapes == TileShapes::kBf16 ? amx_tile_config() : amx_int8_tile_config();
  HardwareTiles::configure(&config);
  loaded = shapes;
}

// int8 rows carry their high and low bytes for the tiles after avx512's packing, which the one-row
// path reads as before.
size_t packed_row_bytes(MatrixFormat format, int32_t k) {
  const size_t avx512_bytes = kernels_avx512().packed_row_bytes(format, k);
  return format == MatrixFormat::kQ8Panels && int8_tiles() ? avx512_bytes + 2 * size_t(q8_padded_k(k)) : avx512_bytes;
}

void pack_rows(const float* x, size_t x_stride, int32_t num_rows, int32_t k, MatrixFormat format, uint8_t* packed,
               size_t packed_stride) {
  kernels_avx512().pack_rows(x, x_stride, num_rows, k, format, packed, packed_stride);
  if (format != MatrixFormat::kQ8Panels || !int8_tiles()) return;
  const size_t avx512_bytes = kernels_avx512().packed_row_bytes(format, k);
  for (int32_t m = 0; m < num_rows; ++m) amx_q8_split_row(packed + size_t(m) * packed_stride, avx512_bytes, k);
}

size_t panel_scratch_bytes(MatrixFormat format, int32_t k, int32_t num_rows) {
  if (format == MatrixFormat::kBf16Panels) return amx_scratch_bytes(k);
  if (format == MatrixFormat::kQ8Panels && num_rows >= kMinTileRows && int8_tiles()) return amx_q8_scratch_bytes(k);
  return kernels_avx512().panel_scratch_bytes(format, k, num_rows);
}

void matmul(const Activations& a, int32_t num_rows, int32_t k, const Matrix& w, int32_t n_begin, int32_t n_end,
            float* y, size_t y_stride, bool accumulate) {
  if (w.format == MatrixFormat::kBf16Panels && num_rows < kMinTileRows) {
    matmul_bf16_tile_order_rows(a, num_rows, k, w, n_begin, n_end, y, y_stride, accumulate);
  } else if (w.format == MatrixFormat::kBf16Panels) {
    configure_tiles(TileShapes::kBf16);
    matmul_bf16_tiles<HardwareTiles>(a, num_rows, k, w, n_begin, n_end, y, y_stride, accumulate);
  } else if (w.format == MatrixFormat::kQ8Panels && num_rows >= kMinTileRows && int8_tiles()) {
    configure_tiles(TileShapes::kInt8);
    matmul_q8_tiles<HardwareTiles>(a, kernels_avx512().packed_row_bytes(w.format, k), num_rows, k, w, n_begin, n_end, y,
                                   y_stride, accumulate);
  } else {
    kernels_avx512().matmul(a, num_rows, k, w, n_begin, n_end, y, y_stride, accumulate);
  }
}

}  // namespace

const KernelTable& kernels_amx() {
  static const KernelTable table = [] {
    KernelTable amx = kernels_avx512();
    amx.kernel = CD_KERNEL_AMX;
    amx.packed_row_bytes = packed_row_bytes;
    amx.pack_rows = pack_rows;
    amx.panel_scratch_bytes = panel_scratch_bytes;
    amx.matmul = matmul;
    // Its bf16 chains are the tiles', not avx512's: the segments go through matmul one by one.
    amx.matmul_summed_bf16_segments = nullptr;
    return amx;
  }();
  return table;
}

// The AMX ceiling: TDPBF16PS on four accumulator tiles from two pairs of operand tiles that never
// change, so nothing but the tile unit is timed. Each instruction is 16 x 16 x 32 multiply-adds.
float probe_bf16_peak_amx(int64_t num_iterations, int64_t* out_flops) {
  configure_tiles(TileShapes::kBf16);
  alignas(64) uint16_t operand[16 * 32];
  for (uint16_t& value : operand) value = 0x3400;  // 2^-23: the sums stay far from overflow
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i = 0; i < num_iterations; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float out[16 * 16];
  _tile_stored(0, out, 64);
  *out_flops = num_iterations * 4 * 16 * 16 * 32 * 2;
  return out[0];
}

}  // namespace conduit
