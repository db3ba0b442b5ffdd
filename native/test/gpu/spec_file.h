// A cd_model_spec written to a text file by tools/gpu-check-prepare.ts (which runs the project's
// checkpoint reader, native/checkpoint.ts), read back here by the GPU check program, which runs
// where Node is not installed. File paths in it are relative to the spec file.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "conduit.h"

namespace conduit {
namespace check {

struct SpecFile {
  std::string name;
  std::string architecture;
  std::vector<std::string> paths;
  std::vector<const char*> path_pointers;
  std::vector<std::vector<double>> inv_freqs;
  std::vector<cd_rope_spec> ropes;
  std::vector<cd_layer_spec> layers;
  std::vector<std::vector<cd_expert_spec>> experts;
  cd_model_spec spec{};
};

inline cd_dtype dtype_named(const std::string& name) {
  return name == "fp32" ? CD_DTYPE_F32 : name == "fp16" ? CD_DTYPE_F16 : CD_DTYPE_BF16;
}

inline cd_tensor_ref read_ref(std::istringstream& in) {
  cd_tensor_ref ref{};
  std::string dtype, encoding;
  in >> ref.file_index >> ref.offset_bytes >> ref.size_bytes >> dtype >> encoding >> ref.row_stride >> ref.col_stride >>
      ref.scales_file_index >> ref.scales_offset_bytes >> ref.scales_size_bytes;
  ref.dtype = dtype_named(dtype);
  ref.encoding = encoding == "mxfp4" ? CD_ENCODING_MXFP4 : CD_ENCODING_PLAIN;
  return ref;
}

inline void read_spec_file(const std::string& file, SpecFile& out) {
  std::ifstream stream(file);
  if (!stream) throw std::runtime_error("cannot read " + file);
  const std::string dir = file.substr(0, file.rfind('/') + 1);
  std::map<std::string, double> scalars;
  std::map<std::string, std::string> words;
  std::string line;
  cd_model_spec& spec = out.spec;
  while (std::getline(stream, line)) {
    std::istringstream in(line);
    std::string key;
    in >> key;
    if (key == "file") {
      std::string path;
      in >> path;
      out.paths.push_back(path.empty() || path[0] == '/' ? path : dir + path);
    } else if (key == "rope") {
      cd_rope_spec rope{};
      size_t n = 0;
      in >> rope.rotary_dim >> rope.attention_scaling >> n;
      std::vector<double> inv(n);
      for (double& value : inv) in >> value;
      out.inv_freqs.push_back(inv);
      out.ropes.push_back(rope);
    } else if (key == "layer") {
      cd_layer_spec layer{};
      int32_t index = 0, num_experts = 0;
      in >> index >> layer.sliding_window_tokens >> layer.rope_index >> layer.kv_group >> layer.kv_slot >> num_experts;
      layer.num_experts = num_experts;
      out.layers.push_back(layer);
      out.experts.emplace_back(size_t(num_experts));
    } else if (key == "tensor") {
      std::string scope, name;
      in >> scope >> name;
      const cd_tensor_ref ref = read_ref(in);
      if (scope == "model") {
        if (name == "embedTokens") spec.embed_tokens = ref;
        else if (name == "finalNorm") spec.final_norm = ref;
        else if (name == "lmHead") spec.lm_head = ref;
        continue;
      }
      cd_layer_spec& layer = out.layers.at(size_t(std::stoi(scope)));
      static const std::map<std::string, cd_tensor_ref cd_layer_spec::*> fields = {
          {"inputNorm", &cd_layer_spec::input_norm}, {"qProj", &cd_layer_spec::q_proj},
          {"kProj", &cd_layer_spec::k_proj},         {"vProj", &cd_layer_spec::v_proj},
          {"qBias", &cd_layer_spec::q_bias},         {"kBias", &cd_layer_spec::k_bias},
          {"vBias", &cd_layer_spec::v_bias},         {"qNorm", &cd_layer_spec::q_norm},
          {"kNorm", &cd_layer_spec::k_norm},         {"sinks", &cd_layer_spec::sinks},
          {"oProj", &cd_layer_spec::o_proj},         {"oBias", &cd_layer_spec::o_bias},
          {"attentionOutputNorm", &cd_layer_spec::attn_out_norm},
          {"ffnNorm", &cd_layer_spec::ffn_norm},     {"ffnOutputNorm", &cd_layer_spec::ffn_out_norm},
          {"gateProj", &cd_layer_spec::gate_proj},   {"upProj", &cd_layer_spec::up_proj},
          {"downProj", &cd_layer_spec::down_proj},   {"router", &cd_layer_spec::router},
          {"routerBias", &cd_layer_spec::router_bias}};
      const auto field = fields.find(name);
      if (field != fields.end()) {
        layer.*(field->second) = ref;
        continue;
      }
      // expert.<e>.<name>
      const size_t dot = name.find('.', 7);
      const size_t e = size_t(std::stoi(name.substr(7, dot - 7)));
      const std::string part = name.substr(dot + 1);
      cd_expert_spec& expert = out.experts.at(size_t(std::stoi(scope))).at(e);
      if (part == "gateProj") expert.gate_proj = ref;
      else if (part == "upProj") expert.up_proj = ref;
      else if (part == "downProj") expert.down_proj = ref;
      else if (part == "gateBias") expert.gate_bias = ref;
      else if (part == "upBias") expert.up_bias = ref;
      else if (part == "downBias") expert.down_bias = ref;
    } else if (key == "architecture" || key == "activation" || key == "routing") {
      in >> words[key];
    } else if (!key.empty()) {
      in >> scalars[key];
    }
  }
  out.architecture = words["architecture"];
  for (const std::string& path : out.paths) out.path_pointers.push_back(path.c_str());
  for (size_t i = 0; i < out.ropes.size(); ++i) out.ropes[i].inv_freq = out.inv_freqs[i].data();
  for (size_t i = 0; i < out.layers.size(); ++i) out.layers[i].experts = out.experts[i].data();
  spec.file_paths = out.path_pointers.data();
  spec.num_files = int32_t(out.paths.size());
  const auto integer = [&](const char* key) { return int32_t(scalars[key]); };
  spec.num_layers = integer("numLayers");
  spec.hidden_size = integer("hiddenSize");
  spec.intermediate_size = integer("intermediateSize");
  spec.num_heads = integer("numHeads");
  spec.num_kv_heads = integer("numKvHeads");
  spec.head_dim = integer("headDim");
  spec.vocab_size = integer("vocabSize");
  spec.rms_norm_eps = scalars["rmsNormEps"];
  spec.norm_adds_one = integer("normAddsOne");
  spec.embedding_scale = scalars["embeddingScale"];
  spec.attention_scale = scalars["attentionScale"];
  spec.attention_softcap = scalars["attentionSoftcap"];
  spec.final_softcap = scalars["finalSoftcap"];
  const std::string activation = words["activation"];
  spec.activation = activation == "gelu_tanh"        ? CD_ACTIVATION_GELU_TANH
                    : activation == "clamped_swiglu" ? CD_ACTIVATION_CLAMPED_SWIGLU
                                                     : CD_ACTIVATION_SILU;
  spec.swiglu_alpha = scalars["swigluAlpha"];
  spec.swiglu_limit = scalars["swigluLimit"];
  spec.moe_intermediate_size = integer("moeIntermediateSize");
  spec.num_experts_per_token = integer("numExpertsPerToken");
  spec.routing = words["routing"] == "topk_softmax" ? CD_ROUTING_TOPK_SOFTMAX : CD_ROUTING_SOFTMAX_TOPK;
  spec.norm_topk_prob = integer("normTopkProb");
  spec.ropes = out.ropes.data();
  spec.num_ropes = int32_t(out.ropes.size());
  spec.num_kv_groups = integer("numKvGroups");
  spec.layers_per_kv_block = integer("layersPerKvBlock");
  spec.layers = out.layers.data();
}

}  // namespace check
}  // namespace conduit
