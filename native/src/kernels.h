// The SIMD kernels, one table per instruction set. Each table lives in its own translation unit
// compiled with its own flags (kernels_avx512.cc, kernels_avx2.cc, kernels_scalar.cc); the model
// picks one at load.
//
// Batch invariance rests on these kernels: every output of a matmul is computed by one fixed
// sequence of operations (vector chunks over K in order, a fixed horizontal reduction, a fixed
// tail), whatever the number of rows, the register tile a row falls into, or the thread that
// computes it. Activations are packed (rounded to bf16, or quantized per 32-block to int8) one
// row at a time, so packing never depends on the batch either.
#pragma once

#include <cstddef>
#include <cstdint>

#include "conduit.h"

namespace conduit {

// How a matmul's weight matrix is stored, made at load from the Hugging Face [out, in] rows.
// Float weights come in panels of 64 output columns, so a matmul streams each panel front to
// back and one broadcast activation meets 64 columns per step: kF32Panels and kF16Panels are
// [ceil(n / 64)][k][64]; kBf16Panels is [ceil(n / 64)][ceil(k / 2)][64][2], a pair of inputs per
// column, as vdpbf16ps reads them. kQ8Panels is Q8_0-like quantization (per 32-block of a row,
// int8 round(w / s) with s = max|w| / 127 in fp16) in 64-column panels: per panel and 32-block of
// inputs, int8 [16 input pairs][64][2] then the 64 columns' fp16 scales, so a panel is one
// stream. Padding is zero.
// kQ4Panels (kernels_q4.inc) is 4-bit affine quantization per 32-block of a row, w = scale * q -
// min with q in [0, 15] and fp32 scale and min (so GGUF's Q4_K and Q4_0 blocks convert exactly):
// per panel and 32-block, codes as [4 groups of 8 inputs][64 columns] 32-bit words, then the 64
// columns' scales and their negated mins. A word holds its column's 8 codes with pair i (inputs
// 2i and 2i + 1 of the group) at bits 4i and 16 + 4i, so one shift and one mask turn a load of
// words into int16 pairs.
// kQ4KPanels is GGUF's Q4_K kept as Q4_K (w = d * scale_j * q - dmin * min_j, 6-bit scale_j and
// min_j per 32-block, fp16 d and dmin per 256): per panel and 256-block, 8 sub-blocks of codes as
// kQ4Panels lays them, then [8 sub-blocks][64 columns] bytes (scale_j's low 4 bits, min_j's in the
// high nibble), the 64 columns' uint32 of high bits (sub-block j's at bit 4j: scale's 2, then
// min's 2), the 64 columns' fp16 d and then their dmin: 144 bytes per column and 256 inputs, the
// file's own size.
// kQ8KPanels is GGUF's Q5_K and Q6_K with their values as stored (w = d * scale * q - dmin * min,
// int8 scale per 16 inputs, 6-bit min per 32, fp16 d and dmin per 256; Q6_K's q less 32 and no
// min): per panel and 256-block, 8 sub-blocks of int8 codes as kQ8Panels lays a 32-block's, then
// [16][64 columns] int8 scales, [8][64] uint8 mins, the 64 columns' fp16 d and then their dmin:
// 8.875 bits per weight.
enum class MatrixFormat : int32_t { kF32Panels, kF16Panels, kBf16Panels, kQ8Panels, kQ4Panels, kQ4KPanels, kQ8KPanels };

constexpr int32_t kPanelColumns = 64;

inline int32_t num_panels(int32_t n) { return (n + kPanelColumns - 1) / kPanelColumns; }

// Elements of one panel of a float panel format.
inline size_t panel_elements(MatrixFormat format, int32_t k) {
  return format == MatrixFormat::kBf16Panels ? size_t((k + 1) / 2) * kPanelColumns * 2 : size_t(k) * kPanelColumns;
}

constexpr size_t kQ8PanelBlockBytes = kPanelColumns * 32 + kPanelColumns * sizeof(uint16_t);

inline size_t q8_panels_bytes(int32_t n, int32_t k) {
  return size_t(num_panels(n)) * size_t((k + 31) / 32) * kQ8PanelBlockBytes;
}

constexpr size_t kQ4PanelBlockBytes = kPanelColumns * 16 + kPanelColumns * 2 * sizeof(float);

inline size_t q4_panels_bytes(int32_t n, int32_t k) {
  return size_t(num_panels(n)) * size_t((k + 31) / 32) * kQ4PanelBlockBytes;
}

constexpr int32_t kQ4KBlockInputs = 256;

// A reduction segment zero-padded to whole super-blocks (row_parallel.h) holds only its own
// sub-blocks [first_sub_block, end_sub_block) of k / 32, so it streams as densely as a whole
// matrix: a super-block holding num_held of its 8 keeps their codes, then their scale and min
// bytes, then the high bits, d and dmin as ever.
constexpr size_t q4k_held_block_bytes(int32_t num_held) {
  return size_t(num_held) * (kPanelColumns * 16 + kPanelColumns) + kPanelColumns * (4 + 2 + 2);
}
static_assert(q4k_held_block_bytes(8) == kPanelColumns * 144, "a whole super-block is the file's 144 bytes per column");

// Sub-blocks [first_sub_block, end_sub_block) held of super-block s.
inline int32_t q4k_first_held(int32_t s, int32_t first_sub_block) { return first_sub_block > 8 * s ? first_sub_block - 8 * s : 0; }
inline int32_t q4k_end_held(int32_t s, int32_t end_sub_block) { return end_sub_block - 8 * s < 8 ? end_sub_block - 8 * s : 8; }

inline size_t q4k_held_panel_bytes(int32_t first_sub_block, int32_t end_sub_block) {
  size_t bytes = 0;
  for (int32_t s = first_sub_block / 8; 8 * s < end_sub_block; ++s) {
    bytes += q4k_held_block_bytes(q4k_end_held(s, end_sub_block) - q4k_first_held(s, first_sub_block));
  }
  return bytes;
}

constexpr int32_t kQ8KBlockInputs = 256;
constexpr size_t kQ8KPanelCodeBytes = 8 * kPanelColumns * 32;
constexpr size_t kQ8KPanelBlockBytes = kQ8KPanelCodeBytes + 16 * kPanelColumns + 8 * kPanelColumns + kPanelColumns * (2 + 2);

// k is a multiple of kQ8KBlockInputs.
inline size_t q8k_panels_bytes(int32_t n, int32_t k) {
  return size_t(num_panels(n)) * size_t(k / kQ8KBlockInputs) * kQ8KPanelBlockBytes;
}

// A weight matrix [num_rows, k] (Hugging Face [out, in] layout).
struct Matrix {
  const void* data;
  MatrixFormat format;
};

// Elements per row of kQ8 data: k rounded up to whole pairs of 32-blocks.
inline int32_t q8_padded_k(int32_t k) { return (k + 63) / 64 * 64; }

// Rows of activations as a matmul reads them: fp32 x, plus the packed form when the kernel
// packs for this weight format (packed_row_bytes() > 0), and the calling thread's scratch for
// panels the kernel converts before use (panel_scratch_bytes() of it).
struct Activations {
  const float* x;
  size_t x_stride;
  const uint8_t* packed;
  size_t packed_stride;
  uint8_t* panel_scratch;
  // kQ4KPanels only: the 32-input sub-blocks [first_sub_block, end_sub_block) of k that the
  // matrix holds (a reduction segment zero-padded to whole super-blocks, row_parallel.h); the
  // others' activations are zero.
  int32_t first_sub_block = 0;
  int32_t end_sub_block = INT32_MAX;
};

struct ArgMax {
  int32_t index;
  float value;
};

struct KernelTable {
  cd_kernel kernel;
  // Bytes of one packed activation row for matmuls over this format; 0 when matmul reads x.
  size_t (*packed_row_bytes)(MatrixFormat format, int32_t k);
  // Bytes of per-thread scratch a matmul of num_rows rows over this format converts panels into;
  // 0 when it reads the weights as stored.
  size_t (*panel_scratch_bytes)(MatrixFormat format, int32_t k, int32_t num_rows);
  // Packs rows of x (each independently) into packed_stride-spaced rows.
  void (*pack_rows)(const float* x, size_t x_stride, int32_t num_rows, int32_t k, MatrixFormat format,
                    uint8_t* packed, size_t packed_stride);
  // y[m * y_stride + n] = dot(row m of a, row n of w) for m in [0, num_rows), n in [n_begin, n_end);
  // with accumulate, y[...] += that dot instead (one add of the same value).
  void (*matmul)(const Activations& a, int32_t num_rows, int32_t k, const Matrix& w, int32_t n_begin,
                 int32_t n_end, float* y, size_t y_stride, bool accumulate);
  // dot(a, b) over n elements; b is of dtype b_dtype.
  float (*dot)(const float* a, const void* b, cd_dtype b_dtype, int32_t n);
  // out[r] = dot(a, row r) for num_rows contiguous rows of n elements (attention's keys of one
  // cache block), each key in one fixed order.
  void (*dot_rows)(const float* a, const void* rows, cd_dtype dtype, int32_t num_rows, int32_t n, float* out);
  // The largest of x[0, n) and its lowest index (n >= 1).
  ArgMax (*argmax)(const float* x, int32_t n);
  // scores[j] = e^(scores[j] * scale - max) in place (attention's softmax numerators); returns
  // their sum, in a fixed order for a given n. A finite sink (gpt-oss's per-head logit) joins the
  // maximum and adds e^(sink - max) to the sum last; -infinity leaves both alone.
  float (*softmax_numerators)(float* scores, int32_t n, float scale, float sink);
  // x[i] = cap * tanh(x[i] * scale / cap) in place (Gemma's soft-capping of scores and logits).
  void (*softcap)(float* x, int32_t n, float scale, float cap);
  // sum_j e^(x[j] - shift) for x[j] <= shift (a log-softmax's denominator), in a fixed order.
  double (*sum_exp)(const float* x, int32_t n, float shift);
  // out[i] = silu(gate[i]) * up[i]; out may be gate.
  void (*swiglu)(const float* gate, const float* up, int32_t n, float* out);
  // out[i] = gelu_tanh(gate[i]) * up[i] (PyTorch's gelu(approximate="tanh")); out may be gate.
  void (*gelu_tanh_gate)(const float* gate, const float* up, int32_t n, float* out);
  // gpt-oss: g = min(gate, limit), u = clamp(up, -limit, limit), out = (u + 1) * g * sigmoid(alpha * g).
  void (*clamped_swiglu)(const float* gate, const float* up, int32_t n, float alpha, float limit, float* out);
  // y += alphas[r] * row r, for r in order (attention's values of one cache block).
  void (*axpy_rows)(const float* alphas, const void* rows, cd_dtype dtype, int32_t num_rows, int32_t n, float* y);
  // y[i] += acc, acc = w_0 v_0[i] then acc + w_r v_r[i] for r in order, v_r = rows[r] (+ biases[r]
  // where not null), num_rows >= 1: a MoE token's expert outputs. One chain per element, multiplies and adds
  // apart (never fused), so every path gives the bits of the plain loop.
  void (*add_weighted_rows)(const float* const* rows, const float* const* biases, const float* weights, int32_t num_rows,
                            int32_t n, float* y);

