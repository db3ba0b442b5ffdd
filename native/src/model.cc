#include "model.h"

#include "dtype.h"
#include "error.h"
#include "ggml_blocks.h"

namespace conduit {

namespace {

Dimensions dimensions_of(const cd_model_spec& spec) {
  return Dimensions{spec.num_layers,   spec.hidden_size,  spec.intermediate_size, spec.moe_intermediate_size,
                    spec.num_heads,    spec.num_kv_heads, spec.head_dim,          spec.vocab_size,
                    spec.rms_norm_eps, spec.num_experts_per_token};
}

Numerics numerics_of(const cd_model_spec& spec, cd_dtype weight_dtype) {
  return Numerics{round_to(weight_dtype, float(spec.embedding_scale)),
                  float(spec.attention_scale),
                  float(spec.attention_softcap),
                  float(spec.final_softcap),
                  spec.activation,
                  float(spec.swiglu_alpha),
                  float(spec.swiglu_limit),
                  spec.routing,
                  spec.norm_topk_prob != 0};
}

std::vector<RopeTable> ropes_of(const cd_model_spec& spec) {
  std::vector<RopeTable> ropes;
  for (int32_t i = 0; i < spec.num_ropes; ++i) {
    const cd_rope_spec& rope = spec.ropes[i];
    ropes.push_back(RopeTable{rope.rotary_dim, std::vector<double>(rope.inv_freq, rope.inv_freq + rope.rotary_dim / 2),
                              rope.attention_scaling});
  }
  return ropes;
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
                 int32_t block_size_tokens, int32_t layers_per_block)
    : dtype_(dtype),
      layout_(layout),
      num_blocks_(size_t(num_blocks)),
      layers_per_block_(size_t(layers_per_block)),
      num_kv_heads_(size_t(dims.num_kv_heads)),
      head_dim_(dims.head_dim),
      block_size_tokens_(block_size_tokens),
      row_bytes_(size_t(dims.head_dim) * dtype_bytes(dtype)),
      bytes_per_block_(uint64_t(layers_per_block) * 2 * num_kv_heads_ * size_t(block_size_tokens) *
                       row_bytes_),
      // Uninitialized on purpose: attention reads only slots written before it (or masks them
      // out), and untouched pages cost no memory until a block is first used.
      data_(allocate_aligned(size_t(bytes_per_block_) * num_blocks_)) {}

void KvCache::store(int32_t layer_slot, int32_t kv, int32_t slot, int32_t kv_head, const float* values) const {
  if (layout_ == KvLayout::kRows) {
    convert_elements(values, CD_DTYPE_F32, at(layer_slot, kv, slot, kv_head), dtype_, size_t(head_dim_));
    return;
  }
  uint16_t* region_bf16 = static_cast<uint16_t*>(region(layer_slot, kv, slot / block_size_tokens_, kv_head));
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

namespace {

// This rank's share of the model's dimensions. With fewer KV heads than ranks (size a multiple of
// them), each rank holds a copy of the one KV head its query heads read, as vLLM does.
Dimensions shard_of(Dimensions dims, int32_t tp_size) {
  dims.num_heads /= tp_size;
  dims.num_kv_heads = dims.num_kv_heads >= tp_size ? dims.num_kv_heads / tp_size : 1;
  dims.intermediate_size /= tp_size;
  return dims;
}

// Rows [row_begin, row_begin + num_rows) of a [rows, k] weight (a column-parallel shard).
cd_tensor_ref row_range(const cd_tensor_ref& ref, int32_t row_begin, int32_t num_rows, int32_t k) {
  if (ref.size_bytes == 0 || (row_begin == 0 && ref.row_stride == 0)) return ref;
  if (ref.encoding != CD_ENCODING_PLAIN) throw Error(CD_ERR_INVALID_ARGUMENT, "a tensor-parallel shard must be stored plain");
  const int64_t row_stride = ref.row_stride != 0 ? ref.row_stride : k;
  const int64_t col_stride = ref.col_stride != 0 ? ref.col_stride : 1;
  const uint64_t element_bytes = dtype_bytes(ref.dtype);
  cd_tensor_ref part = ref;
  part.offset_bytes = ref.offset_bytes + uint64_t(int64_t(row_begin) * row_stride) * element_bytes;
  part.row_stride = row_stride;
  part.size_bytes = uint64_t(int64_t(num_rows - 1) * row_stride + int64_t(k - 1) * col_stride + 1) * element_bytes;
  return part;
}

// Elements [begin, begin + n) of a vector (a bias, the sinks).
cd_tensor_ref vector_range(const cd_tensor_ref& ref, int32_t begin, int32_t n) {
  if (ref.size_bytes == 0) return ref;
  cd_tensor_ref part = row_range(ref, begin, n, 1);
  part.row_stride = ref.row_stride;  // a vector's element stride (0: contiguous)
  const int64_t stride = ref.row_stride != 0 ? ref.row_stride : 1;
  part.offset_bytes = ref.offset_bytes + uint64_t(int64_t(begin) * stride) * dtype_bytes(ref.dtype);
  part.size_bytes = uint64_t(int64_t(n - 1) * stride + 1) * dtype_bytes(ref.dtype);
  return part;
}

}  // namespace

Model::Model(const cd_model_spec& spec, const cd_load_options& options, const KernelTable& kernels,
             std::unique_ptr<Communicator> comm)
    : tp{options.tp_rank, options.tp_size < 1 ? 1 : options.tp_size, std::move(comm), 0, 0, {}, {}},
      dims(shard_of(dimensions_of(spec), tp.size)),
      numerics(numerics_of(spec, options.weight_dtype)),
      ropes(ropes_of(spec)),
      num_kv_groups(spec.num_kv_groups),
      kernels(kernels),
      pool(options.num_threads),
      weights(spec.file_paths, spec.num_files),
      kv_cache(dims, options.kv_cache_dtype, kv_layout_of(dims, options.kv_cache_dtype, options.block_size_tokens),
               options.num_kv_blocks, options.block_size_tokens, spec.layers_per_kv_block) {
  // Matrices [out, in]: the shape in the spec gives rows and k. Each weight's format follows its
  // own storage too: MXFP4 blocks become int8 blocks, exactly (their values; int16 activations
  // meet them, closer than bf16 activations would), except with fp32 weights, which keep every
  // matmul exact in fp32.
  const auto matrix = [&](const cd_tensor_ref& ref, int32_t num_rows, int32_t k) {
    const bool ggml_4bit = ref.encoding == CD_ENCODING_GGML_Q4_0 || ref.encoding == CD_ENCODING_GGML_Q4_K;
    const int64_t row_stride = ref.row_stride != 0 ? ref.row_stride : k;
    const bool whole_k_blocks = k % kQ4KBlockInputs == 0 && ref.first_column % kQ4KBlockInputs == 0 && row_stride % kQ4KBlockInputs == 0;
    const bool as_stored = whole_k_blocks && options.quantization == CD_QUANTIZATION_NONE && options.weight_dtype != CD_DTYPE_F32;
    if (as_stored && ref.encoding == CD_ENCODING_GGML_Q4_K) {
      return Matrix{weights.convert_q4k_panels(ref, num_rows, k, pool), MatrixFormat::kQ4KPanels};
    }
    if (as_stored && (ref.encoding == CD_ENCODING_GGML_Q5_K || ref.encoding == CD_ENCODING_GGML_Q6_K)) {
      return Matrix{weights.convert_q8k_panels(ref, num_rows, k, pool), MatrixFormat::kQ8KPanels};
    }
    if (options.quantization == CD_QUANTIZATION_INT4 || (ggml_4bit && options.weight_dtype != CD_DTYPE_F32)) {
      return Matrix{weights.quantize_q4_panels(ref, num_rows, k, options.weight_dtype, pool), MatrixFormat::kQ4Panels};
    }
    const bool blocks_to_int8 = (ref.encoding == CD_ENCODING_MXFP4 || is_ggml_encoding(ref.encoding)) &&
                                options.weight_dtype != CD_DTYPE_F32;
    if (options.quantization == CD_QUANTIZATION_INT8 || blocks_to_int8) {
      return Matrix{weights.quantize_q8_panels(ref, num_rows, k, options.weight_dtype, pool), MatrixFormat::kQ8Panels};
    }
    return Matrix{weights.pack_panels(ref, num_rows, k, panel_format_of(options.weight_dtype), pool),
                  panel_format_of(options.weight_dtype)};
  };
  // A row-parallel matrix as kReductionSegments column ranges of the stored one, each packed as a
  // matrix of its own.
  const auto segmented = [&](const cd_tensor_ref& ref, int32_t num_rows, int32_t k) {
    const bool blocks = is_ggml_encoding(ref.encoding);
    if (ref.encoding != CD_ENCODING_PLAIN && !blocks) throw Error(CD_ERR_INVALID_ARGUMENT, "a row-parallel matrix must be stored plain");
    SegmentedMatrix w;
    const int64_t row_stride = ref.row_stride != 0 ? ref.row_stride : k;
    const int64_t col_stride = ref.col_stride != 0 ? ref.col_stride : 1;
    const uint64_t element_bytes = dtype_bytes(ref.dtype);
    for (int32_t s = 0; s <= kReductionSegments; ++s) w.k_begin[size_t(s)] = segment_begin(k, s);
    for (int32_t s = tp.first_segment(); s < tp.end_segment(); ++s) {
      const int32_t segment_k = w.k_begin[size_t(s) + 1] - w.k_begin[size_t(s)];
      if (segment_k == 0) continue;
      cd_tensor_ref part = ref;
      if (blocks) {  // ggml blocks are addressed by element, from the tensor's start
        part.row_stride = row_stride;
        part.first_column = ref.first_column + w.k_begin[size_t(s)];
        // A Q4_K segment of whole 32-input sub-blocks inside a matrix of whole super-blocks keeps
        // Q4_K over the super-blocks it touches (row_parallel.h) instead of becoming kQ4Panels.
        const int32_t lead = int32_t(part.first_column % kQ4KBlockInputs);
        const bool pads_to_q4k = ref.encoding == CD_ENCODING_GGML_Q4_K && options.quantization == CD_QUANTIZATION_NONE &&
                                 options.weight_dtype != CD_DTYPE_F32 && (lead != 0 || segment_k % kQ4KBlockInputs != 0) &&
                                 lead % 32 == 0 && segment_k % 32 == 0 && k % kQ4KBlockInputs == 0 &&
                                 ref.first_column % kQ4KBlockInputs == 0 && row_stride % kQ4KBlockInputs == 0;
        if (pads_to_q4k) {
          const int32_t padded_k = (lead + segment_k + kQ4KBlockInputs - 1) / kQ4KBlockInputs * kQ4KBlockInputs;
          part.first_column -= lead;
          w.segments[size_t(s)] = Matrix{weights.convert_q4k_panels(part, num_rows, padded_k, pool, lead / 32, (lead + segment_k) / 32),
                                         MatrixFormat::kQ4KPanels};
          w.padded_k[size_t(s)] = padded_k;
          w.lead_inputs[size_t(s)] = lead;
          continue;
        }
        w.segments[size_t(s)] = matrix(part, num_rows, segment_k);
        continue;
      }
      part.offset_bytes = ref.offset_bytes + uint64_t(int64_t(w.k_begin[size_t(s)]) * col_stride) * element_bytes;
      part.row_stride = row_stride;
      part.col_stride = col_stride;
      part.size_bytes = uint64_t(int64_t(num_rows - 1) * row_stride + int64_t(segment_k - 1) * col_stride + 1) * element_bytes;
      w.segments[size_t(s)] = matrix(part, num_rows, segment_k);
    }
    return w;
  };
  // Norm weights and biases are tiny and held in fp32, with the values of the weight dtype.
  const auto vector = [&](const cd_tensor_ref& ref, int32_t n) {
    return weights.resolve_vector(ref, n, options.weight_dtype, pool);
  };
  // Gemma's norms multiply by (1 + w), computed in fp32 as transformers does.
  const auto norm = [&](const cd_tensor_ref& ref, int32_t n) -> const float* {
    if (spec.norms_in_fp32 != 0) return weights.resolve_vector(ref, n, CD_DTYPE_F32, pool);
    const float* values = vector(ref, n);
    if (values == nullptr || spec.norm_adds_one == 0) return values;
    float* shifted = weights.own_floats(n);
    for (int32_t i = 0; i < n; ++i) shifted[i] = 1.0f + values[i];
    return shifted;
  };
  const int32_t hidden = dims.hidden_size;
  embed_tokens = Embedding{weights.resolve(spec.embed_tokens, options.weight_dtype, options.weight_dtype, pool),
                           options.weight_dtype};
  tp.vocab_begin = tp.vocab_of(tp.rank, dims.vocab_size);
  tp.vocab_end = tp.vocab_of(tp.rank + 1, dims.vocab_size);
  lm_head = matrix(row_range(spec.lm_head, tp.vocab_begin, tp.vocab_end - tp.vocab_begin, hidden), tp.vocab_end - tp.vocab_begin,
                   hidden);
  // Column-parallel rows and row-parallel inputs of this rank (the whole model at tp.size 1).
  const int32_t q_begin = tp.rank * dims.q_size();
  const int32_t kv_begin = int32_t(int64_t(tp.rank) * spec.num_kv_heads / tp.size) * dims.head_dim;
  const int32_t mlp_begin = tp.rank * dims.intermediate_size;
  final_norm = norm(spec.final_norm, hidden);
  layers.reserve(size_t(dims.num_layers));
  for (int32_t i = 0; i < dims.num_layers; ++i) {
    const cd_layer_spec& source = spec.layers[i];
    Layer layer{};
    layer.input_norm = norm(source.input_norm, hidden);
    layer.q_proj = matrix(row_range(source.q_proj, q_begin, dims.q_size(), hidden), dims.q_size(), hidden);
    layer.k_proj = matrix(row_range(source.k_proj, kv_begin, dims.kv_size(), hidden), dims.kv_size(), hidden);
    layer.v_proj = matrix(row_range(source.v_proj, kv_begin, dims.kv_size(), hidden), dims.kv_size(), hidden);
    layer.q_bias = vector(vector_range(source.q_bias, q_begin, dims.q_size()), dims.q_size());
    layer.k_bias = vector(vector_range(source.k_bias, kv_begin, dims.kv_size()), dims.kv_size());
    layer.v_bias = vector(vector_range(source.v_bias, kv_begin, dims.kv_size()), dims.kv_size());
    layer.q_norm = norm(source.q_norm, dims.head_dim);
    layer.k_norm = norm(source.k_norm, dims.head_dim);
    layer.sinks = vector(vector_range(source.sinks, tp.rank * dims.num_heads, dims.num_heads), dims.num_heads);
    layer.o_proj = segmented(source.o_proj, hidden, dims.q_size() * tp.size);
    layer.o_bias = vector(source.o_bias, hidden);
    layer.attn_out_norm = norm(source.attn_out_norm, hidden);
    layer.ffn_norm = norm(source.ffn_norm, hidden);
    layer.ffn_out_norm = norm(source.ffn_out_norm, hidden);
    layer.sliding_window_tokens = source.sliding_window_tokens;
    layer.rope = source.rope_index;
    layer.kv_group = source.kv_group;
    layer.kv_slot = source.kv_slot;
    if (source.num_experts == 0) {
      layer.gate_proj = matrix(row_range(source.gate_proj, mlp_begin, dims.intermediate_size, hidden), dims.intermediate_size, hidden);
      layer.up_proj = matrix(row_range(source.up_proj, mlp_begin, dims.intermediate_size, hidden), dims.intermediate_size, hidden);
      layer.down_proj = segmented(source.down_proj, hidden, dims.intermediate_size * tp.size);
    } else {
      // The router stays fp32: its top-k is a discontinuous choice.
      layer.router = Matrix{weights.pack_panels(source.router, source.num_experts, hidden, MatrixFormat::kF32Panels, pool),
                            MatrixFormat::kF32Panels};
      layer.router_bias = vector(source.router_bias, source.num_experts);
      const int32_t width = dims.moe_intermediate_size;
      // This rank's experts whole; every expert's biases (the combination adds each down bias).
      const int32_t first_held = first_expert_of(tp.rank, tp.size, source.num_experts);
      const int32_t end_held = first_expert_of(tp.rank + 1, tp.size, source.num_experts);
      for (int32_t e = 0; e < source.num_experts; ++e) {
        const cd_expert_spec& expert = source.experts[e];
        const bool held = e >= first_held && e < end_held;
        Matrix gate_up{}, gate{}, up{};
        if (held) {
          weights.begin_pair();
          gate = matrix(expert.gate_proj, width, hidden);
          up = matrix(expert.up_proj, width, hidden);
          const uint8_t* pair = weights.end_pair(num_panels(width), gate.format == up.format);
          if (pair != nullptr) {
            gate_up = Matrix{pair, gate.format};
            gate = up = Matrix{};
          }
        }
        layer.experts.push_back(Expert{gate_up, gate, up, held ? matrix(expert.down_proj, hidden, width) : Matrix{},
                                       vector(expert.gate_bias, width), vector(expert.up_bias, width), vector(expert.down_bias, hidden)});
      }
    }
    layers.push_back(std::move(layer));
  }
  tp.experts.comm = tp.comm.get();
  weights.release_unborrowed_files();
  workspace.scores.resize(size_t(options.num_threads));
  workspace.samplers.resize(size_t(options.num_threads));
}

}  // namespace conduit
