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
#include "ggml_blocks.h"
#include "huge_pages.h"
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

// E2M1 values doubled, so every one is an integer: index by the nibble.
constexpr int8_t kMxfp4Doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Element (row, i) of a weight as its cd_tensor_ref describes it (strides, dtype, encoding, rows
// in llama.cpp's rotary order).
class ElementReader {
 public:
  ElementReader(const cd_tensor_ref& ref, const uint8_t* data, const uint8_t* scales, int32_t k)
      : data_(data),
        scales_(scales),
        dtype_(ref.dtype),
        encoding_(ref.encoding),
        mxfp4_(ref.encoding == CD_ENCODING_MXFP4),
        row_stride_(ref.row_stride != 0 ? ref.row_stride : k),
        col_stride_(ref.col_stride != 0 ? ref.col_stride : 1),
        rotary_head_dim_(ref.rotary_permuted_head_dim),
        first_column_(ref.first_column) {}

  bool mxfp4() const { return mxfp4_; }
  cd_encoding encoding() const { return encoding_; }

  float at(int32_t row, int32_t i) const {
    const int64_t index = index_of(row, i);
    if (encoding_ == CD_ENCODING_PLAIN) return load_as_f32(data_, dtype_, size_t(index));
    if (!mxfp4_) return ggml_element(encoding_, data_, index);
    return float(doubled(index)) * std::ldexp(1.0f, int(scales_[index / 32]) - 128);
  }

  // MXFP4: the E2M1 value of element (row, i), doubled, and its block's E8M0 scale byte.
  int8_t doubled(int64_t index) const {
    const uint8_t byte = data_[index / 2];
    return kMxfp4Doubled[index % 2 == 0 ? byte & 0x0f : byte >> 4];
  }
  uint8_t scale_byte(int32_t row, int32_t i) const {
    return scales_[(int64_t(row) * row_stride_ + int64_t(i)) / 32];
  }
  // Hugging Face's row r of a head (r < half pairs with r + half) is llama.cpp's row 2r, and
  // row half + r its row 2r + 1.
  int64_t stored_row(int32_t row) const {
    if (rotary_head_dim_ == 0) return row;
    const int32_t half = rotary_head_dim_ / 2, within = row % rotary_head_dim_;
    return int64_t(row - within) + 2 * (within % half) + within / half;
  }
  int64_t index_of(int32_t row, int32_t i) const {
    return stored_row(row) * row_stride_ + int64_t(first_column_ + i) * col_stride_;
  }
  const uint8_t* data() const { return data_; }

 private:
  const uint8_t* data_;
  const uint8_t* scales_;
  cd_dtype dtype_;
  cd_encoding encoding_;
  bool mxfp4_;
  int64_t row_stride_;
  int64_t col_stride_;
  int32_t rotary_head_dim_;
  int32_t first_column_;
};

}  // namespace

void FreeDeleter::operator()(void* pointer) const { std::free(pointer); }