  // Attention over a bf16 cache in KvLayout::kBf16Pairs (model.h), for the num_heads query heads
  // that share one kv head's keys and values (head h's query at q + h * head_dim, its output at
  // out + h * head_dim). avx512 splits each query and its softmax numerators into bf16 high and
  // low halves for vdpbf16ps, in the caller's scratch (2 x head_dim and 2 x the numerators'
  // range); the others widen the cache to fp32, once for all the heads, and leave the scratch
  // alone.
  //
  // scores[h * scores_stride + 16 g + i] = q_h · key i of group g, for num_groups groups of 16
  // keys; group g's dims come in pairs, pair d of its 16 keys at key_groups[g] + d *
  // key_pair_stride. Every score accumulates its pairs in one fixed pattern, whatever the number
  // of groups or heads. q_scratch: 4 x head_dim elements.
  void (*score_key_groups)(const float* q, int32_t num_heads, uint16_t* q_scratch, const uint16_t* const* key_groups,
                           int32_t num_groups, size_t key_pair_stride, int32_t head_dim, float* scores,
                           size_t scores_stride);
  // out_h = sum of numerators[h * numerators_stride + i] * value i over the visible i in [skip,
  // skip + num_visible), value i in slot pair i / 2 at value_groups[i / 16] + (i / 2 % 8) * 2 *
  // head_dim (so i = 0 is an even slot); each output in one fixed pattern for a given range.
  // Slots outside the range are never read into a sum (they may hold anything, NaN included).
  // probs_scratch: 4 x (skip + num_visible + 1) elements per two heads.
  void (*sum_value_groups)(const float* numerators, size_t numerators_stride, int32_t num_heads, int32_t skip,
                           int32_t num_visible, uint16_t* probs_scratch, const uint16_t* const* value_groups,
                           int32_t head_dim, float* out);

  // A row-parallel matmul (row_parallel.h) over kSummedSegments segments of kBf16Panels, in one
  // pass; null where the table has none. y[m * y_stride + n] (+)= ((c0 + c1) + (c2 + c3)) +
  // ((c4 + c5) + (c6 + c7)), c_s the chain of segment s, exactly what matmul per segment and then
  // that tree give, for n in [n_begin, n_end) (whole panels from a panel boundary, as matmul's).
  // Segment s: segment_k[s] inputs (0 gives a zero chain), weights segments[s], rows packed[s]
  // (pack_rows' form, packed_stride apart).
  void (*matmul_summed_bf16_segments)(const uint8_t* const* packed, size_t packed_stride, const int32_t* segment_k,
                                      const Matrix* segments, int32_t num_rows, int32_t n_begin, int32_t n_end, float* y,
                                      size_t y_stride, bool accumulate) = nullptr;
};

constexpr int32_t kSummedSegments = 8;

const KernelTable& kernels_scalar();
const KernelTable& kernels_avx2();
const KernelTable& kernels_avx512();
// avx512's table with bf16 matmuls on AMX tiles (kernels_amx.cc); only where amx_support().usable.
const KernelTable& kernels_amx();

}  // namespace conduit
