#include "matmul.h"

#include <algorithm>

namespace conduit {

namespace {

// Output columns are handed to threads in tiles of this many: whole kBf16Panels panels, and
// cache lines unshared.
constexpr int32_t kColumnTile = kPanelColumns;
// Up to this many rows (decode), every thread packs all of them for itself inside the matmul's
// own parallel_for: a little duplicated work instead of one more hand-off between threads. The
// bytes are the same either way, so no value depends on the choice.
constexpr int32_t kMaxRowsPackedPerThread = 8;
// prepare() (a norm, SwiGLU's exponentials) costs more per row than packing: duplicated only for
// a batch of one or two.
constexpr int32_t kMaxRowsPreparedPerThread = 2;

template <typename T>
void grow_each(std::vector<std::vector<T>>& buffers, size_t count, size_t size) {
  buffers.resize(count);
  for (std::vector<T>& buffer : buffers) {
    if (buffer.size() < size) buffer.resize(size);
  }
}

}  // namespace

namespace {

// Jobs of one weight format: their activations are packed once, for that format.
void matmuls_of_one_format(ThreadPool& pool, const KernelTable& kernels, const MatmulInput& input,
                           int32_t num_rows, int32_t k, const MatmulJob* first_job, const MatmulJob* end_job,
                           MatmulScratch& scratch) {
  const MatrixFormat format = first_job->weight.format;
  const size_t packed_stride = kernels.packed_row_bytes(format, k);
  const size_t num_threads = size_t(pool.num_threads());
  const bool prepares_per_thread = input.prepare != nullptr && num_rows <= kMaxRowsPreparedPerThread;
  const bool packs_per_thread = packed_stride > 0 && num_rows <= kMaxRowsPackedPerThread;
  if (prepares_per_thread) grow_each(scratch.prepared_per_thread, num_threads, size_t(num_rows) * size_t(k));
  if (packs_per_thread) grow_each(scratch.per_thread, num_threads, size_t(num_rows) * packed_stride);
  const size_t panel_scratch_bytes = kernels.panel_scratch_bytes(format, k, num_rows);
  if (panel_scratch_bytes > 0) grow_each(scratch.panel_per_thread, num_threads, panel_scratch_bytes);
  // Rows prepared and packed in one hand-off: each chunk's rows are packed by the thread that
  // just prepared them.
  const bool prepares_shared = input.prepare != nullptr && !prepares_per_thread;
  const bool packs_shared = packed_stride > 0 && !packs_per_thread;
  if (packs_shared && scratch.shared.size() < size_t(num_rows) * packed_stride) scratch.shared.resize(size_t(num_rows) * packed_stride);
  if (prepares_shared || packs_shared) {
    pool.parallel_for(num_rows, rows_per_chunk(k), [&](int32_t, int32_t begin, int32_t end) {
      if (prepares_shared) {
        for (int32_t row = begin; row < end; ++row) input.prepare(input.context, row, input.x + size_t(row) * size_t(k));
      }
      if (packs_shared) {
        kernels.pack_rows(input.x + size_t(begin) * size_t(k), size_t(k), end - begin, k, format,
                          &scratch.shared[size_t(begin) * packed_stride], packed_stride);
      }
    });
  }
  int32_t num_tiles = 0;
  for (const MatmulJob* job = first_job; job != end_job; ++job) num_tiles += (job->num_columns + kColumnTile - 1) / kColumnTile;
  // Each thread prepares and packs its own rows once, on its first chunk.
  std::vector<Activations>& activations_of = scratch.activations_per_thread;
  activations_of.assign(num_threads, Activations{nullptr, 0, nullptr, 0, nullptr});
  // Claimed dynamically: the two vCPUs rarely stream memory equally fast, and a static half
  // each leaves the faster one waiting.
  pool.parallel_for(num_tiles, 1, [&](int32_t thread_index, int32_t tile_begin, int32_t tile_end) {
    Activations& activations = activations_of[size_t(thread_index)];
    if (activations.x == nullptr) {
      activations = Activations{input.x, size_t(k), scratch.shared.data(), packed_stride,
                                panel_scratch_bytes > 0 ? scratch.panel_per_thread[size_t(thread_index)].data() : nullptr};
      if (prepares_per_thread) {
        float* own = scratch.prepared_per_thread[size_t(thread_index)].data();
        for (int32_t row = 0; row < num_rows; ++row) input.prepare(input.context, row, own + size_t(row) * size_t(k));
        activations.x = own;
      }
      if (packs_per_thread) {
        uint8_t* own = scratch.per_thread[size_t(thread_index)].data();
        kernels.pack_rows(activations.x, size_t(k), num_rows, k, format, own, packed_stride);
        activations.packed = own;
      }
    }
    int32_t first_tile_of_job = 0;
    for (const MatmulJob* each = first_job; each != end_job; ++each) {
      const MatmulJob& job = *each;
      const int32_t job_tiles = (job.num_columns + kColumnTile - 1) / kColumnTile;
      const int32_t begin = std::max(tile_begin, first_tile_of_job) - first_tile_of_job;
      const int32_t end = std::min(tile_end, first_tile_of_job + job_tiles) - first_tile_of_job;
      if (begin < end) {
        kernels.matmul(activations, num_rows, k, job.weight, begin * kColumnTile,
                       std::min(end * kColumnTile, job.num_columns), job.y, size_t(job.num_columns),
                       job.accumulate);
      }
      first_tile_of_job += job_tiles;
    }
  });
}

}  // namespace

void parallel_matmuls(ThreadPool& pool, const KernelTable& kernels, const MatmulInput& input,
                      int32_t num_rows, int32_t k, std::initializer_list<MatmulJob> jobs,
                      MatmulScratch& scratch) {
  // A mixed GGUF (Q4_K_M's Q6_K attn_v beside Q4_K q and k) gives one input matrices of different
  // formats, each of which reads activations packed its own way: one pass per run of a format.
  // Only the first runs a shared prepare (it fills input.x); private per-thread copies are redone.
  MatmulInput run_input = input;
  for (const MatmulJob* begin = jobs.begin(); begin != jobs.end();) {
    const MatmulJob* end = begin + 1;
    while (end != jobs.end() && end->weight.format == begin->weight.format) ++end;
    matmuls_of_one_format(pool, kernels, run_input, num_rows, k, begin, end, scratch);
    if (num_rows > kMaxRowsPreparedPerThread) run_input.prepare = nullptr;
    begin = end;
  }
}

}  // namespace conduit
