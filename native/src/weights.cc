#include "weights.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "dtype.h"
#include "error.h"
#include "kernels.h"

namespace conduit {

namespace {

constexpr size_t kConversionChunkElements = size_t(1) << 16;

size_t page_size() { return size_t(sysconf(_SC_PAGESIZE)); }

// Drops the pages lying wholly inside [begin, begin + size_bytes) of a read-only file mapping;
// they would be read back from the file only if touched again, and they never are.
void release_pages(const uint8_t* begin, size_t size_bytes) {
  const uintptr_t page = page_size();
  const uintptr_t first = (reinterpret_cast<uintptr_t>(begin) + page - 1) / page * page;
  const uintptr_t last = (reinterpret_cast<uintptr_t>(begin) + size_bytes) / page * page;
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

// The fp16 scale may round below max|x| / 127; the clamp keeps |q| <= 127 for the kernels.
int8_t round_to_q8(float value, float scale) {
  if (scale == 0.0f) return 0;
  return int8_t(std::min(127.0f, std::max(-127.0f, std::nearbyint(value / scale))));
}

}  // namespace

void FreeDeleter::operator()(void* pointer) const { std::free(pointer); }

AlignedBuffer allocate_aligned(size_t size_bytes) {
  const size_t rounded = (size_bytes + 63) / 64 * 64;
  void* pointer = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (pointer == nullptr) {
    throw Error(CD_ERR_OUT_OF_MEMORY, "cannot allocate " + std::to_string(size_bytes) + " bytes");
  }
  return AlignedBuffer(pointer);
}

WeightStore::WeightStore(const char* const* file_paths, int32_t num_files) {
  files_.resize(size_t(num_files));
  for (int32_t i = 0; i < num_files; ++i) {
    MappedFile& file = files_[size_t(i)];
    file.path = file_paths[i];
    const int fd = open(file.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error(CD_ERR_IO, file.path + ": cannot open: " + std::strerror(errno));
    struct stat status;
    if (fstat(fd, &status) != 0) {
      const int saved = errno;
      close(fd);
      throw Error(CD_ERR_IO, file.path + ": cannot stat: " + std::strerror(saved));
    }
    file.size_bytes = size_t(status.st_size);
    void* base = mmap(nullptr, file.size_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    const int saved = errno;
    close(fd);
    if (base == MAP_FAILED) throw Error(CD_ERR_IO, file.path + ": cannot map: " + std::strerror(saved));
    file.base = base;
  }
}

WeightStore::~WeightStore() {
  for (MappedFile& file : files_) unmap(file);
}

void WeightStore::unmap(MappedFile& file) {
  if (file.base != nullptr) munmap(file.base, file.size_bytes);
  file.base = nullptr;
}

const void* WeightStore::resolve(const cd_tensor_ref& ref, cd_dtype dtype, cd_dtype precision,
                                 ThreadPool& pool) {
  const auto key = std::make_tuple(ref.file_index, ref.offset_bytes, dtype, precision);
  const auto found = resolved_.find(key);
  if (found != resolved_.end()) return found->second;

  MappedFile& file = files_[size_t(ref.file_index)];
  const uint8_t* source = static_cast<const uint8_t*>(file.base) + ref.offset_bytes;
  const bool keeps_values = precision == CD_DTYPE_F32 || precision == ref.dtype;
  const void* result;
  if (ref.dtype == dtype && keeps_values) {
    ++file.num_borrowed_tensors;
    result = source;
  } else {
    const size_t num_elements = ref.size_bytes / dtype_bytes(ref.dtype);
    AlignedBuffer buffer = allocate_aligned(num_elements * dtype_bytes(dtype));
    uint8_t* target = static_cast<uint8_t*>(buffer.get());
    const int32_t num_chunks =
        int32_t((num_elements + kConversionChunkElements - 1) / kConversionChunkElements);
    pool.parallel_for(num_chunks, 1, [&](int32_t, int32_t chunk_begin, int32_t chunk_end) {
      const size_t first = size_t(chunk_begin) * kConversionChunkElements;
      const size_t last = std::min(num_elements, size_t(chunk_end) * kConversionChunkElements);
      convert_elements(source + first * dtype_bytes(ref.dtype), ref.dtype,
                       target + first * dtype_bytes(dtype), dtype, precision, last - first);
    });
    release_pages(source, ref.size_bytes);
    result = target;
    converted_.push_back(std::move(buffer));
  }
  resolved_.emplace(key, result);
  return result;
}

namespace {

// One 32-block of a row (inputs past k are zeros), Q8_0-style: returns the fp16 scale
// max|x| / 127, with out = round(x / scale). Values are first rounded to precision.
uint16_t quantize_block(const uint8_t* source, cd_dtype dtype, cd_dtype precision, size_t row_offset,
                        int32_t first_input, int32_t k, int8_t* out) {
  float block[32];
  float max_abs = 0.0f;
  for (int32_t i = 0; i < 32; ++i) {
    const int32_t input = first_input + i;
    block[i] = input < k ? round_to(precision, load_as_f32(source, dtype, row_offset + size_t(input))) : 0.0f;
    max_abs = std::max(max_abs, std::fabs(block[i]));
  }
  const uint16_t scale_bits = f32_to_f16(max_abs / 127.0f);
  const float scale = f16_to_f32(scale_bits);
  for (int32_t i = 0; i < 32; ++i) out[i] = round_to_q8(block[i], scale);
  return scale_bits;
}

}  // namespace

const uint8_t* WeightStore::quantize_q8_panels(const cd_tensor_ref& ref, int32_t k, cd_dtype precision,
                                               ThreadPool& pool) {
  const uint8_t* source = static_cast<const uint8_t*>(files_[size_t(ref.file_index)].base) + ref.offset_bytes;
  const int32_t num_rows = int32_t(ref.size_bytes / dtype_bytes(ref.dtype) / size_t(k));
  const int32_t num_panels = (num_rows + kPanelColumns - 1) / kPanelColumns;
  const int32_t num_blocks = (k + 31) / 32;
  AlignedBuffer buffer = allocate_aligned(q8_panels_bytes(num_rows, k));
  uint8_t* panels = static_cast<uint8_t*>(buffer.get());
  pool.parallel_for(num_panels, 1, [&](int32_t, int32_t panel_begin, int32_t panel_end) {
    int8_t values[32];
    for (int32_t panel = panel_begin; panel < panel_end; ++panel) {
      for (int32_t block = 0; block < num_blocks; ++block) {
        uint8_t* out = panels + (size_t(panel) * size_t(num_blocks) + size_t(block)) * kQ8PanelBlockBytes;
        uint16_t* scales = reinterpret_cast<uint16_t*>(out + kPanelColumns * 32);
        for (int32_t column = 0; column < kPanelColumns; ++column) {
          const int32_t row = panel * kPanelColumns + column;
          if (row < num_rows) {
            scales[column] = quantize_block(source, ref.dtype, precision, size_t(row) * size_t(k), block * 32, k, values);
          } else {
            scales[column] = 0;
            std::fill(values, values + 32, int8_t(0));
          }
          for (int32_t i = 0; i < 32; ++i) out[(size_t(i / 2) * kPanelColumns + size_t(column)) * 2 + size_t(i % 2)] = uint8_t(values[i]);
        }
      }
    }
  });
  release_pages(source, ref.size_bytes);
  converted_.push_back(std::move(buffer));
  return panels;
}

const void* WeightStore::pack_panels(const cd_tensor_ref& ref, int32_t k, MatrixFormat format, ThreadPool& pool) {
  const uint8_t* source = static_cast<const uint8_t*>(files_[size_t(ref.file_index)].base) + ref.offset_bytes;
  const int32_t num_rows = int32_t(ref.size_bytes / dtype_bytes(ref.dtype) / size_t(k));
  const cd_dtype dtype = format == MatrixFormat::kF32Panels   ? CD_DTYPE_F32
                         : format == MatrixFormat::kF16Panels ? CD_DTYPE_F16
                                                              : CD_DTYPE_BF16;
  // Steps of one input (a column's value) or of a pair (a column's two values side by side).
  const int32_t inputs_per_step = format == MatrixFormat::kBf16Panels ? 2 : 1;
  const size_t elements_per_panel = panel_elements(format, k);
  AlignedBuffer buffer = allocate_aligned(size_t(num_panels(num_rows)) * elements_per_panel * dtype_bytes(dtype));
  void* panels = buffer.get();
  pool.parallel_for(num_panels(num_rows), 1, [&](int32_t, int32_t panel_begin, int32_t panel_end) {
    for (int32_t panel = panel_begin; panel < panel_end; ++panel) {
      size_t index = size_t(panel) * elements_per_panel;
      for (int32_t first = 0; first < k; first += inputs_per_step) {
        for (int32_t column = 0; column < kPanelColumns; ++column) {
          const int32_t row = panel * kPanelColumns + column;
          for (int32_t input = first; input < first + inputs_per_step; ++input) {
            const bool present = row < num_rows && input < k;
            const float value = present ? load_as_f32(source, ref.dtype, size_t(row) * size_t(k) + size_t(input)) : 0.0f;
            store_from_f32(panels, dtype, index++, value);
          }
        }
      }
    }
  });
  release_pages(source, ref.size_bytes);
  converted_.push_back(std::move(buffer));
  return panels;
}

void WeightStore::release_unborrowed_files() {
  for (MappedFile& file : files_) {
    if (file.num_borrowed_tensors == 0) unmap(file);
  }
}

}  // namespace conduit
