#include "model.h"

#include "dtype.h"

namespace conduit {

namespace {

Dimensions dimensions_of(const cd_model_spec& spec) {
  return Dimensions{spec.num_layers,   spec.hidden_size, spec.intermediate_size,
                    spec.num_heads,    spec.num_kv_heads, spec.head_dim,
                    spec.vocab_size,   spec.rms_norm_eps, spec.sliding_window_tokens};
}

MatrixFormat panel_format_of(cd_dtype dtype) {
  switch (dtype) {
    case CD_DTYPE_BF16: return MatrixFormat::kBf16Panels;
    case CD_DTYPE_F16: return MatrixFormat::kF16Panels;
    default: return MatrixFormat::kF32Panels;
  }
}

// Keys and values need whole groups of 16 slots and of 16 dims.
KvLayout kv_layout_of(const Dimensions& dims, cd_dtype dtype, int32_t block_size_tokens) {
  const bool pairs = dtype == CD_DTYPE_BF16 && dims.head_dim % 16 == 0 && block_size_tokens % 16 == 0;
  return pairs ? KvLayout::kBf16Pairs : KvLayout::kRows;
}

}  // namespace

KvCache::KvCache(const Dimensions& dims, cd_dtype dtype, KvLayout layout, int32_t num_blocks,
                 int32_t block_size_tokens)
    : dtype_(dtype),
      layout_(layout),
      num_blocks_(size_t(num_blocks)),
      num_kv_heads_(size_t(dims.num_kv_heads)),
      head_dim_(dims.head_dim),
      block_size_tokens_(block_size_tokens),
      row_bytes_(size_t(dims.head_dim) * dtype_bytes(dtype)),
      bytes_per_block_(uint64_t(dims.num_layers) * 2 * num_kv_heads_ * size_t(block_size_tokens) *
                       row_bytes_),
      // Uninitialized on purpose: attention reads only slots written before it (or masks them
      // out), and untouched pages cost no memory until a block is first used.
      data_(allocate_aligned(size_t(bytes_per_block_) * num_blocks_)) {}

void KvCache::store(int32_t layer, int32_t kv, int32_t slot, int32_t kv_head, const float* values) const {
  if (layout_ == KvLayout::kRows) {
    convert_elements(values, CD_DTYPE_F32, at(layer, kv, slot, kv_head), dtype_, size_t(head_dim_));
    return;
  }
  uint16_t* region_bf16 = static_cast<uint16_t*>(region(layer, kv, slot / block_size_tokens_, kv_head));
  const size_t offset = size_t(slot % block_size_tokens_);
  if (kv == 0) {  // keys [head_dim / 2][slot][2]
    for (int32_t d = 0; d < head_dim_; ++d) {
      region_bf16[(size_t(d / 2) * size_t(block_size_tokens_) + offset) * 2 + size_t(d % 2)] = f32_to_bf16(values[d]);
    }
    return;
  }
  uint16_t* pair = region_bf16 + offset / 2 * size_t(head_dim_) * 2 + offset % 2;  // values [slot / 2][head_dim][2]
  for (int32_t d = 0; d < head_dim_; ++d) pair[size_t(d) * 2] = f32_to_bf16(values[d]);
}

Model::Model(const cd_model_spec& spec, const cd_load_options& options, const KernelTable& kernels)
    : dims(dimensions_of(spec)),
      rope_inv_freq(spec.rope_inv_freq, spec.rope_inv_freq + spec.head_dim / 2),
      kernels(kernels),
      pool(options.num_threads),
      weights(spec.file_paths, spec.num_files),
      kv_cache(dims, options.kv_cache_dtype, kv_layout_of(dims, options.kv_cache_dtype, options.block_size_tokens),
               options.num_kv_blocks, options.block_size_tokens) {
  // Matrices [out, in]: k is the input width, which every matrix's shape in the spec implies.
  const auto matrix = [&](const cd_tensor_ref& ref, int32_t k) {
    if (options.quantization == CD_QUANTIZATION_INT8) {
      return Matrix{weights.quantize_q8_panels(ref, k, options.weight_dtype, pool), MatrixFormat::kQ8Panels};
    }
    return Matrix{weights.pack_panels(ref, k, panel_format_of(options.weight_dtype), pool),
                  panel_format_of(options.weight_dtype)};
  };
  // Norm weights and biases are tiny and held in fp32, with the values of the weight dtype.
  const auto vector = [&](const cd_tensor_ref& ref) -> const float* {
    if (ref.size_bytes == 0) return nullptr;
    return static_cast<const float*>(
        weights.resolve(ref, CD_DTYPE_F32, options.weight_dtype, pool));
  };
  embed_tokens = Embedding{weights.resolve(spec.embed_tokens, options.weight_dtype, options.weight_dtype, pool),
                           options.weight_dtype};
  lm_head = matrix(spec.lm_head, dims.hidden_size);
  final_norm = vector(spec.final_norm);
  layers.reserve(size_t(dims.num_layers));
  for (int32_t i = 0; i < dims.num_layers; ++i) {
    const cd_layer_spec& layer = spec.layers[i];
    const int32_t hidden = dims.hidden_size;
    layers.push_back(Layer{vector(layer.input_norm), matrix(layer.q_proj, hidden),
                           matrix(layer.k_proj, hidden), matrix(layer.v_proj, hidden),
                           vector(layer.q_bias), vector(layer.k_bias), vector(layer.v_bias),
                           matrix(layer.o_proj, dims.q_size()), vector(layer.post_attn_norm),
                           matrix(layer.gate_proj, hidden), matrix(layer.up_proj, hidden),
                           matrix(layer.down_proj, dims.intermediate_size)});
  }
  weights.release_unborrowed_files();
  workspace.scores.resize(size_t(options.num_threads));
  workspace.samplers.resize(size_t(options.num_threads));
}

}  // namespace conduit
