// Row-parallel matmuls (o_proj, down_proj: the ones tensor parallelism splits along their inputs)
// as a sum in an order fixed by the model, not by the number of ranks. The inputs are cut into
// kReductionSegments segments; each segment's product is one chain per output, as every matmul's
// is, into its own fp32 partial; the partials meet in one fixed tree. A rank holds whole segments,
// so at every tensor-parallel size, 1 included, each output is the same tree of the same chains:
// bitwise the same logits at TP = 1, 2, 4 and 8.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "kernels.h"
#include "matmul.h"
#include "thread_pool.h"

namespace conduit {

// The largest tensor-parallel size supported: a rank holds kReductionSegments / tp_size segments.
constexpr int32_t kReductionSegments = 8;

// A [n, k] matrix cut along k: segment s covers inputs [k_begin[s], k_begin[s + 1]) of the whole
// matrix (k_begin[s] = floor(s * k / kReductionSegments), so a rank's share of the heads or of
// the MLP columns is whole segments), each packed on its own. On a rank, the segments other ranks
// hold have no data.
struct SegmentedMatrix {
  std::array<int32_t, kReductionSegments + 1> k_begin{};
  std::array<Matrix, kReductionSegments> segments{};
  // A Q4_K segment that does not cover whole super-blocks of the file keeps Q4_K: its matrix holds
  // the super-blocks it touches (padded_k inputs, 0 when not padded), its own inputs starting
  // lead_inputs in. Its activations are packed zero-padded the same way, so each super-block's
  // activation scale is over the segment's own inputs only, whichever rank packs it, and the
  // kernel skips the sub-blocks outside it.
  std::array<int32_t, kReductionSegments> padded_k{};
  std::array<int32_t, kReductionSegments> lead_inputs{};
};

inline int32_t segment_begin(int64_t k, int32_t segment) { return int32_t(k * segment / kReductionSegments); }

struct SegmentScratch {
  std::vector<std::vector<float>> prepared_per_thread;
  std::vector<std::vector<uint8_t>> packed_per_thread;  // [threads][segments × rows × stride]
  std::vector<uint8_t> packed_shared;
  std::vector<std::vector<uint8_t>> panel_per_thread;
  std::vector<std::vector<float>> padded_per_thread;  // a padded segment's row before packing
  std::vector<uint8_t> ready_per_thread;  // whether the thread prepared and packed its copy this call
  std::vector<std::vector<float>> tile_partials_per_thread;  // summed_segment_matmuls: a lead of n, then [segments][block rows][tile]
};

// Rows per task of summed_segment_matmuls: a multiple of every kernel's row tile (1, 6), few
// enough that a task's eight partials of one column tile stay in L1/L2.
constexpr int32_t kSummedRowBlock = 48;

// partials[s][row][n] = input rows' segment s · W_s^T for s in [first_segment, end_segment). The
// input rows hold the inputs [input_k_begin, input_k_begin + input_k) of the whole matrix (a
// rank's own heads or MLP columns); prepare, when set, computes them first (matmul.h).
void segment_matmuls(ThreadPool& pool, const KernelTable& kernels, const MatmulInput& input, int32_t num_rows,
                     int32_t input_k_begin, int32_t input_k, const SegmentedMatrix& w, int32_t first_segment,
                     int32_t end_segment, int32_t n, float* partials, SegmentScratch& scratch);

// y (+)= the tree of all kReductionSegments segments' products, bitwise as segment_matmuls then
// combine_segments, for a process that holds every segment (no tensor parallelism). Each task is
// one column tile of a block of rows: its eight partials live in the thread's scratch and are
// summed as soon as they are computed, instead of eight [rows, n] partials written out, read back
// and summed in a pass of their own. For many rows (prefill): the inputs are prepared and packed
// once, shared. sums_segments_in_tiles says where it applies: more than one block of rows (in
// one block, the tasks are only the column tiles, 12 at hidden 768, too few for the threads to
// finish together; segment_matmuls has eight times as many), for kernels that read their panels as
// stored (one that converts each panel into scratch first would redo it per block of rows).
bool sums_segments_in_tiles(const KernelTable& kernels, const SegmentedMatrix& w, int32_t num_rows);
void summed_segment_matmuls(ThreadPool& pool, const KernelTable& kernels, const MatmulInput& input, int32_t num_rows,
                            int32_t k, const SegmentedMatrix& w, int32_t n, float* y, bool accumulate,
                            SegmentScratch& scratch);

// y = tree(partials) (or y += it, one add): ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)) per element.
void combine_segments(ThreadPool& pool, const float* partials, int32_t num_rows, int32_t n, float* y, size_t y_stride,
                      bool accumulate);

}  // namespace conduit
