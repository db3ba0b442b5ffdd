// The checkpoint as the CUDA plugin reads it on the host before upload: each weight through its
// cd_tensor_ref (file, offset, dtype, strides), widened to fp32 a slab of rows at a time, then
// rounded to bf16 or quantized Q8_0 exactly as the CPU runtime does it (src/weights.cc), so the
// two devices hold the same weight values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "conduit.h"

namespace conduit {
namespace cuda {

class HostCheckpoint {
 public:
  explicit HostCheckpoint(const cd_model_spec& spec);
  ~HostCheckpoint();
  HostCheckpoint(const HostCheckpoint&) = delete;
  HostCheckpoint& operator=(const HostCheckpoint&) = delete;

  // Rows [row_begin, row_end) of a [rows, k] weight as fp32, row-major, into out.
  void read_rows(const cd_tensor_ref& ref, int32_t k, int32_t row_begin, int32_t row_end, float* out) const;
  // An optional vector of n elements rounded to bf16 and widened (the CPU holds norms and biases
  // in fp32 with the weight dtype's values); empty when absent (size_bytes 0).
  std::vector<float> vector(const cd_tensor_ref& ref, int32_t n) const;

 private:
  struct Mapping {
    const uint8_t* data = nullptr;
    size_t size = 0;
  };
  std::vector<Mapping> files_;
};

// Q8_0 of one row of k inputs (k a multiple of 32 or zero-padded): int8 values and fp16 scale
// bits per 32-block, as src/weights.cc's quantize_block computes them.
void quantize_row_q8(const float* row, int32_t k, int8_t* values, uint16_t* scale_bits);

uint16_t to_bf16_bits(float value);
float round_to_bf16(float value);

}  // namespace cuda
}  // namespace conduit
