// Checkpoint files mapped into memory, and the converted copies that replace them. A tensor used
// in its stored dtype is read straight from the mapping; one that needs another dtype is
// converted into an owned buffer and its source pages are released, so never both stay resident.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "conduit.h"
#include "huge_pages.h"
#include "kernels.h"
#include "thread_pool.h"

namespace conduit {

struct FreeDeleter {
  void operator()(void* pointer) const;
};
using AlignedBuffer = std::unique_ptr<void, FreeDeleter>;

// 64-byte aligned (huge-page aligned and advised from a huge page up), uninitialized; throws Error(CD_ERR_OUT_OF_MEMORY) on failure.
AlignedBuffer allocate_aligned(size_t size_bytes);

class WeightStore {
 public:
  WeightStore(const char* const* file_paths, int32_t num_files);
  ~WeightStore();
  WeightStore(const WeightStore&) = delete;
  WeightStore& operator=(const WeightStore&) = delete;

  // The tensor's elements as dtype, each first rounded to precision when that is narrower than
  // the stored dtype (a bf16 model keeps its norm weights in fp32, but with bf16 values).
  // Resolving the same bytes twice (tied embeddings) returns the same pointer.
  const void* resolve(const cd_tensor_ref& ref, cd_dtype dtype, cd_dtype precision, ThreadPool& pool);

  // n elements of a vector (a norm weight, a bias) as fp32, rounded to precision as resolve() would;
  // strided views (every other element of an interleaved bias) are gathered.
  const float* resolve_vector(const cd_tensor_ref& ref, int32_t n, cd_dtype precision, ThreadPool& pool);

  // A [num_rows, k] matrix quantized at load into MatrixFormat::kQ8Panels (kernels.h), values
  // first rounded to precision as resolve() would. MXFP4 blocks become int8 blocks exactly (an
  // E2M1 value doubled is an integer of at most 12, and its scale halved is a power of two fp16
  // holds, from 2^-24 to 2^15); blocks whose scale fp16 cannot hold are quantized from their values.
  const uint8_t* quantize_q8_panels(const cd_tensor_ref& ref, int32_t num_rows, int32_t k, cd_dtype precision,
                                    ThreadPool& pool);

  // A [num_rows, k] matrix in MatrixFormat::kQ4Panels (kernels.h): GGUF's Q4_0 and Q4_K blocks
  // exactly; other weights (first rounded to precision) per 32 from their min and max, scale
  // (max - min) / 15 and codes round((w - min) / scale).
  const uint8_t* quantize_q4_panels(const cd_tensor_ref& ref, int32_t num_rows, int32_t k, cd_dtype precision,
                                    ThreadPool& pool);

  // A [num_rows, k] GGUF Q4_K matrix in MatrixFormat::kQ4KPanels (kernels.h), its blocks' values
  // moved, none changed; k and each row's first element are multiples of 256. It holds the
  // 32-input sub-blocks [first_sub_block, end_sub_block) (-1: k / 32) of each row (kernels.h,
  // q4k_held_block_bytes).
  const uint8_t* convert_q4k_panels(const cd_tensor_ref& ref, int32_t num_rows, int32_t k, ThreadPool& pool,
                                    int32_t first_sub_block = 0, int32_t end_sub_block = -1);

  // A [num_rows, k] GGUF Q5_K or Q6_K matrix in MatrixFormat::kQ8KPanels (kernels.h), its values
  // as stored; k and each row's first element are multiples of 256.
  const uint8_t* convert_q8k_panels(const cd_tensor_ref& ref, int32_t num_rows, int32_t k, ThreadPool& pool);

  // A [num_rows, k] matrix in a float panel format (kernels.h: kF32Panels, kF16Panels,
  // kBf16Panels), its values converted as resolve() would.
  const void* pack_panels(const cd_tensor_ref& ref, int32_t num_rows, int32_t k, MatrixFormat format, ThreadPool& pool);

  // Two matrices of one shape packed one after the other (an expert's gate and up): until
  // end_pair(), the first matrix packed takes a buffer twice its size and the second its other
  // half when it needs exactly as many bytes (else a buffer of its own). end_pair() then, when
  // asked to (the two share a format), interleaves their panels in place, first's panel p before
  // second's (one run per tile of both), and returns the pair's buffer; nullptr when it did not
  // (not side by side, or not asked: both matrices stay as packed).
  void begin_pair();
  const uint8_t* end_pair(int32_t num_panels, bool interleave);

  // n uninitialized floats the store owns (values derived at load).
  float* own_floats(int32_t n);

  // Unmaps the files no resolved tensor reads from any more.
  void release_unborrowed_files();

 private:
  struct MappedFile {
    std::string path;
    void* base = nullptr;
    size_t size_bytes = 0;
    int32_t num_borrowed_tensors = 0;
  };

  void unmap(MappedFile& file);
  // A packed matrix's bytes, from the arena (huge pages, huge_pages.h); inside a pair, the pair's
  // halves.
  uint8_t* allocate_matrix(size_t size_bytes);
  const uint8_t* base_of(int32_t file_index, uint64_t offset_bytes) const;

  std::vector<MappedFile> files_;
  std::vector<AlignedBuffer> converted_;
  MatrixArena matrices_;  // the packed and quantized matrices
  struct Pair {
    bool open = false;
    uint8_t* data = nullptr;  // both halves, once the first matrix is packed
    size_t half_bytes = 0;
    bool second_packed = false;
  } pair_;
  std::map<std::tuple<int32_t, uint64_t, cd_dtype, cd_dtype>, const void*> resolved_;
};

}  // namespace conduit
