// A model on one GPU: weights uploaded once (bf16 or Q8_0), the paged KV cache in device memory
// in the CPU runtime's layout, the forward pass as a sequence of the plugin's kernels on one
// stream, decode steps replayed from captured CUDA graphs, and sampling on the device for every
// sequence whose settings the device sampler covers (the rest on the host's CPU sampler).
#pragma once

#include <cstdint>
#include <memory>

#include "conduit.h"

namespace conduit {
namespace cuda {

class CudaModel;
class TpGroup;

// One model, or with options.tp_size > 1 a tensor-parallel group of ranks in this process.
struct CudaModelHandle {
  CudaModelHandle();
  ~CudaModelHandle();
  std::unique_ptr<CudaModel> model;
  std::unique_ptr<TpGroup> group;
};

// Throws conduit::Error. seed != 0 with spec->num_files == 0: weights drawn on the device
// (uniform, +-1/sqrt(k) for matrices, 1 for norms) instead of read: the check program's
// benchmark models, which no file need hold.
CudaModelHandle* load_model(const cd_model_spec& spec, const cd_load_options& options, uint64_t random_seed);
uint64_t kv_bytes_per_block(const CudaModelHandle& handle);
void forward(CudaModelHandle& handle, const cd_batch& batch, cd_forward_output& output);
void free_model(CudaModelHandle* handle);

}  // namespace cuda
}  // namespace conduit