AlignedBuffer allocate_aligned(size_t size_bytes) {
  const size_t rounded = (size_bytes + 63) / 64 * 64;
  // A buffer of a huge page or more (the KV cache) starts on one and asks for them (huge_pages.h).
  void* pointer = nullptr;
  if (posix_memalign(&pointer, rounded >= kHugePageBytes ? kHugePageBytes : 64, rounded == 0 ? 64 : rounded) != 0) {
    throw Error(CD_ERR_OUT_OF_MEMORY, "cannot allocate " + std::to_string(size_bytes) + " bytes");
  }
  advise_huge_pages(pointer, rounded);
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

const uint8_t* WeightStore::base_of(int32_t file_index, uint64_t offset_bytes) const {
  return static_cast<const uint8_t*>(files_[size_t(file_index)].base) + offset_bytes;
}

const float* WeightStore::resolve_vector(const cd_tensor_ref& ref, int32_t n, cd_dtype precision, ThreadPool& pool) {
  if (ref.size_bytes == 0) return nullptr;
  const bool contiguous = ref.encoding == CD_ENCODING_PLAIN && (ref.row_stride == 0 || ref.row_stride == 1) &&
                          ref.rotary_permuted_head_dim == 0;
  if (contiguous) return static_cast<const float*>(resolve(ref, CD_DTYPE_F32, precision, pool));
  const ElementReader reader(ref, base_of(ref.file_index, ref.offset_bytes),
                             ref.encoding == CD_ENCODING_MXFP4 ? base_of(ref.scales_file_index, ref.scales_offset_bytes) : nullptr, 1);
  AlignedBuffer buffer = allocate_aligned(size_t(n) * sizeof(float));
  float* values = static_cast<float*>(buffer.get());
  for (int32_t i = 0; i < n; ++i) values[i] = round_to(precision, reader.at(i, 0));
  converted_.push_back(std::move(buffer));
  return values;
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
  if (is_ggml_encoding(ref.encoding)) {
    // A row-gathered table (the embedding) of ggml blocks: dequantized once into dtype.
    const size_t num_elements = ref.size_bytes / size_t(ggml_block_bytes(ref.encoding)) * size_t(ggml_block_elements(ref.encoding));
    AlignedBuffer buffer = allocate_aligned(num_elements * dtype_bytes(dtype));
    void* target = buffer.get();
    const int32_t num_chunks = int32_t((num_elements + kConversionChunkElements - 1) / kConversionChunkElements);
    pool.parallel_for(num_chunks, 1, [&](int32_t, int32_t chunk_begin, int32_t chunk_end) {
      const size_t last = std::min(num_elements, size_t(chunk_end) * kConversionChunkElements);
      for (size_t i = size_t(chunk_begin) * kConversionChunkElements; i < last; ++i) {
        store_from_f32(target, dtype, i, round_to(precision, ggml_element(ref.encoding, source, int64_t(i))));
      }
    });
    release_pages(source, ref.size_bytes);
    result = target;
    converted_.push_back(std::move(buffer));
  } else if (ref.dtype == dtype && keeps_values) {
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
uint16_t quantize_block(const ElementReader& reader, cd_dtype precision, int32_t row, int32_t first_input, int32_t k,
                        int8_t* out) {
  float block[32];
  float max_abs = 0.0f;
  for (int32_t i = 0; i < 32; ++i) {
    const int32_t input = first_input + i;
    block[i] = input < k ? round_to(precision, reader.at(row, input)) : 0.0f;
    max_abs = std::max(max_abs, std::fabs(block[i]));
  }
  const uint16_t scale_bits = f32_to_f16(max_abs / 127.0f);
  const float scale = f16_to_f32(scale_bits);
  for (int32_t i = 0; i < 32; ++i) out[i] = round_to_q8(block[i], scale);
  return scale_bits;
}

// An MXFP4 block as an int8 block with the same values: the doubled E2M1 values, and the E8M0
// scale halved, 2^(byte - 128), as fp16. False when fp16 cannot hold that scale.
bool mxfp4_block_to_q8(const ElementReader& reader, int32_t row, int32_t first_input, uint16_t* scale_bits, int8_t* out) {
  const int exponent = int(reader.scale_byte(row, first_input)) - 128;
  if (exponent < -24 || exponent > 15) return false;
  *scale_bits = f32_to_f16(std::ldexp(1.0f, exponent));
  const int64_t first = reader.index_of(row, first_input);
  for (int32_t i = 0; i < 32; ++i) out[i] = reader.doubled(first + i);
  return true;
}

// ggml's MXFP4 block (a GGUF's gpt-oss experts) as an int8 block with the same values, as
// mxfp4_block_to_q8: the scale byte first, element j in byte j's low nibble, j + 16 in its high one.
bool ggml_mxfp4_block_to_q8(const ElementReader& reader, int32_t row, int32_t first_input, uint16_t* scale_bits, int8_t* out) {
  const uint8_t* block = reader.data() + reader.index_of(row, first_input) / 32 * ggml_block_bytes(CD_ENCODING_GGML_MXFP4);
  const int exponent = int(block[0]) - 128;
  if (exponent < -24 || exponent > 15) return false;
  *scale_bits = f32_to_f16(std::ldexp(1.0f, exponent));
  for (int32_t i = 0; i < 32; ++i) out[i] = kMxfp4Doubled[i < 16 ? block[1 + i] & 0x0f : block[1 + i - 16] >> 4];
  return true;
}

// A Q8_0 or Q4_0 block as an int8 block with the same values: its codes (Q4_0's nibbles less 8)
// and its fp16 scale, as stored.
void ggml_block_to_q8(const ElementReader& reader, int32_t row, int32_t first_input, uint16_t* scale_bits, int8_t* out) {
  const int64_t first = reader.index_of(row, first_input);
  const uint8_t* block = reader.data() + first / 32 * ggml_block_bytes(reader.encoding());
  *scale_bits = uint16_t(block[0] | (block[1] << 8));
  for (int32_t i = 0; i < 32; ++i) {
    out[i] = reader.encoding() == CD_ENCODING_GGML_Q8_0 ? int8_t(block[2 + i])
                                                         : int8_t(((i < 16 ? block[2 + i] & 0x0f : block[2 + i - 16] >> 4)) - 8);
  }
}

}  // namespace

const uint8_t* WeightStore::quantize_q8_panels(const cd_tensor_ref& ref, int32_t num_rows, int32_t k, cd_dtype precision,
                                               ThreadPool& pool) {
  const uint8_t* source = base_of(ref.file_index, ref.offset_bytes);
  const ElementReader reader(ref, source, ref.encoding == CD_ENCODING_MXFP4 ? base_of(ref.scales_file_index, ref.scales_offset_bytes) : nullptr, k);
  // MXFP4 blocks line up with int8 blocks when every row starts a block.
  const bool exact_blocks = reader.mxfp4() && k % 32 == 0;
  // ggml's 32-blocks are int8 blocks already (GGUF rows are whole blocks).
  const bool ggml_blocks_of_32 = (ref.encoding == CD_ENCODING_GGML_Q8_0 || ref.encoding == CD_ENCODING_GGML_Q4_0) &&
                                 ref.first_column % 32 == 0 && k % 32 == 0;
  const bool ggml_mxfp4_blocks = ref.encoding == CD_ENCODING_GGML_MXFP4 && ref.first_column % 32 == 0 && k % 32 == 0;
  const int32_t num_panels = (num_rows + kPanelColumns - 1) / kPanelColumns;
  const int32_t num_blocks = (k + 31) / 32;
  uint8_t* panels = allocate_matrix(q8_panels_bytes(num_rows, k));
  pool.parallel_for(num_panels, 1, [&](int32_t, int32_t panel_begin, int32_t panel_end) {
    int8_t values[32];
    for (int32_t panel = panel_begin; panel < panel_end; ++panel) {
      for (int32_t block = 0; block < num_blocks; ++block) {
        uint8_t* out = panels + (size_t(panel) * size_t(num_blocks) + size_t(block)) * kQ8PanelBlockBytes;
        uint16_t* scales = reinterpret_cast<uint16_t*>(out + kPanelColumns * 32);
        for (int32_t column = 0; column < kPanelColumns; ++column) {
          const int32_t row = panel * kPanelColumns + column;
          if (row < num_rows) {
            if (ggml_blocks_of_32) {
              ggml_block_to_q8(reader, row, block * 32, &scales[column], values);
            } else if (!(exact_blocks && mxfp4_block_to_q8(reader, row, block * 32, &scales[column], values)) &&
                       !(ggml_mxfp4_blocks && ggml_mxfp4_block_to_q8(reader, row, block * 32, &scales[column], values))) {
              scales[column] = quantize_block(reader, precision, row, block * 32, k, values);
            }
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
  if (reader.mxfp4()) release_pages(base_of(ref.scales_file_index, ref.scales_offset_bytes), ref.scales_size_bytes);
  return panels;
}

namespace {

// 8 codes as one kQ4 word (kernels.h): pair i at bits 4i and 16 + 4i.
uint32_t q4_word(const uint8_t* codes) {
  uint32_t word = 0;
  for (int32_t i = 0; i < 4; ++i) word |= uint32_t(codes[2 * i]) << (4 * i) | uint32_t(codes[2 * i + 1]) << (16 + 4 * i);
  return word;
}

uint32_t* q4_words(uint8_t* codes) { return reinterpret_cast<uint32_t*>(codes); }

// One 32-block of a row (inputs past k are zeros) as 4-bit codes, w = scale * q - min.
void quantize_q4_block(const ElementReader& reader, cd_dtype precision, int32_t row, int32_t first_input, int32_t k,
                       uint8_t* codes, float* scale, float* min) {
  // A whole ggml 32-block (a row-parallel segment may start or end inside one: then from values).
  const bool whole_block = first_input + 32 <= k && reader.index_of(row, first_input) % 32 == 0;
  if ((reader.encoding() == CD_ENCODING_GGML_Q4_0 || reader.encoding() == CD_ENCODING_GGML_Q4_K) && whole_block) {
    ggml_q4_block(reader.encoding(), reader.data(), reader.index_of(row, first_input), codes, scale, min);
    return;
  }
  float block[32];
  float low = 0.0f, high = 0.0f;
  for (int32_t i = 0; i < 32; ++i) {
    const int32_t input = first_input + i;
    block[i] = input < k ? round_to(precision, reader.at(row, input)) : 0.0f;
    low = std::min(low, block[i]);
    high = std::max(high, block[i]);
  }
  *scale = (high - low) / 15.0f;
  *min = -low;
  for (int32_t i = 0; i < 32; ++i) {
    const float q = *scale == 0.0f ? 0.0f : std::nearbyint((block[i] - low) / *scale);
    codes[i] = uint8_t(std::min(15.0f, std::max(0.0f, q)));
  }
}

}  // namespace

const uint8_t* WeightStore::quantize_q4_panels(const cd_tensor_ref& ref, int32_t num_rows, int32_t k, cd_dtype precision,
                                               ThreadPool& pool) {
  const uint8_t* source = base_of(ref.file_index, ref.offset_bytes);
  const ElementReader reader(ref, source, ref.encoding == CD_ENCODING_MXFP4 ? base_of(ref.scales_file_index, ref.scales_offset_bytes) : nullptr, k);
  const int32_t num_blocks = (k + 31) / 32;
  uint8_t* panels = allocate_matrix(q4_panels_bytes(num_rows, k));
  pool.parallel_for(num_panels(num_rows), 1, [&](int32_t, int32_t panel_begin, int32_t panel_end) {
    uint8_t codes[32];
    for (int32_t panel = panel_begin; panel < panel_end; ++panel) {
      for (int32_t block = 0; block < num_blocks; ++block) {
        uint8_t* out = panels + (size_t(panel) * size_t(num_blocks) + size_t(block)) * kQ4PanelBlockBytes;
        float* scales = reinterpret_cast<float*>(out + kPanelColumns * 16);
        float* negated_mins = scales + kPanelColumns;
        for (int32_t column = 0; column < kPanelColumns; ++column) {
          const int32_t row = panel * kPanelColumns + column;
          float scale = 0.0f, min = 0.0f;
          if (row < num_rows) {
            quantize_q4_block(reader, precision, row, block * 32, k, codes, &scale, &min);
          } else {
            std::fill(codes, codes + 32, uint8_t(0));
          }
          scales[column] = scale;
          negated_mins[column] = -min;
          for (int32_t g = 0; g < 4; ++g) q4_words(out)[g * kPanelColumns + column] = q4_word(codes + 8 * g);
        }
      }
    }
  });
  release_pages(source, ref.size_bytes);
  if (reader.mxfp4()) release_pages(base_of(ref.scales_file_index, ref.scales_offset_bytes), ref.scales_size_bytes);
  return panels;
}

namespace {

// Calls fill(out, column, block) for every column of every block_inputs-wide super-block of a
// GGUF K-quant matrix converted to panels (kQ4KPanels, kQ8KPanels), panels spread over the pool:
// out is the panel's super-block s (panel_bytes per panel, block_bytes(s) per super-block, for s
// in [first_super_block, end_super_block)), block the column's block in the file
// (file_block_bytes), nullptr for the padding columns past num_rows.
template <typename BlockBytes, typename Fill>
void for_each_panel_block(const ElementReader& reader, const uint8_t* source, int32_t file_block_bytes,
                          int32_t block_inputs, int32_t num_rows, int32_t first_super_block, int32_t end_super_block,
                          uint8_t* panels, size_t panel_bytes, const BlockBytes& block_bytes, ThreadPool& pool,
                          const Fill& fill) {
  pool.parallel_for(num_panels(num_rows), 1, [&](int32_t, int32_t panel_begin, int32_t panel_end) {
    for (int32_t panel = panel_begin; panel < panel_end; ++panel) {
      uint8_t* out = panels + size_t(panel) * panel_bytes;
      for (int32_t s = first_super_block; s < end_super_block; ++s) {
        for (int32_t column = 0; column < kPanelColumns; ++column) {
          const int32_t row = panel * kPanelColumns + column;
          const uint8_t* block =
              row < num_rows ? source + reader.index_of(row, s * block_inputs) / block_inputs * file_block_bytes : nullptr;
          fill(out, s, column, block);
        }
        out += block_bytes(s);
      }
    }
  });
}

}  // namespace

const uint8_t* WeightStore::convert_q4k_panels(const cd_tensor_ref& ref, int32_t num_rows, int32_t k, ThreadPool& pool,
                                               int32_t first_sub_block, int32_t end_sub_block) {
  const uint8_t* source = base_of(ref.file_index, ref.offset_bytes);
  const ElementReader reader(ref, source, nullptr, k);
  if (end_sub_block < 0) end_sub_block = k / 32;
  const size_t panel_bytes = q4k_held_panel_bytes(first_sub_block, end_sub_block);
  uint8_t* panels = allocate_matrix(size_t(num_panels(num_rows)) * panel_bytes);
  const auto first_held = [first_sub_block](int32_t s) { return q4k_first_held(s, first_sub_block); };
  const auto end_held = [end_sub_block](int32_t s) { return q4k_end_held(s, end_sub_block); };
  for_each_panel_block(reader, source, ggml_block_bytes(CD_ENCODING_GGML_Q4_K), kQ4KBlockInputs, num_rows,
                       first_sub_block / 8, (end_sub_block + 7) / 8, panels, panel_bytes,
                       [&](int32_t s) { return q4k_held_block_bytes(end_held(s) - first_held(s)); }, pool,
                       [&](uint8_t* out, int32_t s, int32_t column, const uint8_t* block) {
    const int32_t num_held = end_held(s) - first_held(s);
    uint8_t* low_nibbles = out + size_t(num_held) * kPanelColumns * 16;
    uint32_t* high_bits = reinterpret_cast<uint32_t*>(low_nibbles + num_held * kPanelColumns);
    uint16_t* d = reinterpret_cast<uint16_t*>(high_bits + kPanelColumns);
    uint16_t* dmin = d + kPanelColumns;
    uint8_t codes[32];
    d[column] = block != nullptr ? uint16_t(block[0] | (block[1] << 8)) : 0;
    dmin[column] = block != nullptr ? uint16_t(block[2] | (block[3] << 8)) : 0;
    high_bits[column] = 0;
    for (int32_t j = 0; j < 8; ++j) {
      const int32_t held = j - first_held(s);
      int32_t scale = 0, min = 0;
      if (block != nullptr) {
        ggml_k4_scale_min(j, block + 4, &scale, &min);
        for (int32_t i = 0; i < 32; ++i) {
          const uint8_t byte = block[16 + 32 * (j / 2) + i];
          codes[i] = j % 2 != 0 ? byte >> 4 : byte & 0x0f;
        }
      } else {
        std::fill(codes, codes + 32, uint8_t(0));
      }
      high_bits[column] |= uint32_t((scale >> 4) | ((min >> 4) << 2)) << (4 * j);
      if (held < 0 || held >= num_held) continue;
      low_nibbles[held * kPanelColumns + column] = uint8_t((scale & 0x0f) | ((min & 0x0f) << 4));
      uint8_t* sub_block = out + size_t(held) * kPanelColumns * 16;
      for (int32_t g = 0; g < 4; ++g) q4_words(sub_block)[g * kPanelColumns + column] = q4_word(codes + 8 * g);
    }
  });
  release_pages(source, ref.size_bytes);
  return panels;
}

const uint8_t* WeightStore::convert_q8k_panels(const cd_tensor_ref& ref, int32_t num_rows, int32_t k, ThreadPool& pool) {
  const uint8_t* source = base_of(ref.file_index, ref.offset_bytes);
  const ElementReader reader(ref, source, nullptr, k);
  const cd_encoding encoding = ref.encoding;
  const bool q6 = encoding == CD_ENCODING_GGML_Q6_K;
  uint8_t* panels = allocate_matrix(q8k_panels_bytes(num_rows, k));
  for_each_panel_block(reader, source, ggml_block_bytes(encoding), kQ8KBlockInputs, num_rows, 0, k / kQ8KBlockInputs, panels,
                       q8k_panels_bytes(kPanelColumns, k), [](int32_t) { return kQ8KPanelBlockBytes; }, pool,
                       [encoding, q6](uint8_t* out, int32_t, int32_t column, const uint8_t* block) {
    int8_t* sub_scales = reinterpret_cast<int8_t*>(out + kQ8KPanelCodeBytes);
    uint8_t* mins = reinterpret_cast<uint8_t*>(sub_scales + 16 * kPanelColumns);
    uint16_t* d = reinterpret_cast<uint16_t*>(mins + 8 * kPanelColumns);
    uint16_t* dmin = d + kPanelColumns;
    int8_t codes[32];
    // Q6_K: d last, no dmin; Q5_K: d and dmin first.
    const uint8_t* d_bytes = block == nullptr ? nullptr : q6 ? block + 208 : block;
    d[column] = d_bytes != nullptr ? uint16_t(d_bytes[0] | (d_bytes[1] << 8)) : 0;
    dmin[column] = block != nullptr && !q6 ? uint16_t(block[2] | (block[3] << 8)) : 0;
    for (int32_t j = 0; j < 8; ++j) {
      int32_t half_scales[2] = {0, 0}, min = 0;
      if (block != nullptr) {
        ggml_k8_sub_block(encoding, block, j, codes, half_scales, &min);
      } else {
        std::fill(codes, codes + 32, int8_t(0));
      }
      sub_scales[(2 * j) * kPanelColumns + column] = int8_t(half_scales[0]);
      sub_scales[(2 * j + 1) * kPanelColumns + column] = int8_t(half_scales[1]);
      mins[j * kPanelColumns + column] = uint8_t(min);
      uint8_t* sub_block = out + size_t(j) * kPanelColumns * 32;
      for (int32_t i = 0; i < 32; ++i) sub_block[(size_t(i / 2) * kPanelColumns + size_t(column)) * 2 + size_t(i % 2)] = uint8_t(codes[i]);
    }
  });
  release_pages(source, ref.size_bytes);
  return panels;
}

const void* WeightStore::pack_panels(const cd_tensor_ref& ref, int32_t num_rows, int32_t k, MatrixFormat format,
                                     ThreadPool& pool) {
  const uint8_t* source = base_of(ref.file_index, ref.offset_bytes);
  const ElementReader reader(ref, source, ref.encoding == CD_ENCODING_MXFP4 ? base_of(ref.scales_file_index, ref.scales_offset_bytes) : nullptr, k);
  const cd_dtype dtype = format == MatrixFormat::kF32Panels   ? CD_DTYPE_F32
                         : format == MatrixFormat::kF16Panels ? CD_DTYPE_F16
                                                              : CD_DTYPE_BF16;
  // Steps of one input (a column's value) or of a pair (a column's two values side by side).
  const int32_t inputs_per_step = format == MatrixFormat::kBf16Panels ? 2 : 1;
  const size_t elements_per_panel = panel_elements(format, k);
  void* panels = allocate_matrix(size_t(num_panels(num_rows)) * elements_per_panel * dtype_bytes(dtype));
  pool.parallel_for(num_panels(num_rows), 1, [&](int32_t, int32_t panel_begin, int32_t panel_end) {
    for (int32_t panel = panel_begin; panel < panel_end; ++panel) {
      size_t index = size_t(panel) * elements_per_panel;
      for (int32_t first = 0; first < k; first += inputs_per_step) {
        for (int32_t column = 0; column < kPanelColumns; ++column) {
          const int32_t row = panel * kPanelColumns + column;
          for (int32_t input = first; input < first + inputs_per_step; ++input) {
            const bool present = row < num_rows && input < k;
            const float value = present ? reader.at(row, input) : 0.0f;
            store_from_f32(panels, dtype, index++, value);
          }
        }
      }
    }
  });
  release_pages(source, ref.size_bytes);
  if (reader.mxfp4()) release_pages(base_of(ref.scales_file_index, ref.scales_offset_bytes), ref.scales_size_bytes);
  return panels;
}

uint8_t* WeightStore::allocate_matrix(size_t size_bytes) {
  if (pair_.open && pair_.data == nullptr) {
    pair_.half_bytes = size_bytes;
    pair_.data = matrices_.allocate(2 * size_bytes);
    return pair_.data;
  }
  if (pair_.open && !pair_.second_packed && size_bytes == pair_.half_bytes) {
    pair_.second_packed = true;
    return pair_.data + size_bytes;
  }
  return matrices_.allocate(size_bytes);
}

void WeightStore::begin_pair() { pair_ = Pair{true, nullptr, 0, false}; }

const uint8_t* WeightStore::end_pair(int32_t num_panels, bool interleave) {
  const Pair pair = pair_;
  pair_ = Pair{};
  if (!pair.second_packed || !interleave) return nullptr;
  const size_t panel_bytes = pair.half_bytes / size_t(num_panels);
  const std::vector<uint8_t> apart(pair.data, pair.data + 2 * pair.half_bytes);
  for (int32_t p = 0; p < num_panels; ++p) {
    const uint8_t* first = apart.data() + size_t(p) * panel_bytes;
    std::copy_n(first, panel_bytes, pair.data + size_t(2 * p) * panel_bytes);
    std::copy_n(first + pair.half_bytes, panel_bytes, pair.data + size_t(2 * p + 1) * panel_bytes);
  }
  return pair.data;
}

float* WeightStore::own_floats(int32_t n) {
  AlignedBuffer buffer = allocate_aligned(size_t(n) * sizeof(float));
  float* values = static_cast<float*>(buffer.get());
  converted_.push_back(std::move(buffer));
  return values;
}

void WeightStore::release_unborrowed_files() {
  for (MappedFile& file : files_) {
    if (file.num_borrowed_tensors == 0) unmap(file);
  }
}

}  // namespace conduit
