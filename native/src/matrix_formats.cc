// Which format each weight matrix of a loaded model is held in (cd_model_matrix_formats): the
// load's per-matrix choices (model.cc) depend on the file's block types, the segment bounds and
// the options, and a fallback to a slower or less exact format would still compute plausible
// logits, so tests and operators read the choices here instead of inferring them.
#include <cstdio>
#include <string>

#include "conduit.h"
#include "model.h"

namespace conduit {
namespace {

const char* format_name(MatrixFormat format) {
  switch (format) {
    case MatrixFormat::kF32Panels: return "fp32";
    case MatrixFormat::kF16Panels: return "fp16";
    case MatrixFormat::kBf16Panels: return "bf16";
    case MatrixFormat::kQ8Panels: return "int8";
    case MatrixFormat::kQ4Panels: return "int4";
    case MatrixFormat::kQ4KPanels: return "q4_k";
    case MatrixFormat::kQ8KPanels: return "q8_k";
  }
  return "unknown";
}

void add(std::string& text, const std::string& name, const Matrix& matrix) {
  if (matrix.data == nullptr) return;  // absent (no such tensor, or another rank's share)
  text += name;
  text += ' ';
  text += format_name(matrix.format);
  text += '\n';
}

void add_segments(std::string& text, const std::string& name, const SegmentedMatrix& matrix) {
  for (int32_t s = 0; s < kReductionSegments; ++s) add(text, name + "." + std::to_string(s), matrix.segments[size_t(s)]);
}

std::string matrix_formats(const Model& model) {
  std::string text;
  add(text, "lm_head", model.lm_head);
  for (size_t i = 0; i < model.layers.size(); ++i) {
    const Layer& layer = model.layers[i];
    const std::string prefix = "layers." + std::to_string(i) + ".";
    add(text, prefix + "q_proj", layer.q_proj);
    add(text, prefix + "k_proj", layer.k_proj);
    add(text, prefix + "v_proj", layer.v_proj);
    add_segments(text, prefix + "o_proj", layer.o_proj);
    add(text, prefix + "gate_proj", layer.gate_proj);
    add(text, prefix + "up_proj", layer.up_proj);
    add_segments(text, prefix + "down_proj", layer.down_proj);
    add(text, prefix + "router", layer.router);
    for (size_t e = 0; e < layer.experts.size(); ++e) {
      const Expert& expert = layer.experts[e];
      const std::string expert_prefix = prefix + "experts." + std::to_string(e) + ".";
      add(text, expert_prefix + "gate_up_proj", expert.gate_up);
      add(text, expert_prefix + "gate_proj", expert.gate_proj);
      add(text, expert_prefix + "up_proj", expert.up_proj);
      add(text, expert_prefix + "down_proj", expert.down_proj);
    }
  }
  return text;
}

}  // namespace
}  // namespace conduit

// No exception crosses the C API: out of memory lists nothing.
extern "C" size_t cd_model_matrix_formats(const cd_model* model, char* out, size_t capacity) {
  try {
    const std::string text = model->model == nullptr ? std::string() : conduit::matrix_formats(*model->model);
    if (capacity > 0) std::snprintf(out, capacity, "%s", text.c_str());
    return text.size();
  } catch (...) {
    if (capacity > 0) out[0] = '\0';
    return 0;
  }
}
