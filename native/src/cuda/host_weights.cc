#include "host_weights.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "dtype.h"
#include "error.h"

namespace conduit {
namespace cuda {

HostCheckpoint::HostCheckpoint(const cd_model_spec& spec) {
  files_.resize(size_t(spec.num_files));
  for (int32_t i = 0; i < spec.num_files; ++i) {
    const char* path = spec.file_paths[i];
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error(CD_ERR_IO, std::string("cannot open ") + path + ": " + std::strerror(errno));
    struct stat info {};
    if (fstat(fd, &info) != 0) {
      close(fd);
      throw Error(CD_ERR_IO, std::string("cannot stat ") + path);
    }
    void* data = info.st_size == 0 ? nullptr : mmap(nullptr, size_t(info.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (data == MAP_FAILED) throw Error(CD_ERR_IO, std::string("cannot map ") + path);
    files_[size_t(i)] = Mapping{static_cast<const uint8_t*>(data), size_t(info.st_size)};
  }
}

HostCheckpoint::~HostCheckpoint() {
  for (const Mapping& file : files_) {
    if (file.data != nullptr) munmap(const_cast<uint8_t*>(file.data), file.size);
  }
}

void HostCheckpoint::read_rows(const cd_tensor_ref& ref, int32_t k, int32_t row_begin, int32_t row_end,
                               float* out) const {
  if (ref.encoding != CD_ENCODING_PLAIN) {
    throw Error(CD_ERR_INVALID_ARGUMENT, "the CUDA backend reads plain weights only, not MXFP4 or GGUF quantized blocks, yet");
  }
  const uint8_t* base = files_[size_t(ref.file_index)].data + ref.offset_bytes;
  const int64_t row_stride = ref.row_stride == 0 ? k : ref.row_stride;
  const int64_t col_stride = ref.col_stride == 0 ? 1 : ref.col_stride;
  for (int32_t row = row_begin; row < row_end; ++row) {
    float* target = out + size_t(row - row_begin) * size_t(k);
    for (int32_t i = 0; i < k; ++i) {
      target[i] = load_as_f32(base, ref.dtype, size_t(int64_t(row) * row_stride + int64_t(i) * col_stride));
    }
  }
}

std::vector<float> HostCheckpoint::vector(const cd_tensor_ref& ref, int32_t n) const {
  std::vector<float> values;
  if (ref.size_bytes == 0) return values;
  values.resize(size_t(n));
  // A [n] vector is read as n rows of one element, as src/weights.cc reads it.
  const uint8_t* base = files_[size_t(ref.file_index)].data + ref.offset_bytes;
  const int64_t stride = ref.row_stride == 0 ? 1 : ref.row_stride;
  for (int32_t i = 0; i < n; ++i) {
    values[size_t(i)] = round_to_bf16(load_as_f32(base, ref.dtype, size_t(int64_t(i) * stride)));
  }
  return values;
}

void quantize_row_q8(const float* row, int32_t k, int8_t* values, uint16_t* scale_bits) {
  for (int32_t first = 0; first < k; first += 32) {
    float block[32];
    float max_abs = 0.0f;
    for (int32_t i = 0; i < 32; ++i) {
      block[i] = first + i < k ? round_to_bf16(row[first + i]) : 0.0f;
      max_abs = std::max(max_abs, std::fabs(block[i]));
    }
    const uint16_t bits = f32_to_f16(max_abs / 127.0f);
    const float scale = f16_to_f32(bits);
    for (int32_t i = 0; i < 32; ++i) {
      values[first + i] =
          scale == 0.0f ? int8_t(0) : int8_t(std::min(127.0f, std::max(-127.0f, std::nearbyint(block[i] / scale))));
    }
    scale_bits[first / 32] = bits;
  }
}

uint16_t to_bf16_bits(float value) { return f32_to_bf16(value); }
float round_to_bf16(float value) { return bf16_to_f32(f32_to_bf16(value)); }

}  // namespace cuda
}  // namespace conduit
