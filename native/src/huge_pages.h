// Huge pages for the buffers every step streams through: the weight matrices and the KV cache.
// On 4 KiB pages each 4 KiB of a stream costs a TLB miss and a page walk, and the hardware
// prefetchers stop at every page boundary; a MoE step reads a thousand small expert matrices
// (measured, AMD EPYC avx512, the bench:moe models, one thread: batch-32 MoE decode 30% more
// tokens per CPU-second on 2 MiB pages, dense 7%). Linux gives transparent huge pages in madvise
// mode (the common default) only to ranges advised so, and only to whole aligned 2 MiB pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace conduit {

constexpr size_t kHugePageBytes = size_t(2) << 20;

// Advises huge pages for the whole huge pages inside [data, data + size_bytes); a no-op where
// the kernel has none.
void advise_huge_pages(void* data, size_t size_bytes);

// Storage for packed matrices, owned until the arena dies, 64-byte aligned: a buffer of its own
// on huge pages for a matrix of a huge page or more; smaller ones (a MoE layer's experts) packed
// one after another into shared huge-page slabs, so they too avoid 4 KiB pages. A slab wastes
// at most its tail, under one huge page.
class MatrixArena {
 public:
  MatrixArena() = default;
  ~MatrixArena();
  MatrixArena(const MatrixArena&) = delete;
  MatrixArena& operator=(const MatrixArena&) = delete;

  // Uninitialized; throws Error(CD_ERR_OUT_OF_MEMORY) on failure.
  uint8_t* allocate(size_t size_bytes);

 private:
  static constexpr size_t kSlabBytes = 16 * kHugePageBytes;

  uint8_t* allocate_buffer(size_t size_bytes);

  std::vector<void*> buffers_;
  uint8_t* slab_next_ = nullptr;
  size_t slab_bytes_left_ = 0;
};

}  // namespace conduit
