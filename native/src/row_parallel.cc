#include "row_parallel.h"

#include <algorithm>
#include <cstring>

namespace conduit {

namespace {

constexpr int32_t kColumnTile = kPanelColumns;
// As parallel_matmuls: a decode's few rows are prepared (one or two) and packed (up to 8) by every
// thread for itself, which costs less than one more hand-off.
constexpr int32_t kMaxRowsPackedPerThread = 8;
constexpr int32_t kMaxRowsPreparedPerThread = 2;

template <typename T>
void grow_each(std::vector<std::vector<T>>& buffers, size_t count, size_t size) {
  buffers.resize(count);
  for (std::vector<T>& buffer : buffers) {
    if (buffer.size() < size) buffer.resize(size);
  }
}

int32_t segment_k(const SegmentedMatrix& w, int32_t s) { return w.k_begin[size_t(s) + 1] - w.k_begin[size_t(s)]; }

// Inputs of segment s as its matrix and packed rows hold them.
int32_t packed_k(const SegmentedMatrix& w, int32_t s) {
  return w.padded_k[size_t(s)] != 0 ? w.padded_k[size_t(s)] : segment_k(w, s);
}

// Rows [row_begin, row_end) of segment s's inputs packed into its slice of packed (segments from
// first_segment, packed_segment_bytes apart). Each segment's slice is packed as a matrix of its own
// k, so its bytes are the same whichever rank packs it. x holds inputs [input_k_begin,
// input_k_begin + input_k) of the whole matrix.
void pack_segment_rows(const KernelTable& kernels, const SegmentedMatrix& w, MatrixFormat format, const float* x,
                       int32_t input_k_begin, int32_t input_k, int32_t s, int32_t first_segment, size_t packed_stride,
                       size_t packed_segment_bytes, int32_t row_begin, int32_t row_end, uint8_t* packed,
                       std::vector<std::vector<float>>& padded_per_thread, int32_t thread_index) {
  const int32_t k = segment_k(w, s);
  if (k == 0) return;
  const float* segment_x = x + size_t(w.k_begin[size_t(s)] - input_k_begin);
  uint8_t* segment_packed = packed + size_t(s - first_segment) * packed_segment_bytes;
  const int32_t padded_k = w.padded_k[size_t(s)];
  if (padded_k == 0) {
    kernels.pack_rows(segment_x + size_t(row_begin) * size_t(input_k), size_t(input_k), row_end - row_begin, k, format,
                      segment_packed + size_t(row_begin) * packed_stride, packed_stride);
    return;
  }
  float* padded = padded_per_thread[size_t(thread_index)].data();
  std::fill_n(padded, padded_k, 0.0f);
  for (int32_t row = row_begin; row < row_end; ++row) {
    std::copy_n(segment_x + size_t(row) * size_t(input_k), k, padded + w.lead_inputs[size_t(s)]);
    kernels.pack_rows(padded, size_t(padded_k), 1, padded_k, format, segment_packed + size_t(row) * packed_stride,
                      packed_stride);
  }
}

// Rows prepared (when prepares) and packed (when packs, by pack(thread_index, begin, end)) in one
// hand-off: each chunk's rows are packed by the thread that just prepared them.
template <typename Pack>
void prepare_and_pack_shared(ThreadPool& pool, const MatmulInput& input, int32_t num_rows, int32_t k, bool prepares,
                             bool packs, const Pack& pack) {
  if (!prepares && !packs) return;
  pool.parallel_for(num_rows, rows_per_chunk(k), [&](int32_t thread_index, int32_t begin, int32_t end) {
    if (prepares) {
      for (int32_t row = begin; row < end; ++row) input.prepare(input.context, row, input.x + size_t(row) * size_t(k));
    }
    if (packs) pack(thread_index, begin, end);
  });
}

}  // namespace

void segment_matmuls(ThreadPool& pool, const KernelTable& kernels, const MatmulInput& input, int32_t num_rows,
                     int32_t input_k_begin, int32_t input_k, const SegmentedMatrix& w, int32_t first_segment,
                     int32_t end_segment, int32_t n, float* partials, SegmentScratch& scratch) {
  const size_t partial_size = size_t(num_rows) * size_t(n);
  const MatrixFormat format = w.segments[size_t(first_segment)].format;
  int32_t widest_k = 0;
  int32_t widest_padded_k = 0;
  for (int32_t s = first_segment; s < end_segment; ++s) {
    widest_k = std::max(widest_k, packed_k(w, s));
    widest_padded_k = std::max(widest_padded_k, w.padded_k[size_t(s)]);
    // A model narrower than kReductionSegments inputs leaves some segments empty: their partial is 0.
    if (segment_k(w, s) == 0) std::fill_n(partials + size_t(s) * partial_size, partial_size, 0.0f);
  }
  const size_t packed_stride = kernels.packed_row_bytes(format, widest_k);
  const size_t packed_segment_bytes = size_t(num_rows) * packed_stride;
  const size_t num_segments = size_t(end_segment - first_segment);
  const size_t num_threads = size_t(pool.num_threads());
  const bool prepares_per_thread = input.prepare != nullptr && num_rows <= kMaxRowsPreparedPerThread;
  const bool packs_per_thread = packed_stride > 0 && num_rows <= kMaxRowsPackedPerThread;
  if (prepares_per_thread) grow_each(scratch.prepared_per_thread, num_threads, size_t(num_rows) * size_t(input_k));
  if (packs_per_thread) grow_each(scratch.packed_per_thread, num_threads, num_segments * packed_segment_bytes);
  const size_t panel_scratch_bytes = kernels.panel_scratch_bytes(format, widest_k, num_rows);
  if (panel_scratch_bytes > 0) grow_each(scratch.panel_per_thread, num_threads, panel_scratch_bytes);
  if (widest_padded_k > 0) grow_each(scratch.padded_per_thread, num_threads, size_t(widest_padded_k));
  const auto pack_segment = [&](const float* x, int32_t s, int32_t row_begin, int32_t row_end, uint8_t* packed,
                                int32_t thread_index) {
    pack_segment_rows(kernels, w, format, x, input_k_begin, input_k, s, first_segment, packed_stride, packed_segment_bytes,
                      row_begin, row_end, packed, scratch.padded_per_thread, thread_index);
  };
  const bool prepares_shared = input.prepare != nullptr && !prepares_per_thread;
  const bool packs_shared = packed_stride > 0 && !packs_per_thread;
  if (packs_shared && scratch.packed_shared.size() < num_segments * packed_segment_bytes) scratch.packed_shared.resize(num_segments * packed_segment_bytes);
  prepare_and_pack_shared(pool, input, num_rows, input_k, prepares_shared, packs_shared, [&](int32_t thread_index, int32_t begin, int32_t end) {
    for (int32_t s = first_segment; s < end_segment; ++s) pack_segment(input.x, s, begin, end, scratch.packed_shared.data(), thread_index);
  });
  const int32_t tiles_per_segment = (n + kColumnTile - 1) / kColumnTile;
  scratch.ready_per_thread.assign(num_threads, 0);
  pool.parallel_for(int32_t(num_segments) * tiles_per_segment, 1, [&](int32_t thread_index, int32_t task_begin, int32_t task_end) {
    float* own_x = prepares_per_thread ? scratch.prepared_per_thread[size_t(thread_index)].data() : nullptr;
    uint8_t* own_packed = packs_per_thread ? scratch.packed_per_thread[size_t(thread_index)].data() : nullptr;
    const float* x = own_x != nullptr ? own_x : input.x;
    const uint8_t* packed = own_packed != nullptr ? own_packed : scratch.packed_shared.data();
    if (!scratch.ready_per_thread[size_t(thread_index)]) {
      scratch.ready_per_thread[size_t(thread_index)] = 1;
      if (own_x != nullptr) {
        for (int32_t row = 0; row < num_rows; ++row) input.prepare(input.context, row, own_x + size_t(row) * size_t(input_k));
      }
      if (own_packed != nullptr) {
        for (int32_t s = first_segment; s < end_segment; ++s) pack_segment(x, s, 0, num_rows, own_packed, thread_index);
      }
    }
    uint8_t* panel_scratch = panel_scratch_bytes > 0 ? scratch.panel_per_thread[size_t(thread_index)].data() : nullptr;
    // Consecutive tiles of one segment go to the kernel in one call.
    for (int32_t task = task_begin; task < task_end;) {
      const int32_t s = first_segment + task / tiles_per_segment;
      const int32_t tile_begin = task % tiles_per_segment;
      const int32_t tile_end = std::min(tiles_per_segment, tile_begin + (task_end - task));
      task += tile_end - tile_begin;
      const int32_t k = segment_k(w, s);
      if (k == 0) continue;
      Activations activations{x + size_t(w.k_begin[size_t(s)] - input_k_begin), size_t(input_k),
                              packed + size_t(s - first_segment) * packed_segment_bytes, packed_stride, panel_scratch};
      if (w.padded_k[size_t(s)] != 0) {
        activations.first_sub_block = w.lead_inputs[size_t(s)] / 32;
        activations.end_sub_block = (w.lead_inputs[size_t(s)] + k) / 32;
      }
      kernels.matmul(activations, num_rows, packed_k(w, s), w.segments[size_t(s)], tile_begin * kColumnTile,
                     std::min(tile_end * kColumnTile, n), partials + size_t(s) * partial_size, size_t(n), false);
    }
  });
}

namespace {

// Elements p[0], p[columns], ..., p[7 * columns] of count consecutive outputs summed in the one
// tree every path uses, into out (or added to it, one add).
void tree_sum(const float* p, size_t partial_size, int32_t count, float* out, bool accumulate) {
  static_assert(kReductionSegments == 8, "the tree below combines eight segments");
  for (int32_t i = 0; i < count; ++i) {
    const float* e = p + i;
    const float sum = ((e[0] + e[partial_size]) + (e[2 * partial_size] + e[3 * partial_size])) +
                      ((e[4 * partial_size] + e[5 * partial_size]) + (e[6 * partial_size] + e[7 * partial_size]));
    out[i] = accumulate ? out[i] + sum : sum;
  }
}

}  // namespace

void combine_segments(ThreadPool& pool, const float* partials, int32_t num_rows, int32_t n, float* y, size_t y_stride,
                      bool accumulate) {
  const size_t partial_size = size_t(num_rows) * size_t(n);
  pool.parallel_for(num_rows, rows_per_chunk(int64_t(kReductionSegments) * n), [&](int32_t, int32_t begin, int32_t end) {
    for (int32_t row = begin; row < end; ++row) {
      tree_sum(partials + size_t(row) * size_t(n), partial_size, n, y + size_t(row) * y_stride, accumulate);
    }
  });
}

bool sums_segments_in_tiles(const KernelTable& kernels, const SegmentedMatrix& w, int32_t num_rows) {
  if (num_rows <= kSummedRowBlock) return false;
  for (int32_t s = 0; s < kReductionSegments; ++s) {
    if (kernels.panel_scratch_bytes(w.segments[size_t(s)].format, packed_k(w, s), num_rows) > 0) return false;
  }
  return true;
}

void summed_segment_matmuls(ThreadPool& pool, const KernelTable& kernels, const MatmulInput& input, int32_t num_rows,
                            int32_t k, const SegmentedMatrix& w, int32_t n, float* y, bool accumulate,
                            SegmentScratch& scratch) {
  const MatrixFormat format = w.segments[0].format;
  int32_t widest_k = 0;
  int32_t widest_padded_k = 0;
  for (int32_t s = 0; s < kReductionSegments; ++s) {
    widest_k = std::max(widest_k, packed_k(w, s));
    widest_padded_k = std::max(widest_padded_k, w.padded_k[size_t(s)]);
  }
  const size_t packed_stride = kernels.packed_row_bytes(format, widest_k);
  const size_t packed_segment_bytes = size_t(num_rows) * packed_stride;
  const size_t num_threads = size_t(pool.num_threads());
  const size_t panel_scratch_bytes = kernels.panel_scratch_bytes(format, widest_k, kSummedRowBlock);
  if (panel_scratch_bytes > 0) grow_each(scratch.panel_per_thread, num_threads, panel_scratch_bytes);
  if (widest_padded_k > 0) grow_each(scratch.padded_per_thread, num_threads, size_t(widest_padded_k));
  const size_t tile_partial_size = size_t(kSummedRowBlock) * kColumnTile;
  // The kernels write output column c at y + c, so a tile's partial is handed over as partial -
  // n_begin; the first n floats of each thread's buffer are a lead that keeps that pointer inside it.
  const size_t lead = size_t(n);
  grow_each(scratch.tile_partials_per_thread, num_threads, lead + size_t(kReductionSegments) * tile_partial_size);
  if (packed_stride > 0 && scratch.packed_shared.size() < kReductionSegments * packed_segment_bytes) scratch.packed_shared.resize(kReductionSegments * packed_segment_bytes);
  prepare_and_pack_shared(pool, input, num_rows, k, input.prepare != nullptr, packed_stride > 0, [&](int32_t thread_index, int32_t begin, int32_t end) {
    for (int32_t s = 0; s < kReductionSegments; ++s) {
      pack_segment_rows(kernels, w, format, input.x, 0, k, s, 0, packed_stride, packed_segment_bytes, begin, end,
                        scratch.packed_shared.data(), scratch.padded_per_thread, thread_index);
    }
  });
  // Tasks are (column tile, block of rows), the row block varying fastest: a thread's next task
  // mostly reads the same weight columns, and the last tasks are small, so the threads finish
  // close together.
  const int32_t num_tiles = (n + kColumnTile - 1) / kColumnTile;
  const int32_t num_row_blocks = (num_rows + kSummedRowBlock - 1) / kSummedRowBlock;
  // The kernel's one-pass form where it has one: the same chains and tree, without the partials'
  // round trip through memory and the separate adds (bf16 panels as stored, none padded).
  static_assert(kSummedSegments == kReductionSegments, "the kernels' one-pass sum takes the model's segments");
  bool one_pass = kernels.matmul_summed_bf16_segments != nullptr;
  std::array<int32_t, kReductionSegments> segment_inputs{};
  for (int32_t s = 0; s < kReductionSegments; ++s) {
    one_pass = one_pass && w.segments[size_t(s)].format == MatrixFormat::kBf16Panels && w.padded_k[size_t(s)] == 0;
    segment_inputs[size_t(s)] = segment_k(w, s);
  }
  pool.parallel_for(num_tiles * num_row_blocks, 1, [&](int32_t thread_index, int32_t task_begin, int32_t task_end) {
    uint8_t* panel_scratch = panel_scratch_bytes > 0 ? scratch.panel_per_thread[size_t(thread_index)].data() : nullptr;
    float* tile_partials = scratch.tile_partials_per_thread[size_t(thread_index)].data() + lead;
    for (int32_t task = task_begin; task < task_end; ++task) {
      const int32_t n_begin = (task / num_row_blocks) * kColumnTile;
      const int32_t n_end = std::min(n_begin + kColumnTile, n);
      const int32_t row_begin = (task % num_row_blocks) * kSummedRowBlock;
      const int32_t block_rows = std::min(kSummedRowBlock, num_rows - row_begin);
      if (one_pass) {
        std::array<const uint8_t*, kReductionSegments> packed{};
        for (int32_t s = 0; s < kReductionSegments; ++s) {
          packed[size_t(s)] = scratch.packed_shared.data() + size_t(s) * packed_segment_bytes + size_t(row_begin) * packed_stride;
        }
        kernels.matmul_summed_bf16_segments(packed.data(), packed_stride, segment_inputs.data(), w.segments.data(), block_rows,
                                            n_begin, n_end, y + size_t(row_begin) * size_t(n), size_t(n), accumulate);
        continue;
      }
      for (int32_t s = 0; s < kReductionSegments; ++s) {
        float* partial = tile_partials + size_t(s) * tile_partial_size;
        const int32_t segment_inputs = segment_k(w, s);
        if (segment_inputs == 0) {
          std::fill_n(partial, tile_partial_size, 0.0f);
          continue;
        }
        Activations activations{input.x + size_t(w.k_begin[size_t(s)]) + size_t(row_begin) * size_t(k), size_t(k),
                                packed_stride > 0 ? scratch.packed_shared.data() + size_t(s) * packed_segment_bytes + size_t(row_begin) * packed_stride : nullptr,
                                packed_stride, panel_scratch};
        if (w.padded_k[size_t(s)] != 0) {
          activations.first_sub_block = w.lead_inputs[size_t(s)] / 32;
          activations.end_sub_block = (w.lead_inputs[size_t(s)] + segment_inputs) / 32;
        }
        // The tile's partial, kColumnTile wide, holds columns from n_begin (the lead above).
        kernels.matmul(activations, block_rows, packed_k(w, s), w.segments[size_t(s)], n_begin, n_end, partial - n_begin,
                       size_t(kColumnTile), false);
      }
      for (int32_t r = 0; r < block_rows; ++r) {
        tree_sum(tile_partials + size_t(r) * kColumnTile, tile_partial_size, n_end - n_begin,
                 y + size_t(row_begin + r) * size_t(n) + n_begin, accumulate);
      }
    }
  });
}

}  // namespace conduit
