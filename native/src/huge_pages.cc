#include "huge_pages.h"

#include <sys/mman.h>

#include <cstdlib>
#include <string>

#include "error.h"

namespace conduit {

void advise_huge_pages(void* data, size_t size_bytes) {
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + size_bytes) / kHugePageBytes * kHugePageBytes;
  // Advice only: where the kernel refuses, the pages stay 4 KiB and everything still works.
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

MatrixArena::~MatrixArena() {
  for (void* buffer : buffers_) std::free(buffer);
}

uint8_t* MatrixArena::allocate_buffer(size_t size_bytes) {
  void* buffer = nullptr;
  if (posix_memalign(&buffer, kHugePageBytes, size_bytes) != 0) {
    throw Error(CD_ERR_OUT_OF_MEMORY, "cannot allocate " + std::to_string(size_bytes) + " bytes");
  }
  buffers_.push_back(buffer);
  advise_huge_pages(buffer, size_bytes);
  return static_cast<uint8_t*>(buffer);
}

uint8_t* MatrixArena::allocate(size_t size_bytes) {
  const size_t rounded = size_bytes == 0 ? 64 : (size_bytes + 63) / 64 * 64;
  if (rounded >= kHugePageBytes) return allocate_buffer(rounded);
  if (rounded > slab_bytes_left_) {
    slab_next_ = allocate_buffer(kSlabBytes);
    slab_bytes_left_ = kSlabBytes;
  }
  uint8_t* data = slab_next_;
  slab_next_ += rounded;
  slab_bytes_left_ -= rounded;
  return data;
}

}  // namespace conduit
