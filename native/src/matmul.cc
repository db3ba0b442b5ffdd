#include "matmul.h"

#include <algorithm>

namespace conduit {

namespace {

// Output columns are handed to threads in tiles of this many, to keep cache lines unshared.
constexpr int32_t kColumnTile = 16;

}  // namespace

void parallel_matmuls(ThreadPool& pool, const KernelTable& kernels, const float* x, int32_t num_rows,
                      int32_t k, std::initializer_list<MatmulJob> jobs, std::vector<uint8_t>& packed) {
  const MatrixFormat format = jobs.begin()->weight.format;
  Activations activations{x, size_t(k), nullptr, kernels.packed_row_bytes(format, k)};
  if (activations.packed_stride > 0) {
    const size_t packed_bytes = size_t(num_rows) * activations.packed_stride;
    if (packed.size() < packed_bytes) packed.resize(packed_bytes);
    pool.parallel_for(num_rows, [&](int32_t, int32_t begin, int32_t end) {
      kernels.pack_rows(x + size_t(begin) * size_t(k), size_t(k), end - begin, k, format,
                        &packed[size_t(begin) * activations.packed_stride], activations.packed_stride);
    });
    activations.packed = packed.data();
  }
  int32_t num_tiles = 0;
  for (const MatmulJob& job : jobs) num_tiles += (job.num_columns + kColumnTile - 1) / kColumnTile;
  pool.parallel_for(num_tiles, [&](int32_t, int32_t tile_begin, int32_t tile_end) {
    int32_t first_tile_of_job = 0;
    for (const MatmulJob& job : jobs) {
      const int32_t job_tiles = (job.num_columns + kColumnTile - 1) / kColumnTile;
      const int32_t begin = std::max(tile_begin, first_tile_of_job) - first_tile_of_job;
      const int32_t end = std::min(tile_end, first_tile_of_job + job_tiles) - first_tile_of_job;
      if (begin < end) {
        kernels.matmul(activations, num_rows, k, job.weight, begin * kColumnTile,
                       std::min(end * kColumnTile, job.num_columns), job.y, size_t(job.num_columns));
      }
      first_tile_of_job += job_tiles;
    }
  });
}

}  // namespace conduit
