// The N-API side of loading: a ModelSpec and LoadOptions (native/api.ts) become the C API's plain
// structs on the JS thread; cd_model_load runs in an AsyncWorker.
#include <string>
#include <vector>

#include "binding_common.h"

namespace conduit::binding {
namespace {

template <typename T>
std::vector<T> copy_of(const Napi::Value& value) {
  const Napi::TypedArrayOf<T> array = value.As<Napi::TypedArrayOf<T>>();
  return std::vector<T>(array.Data(), array.Data() + array.ElementLength());
}

cd_encoding encoding_from(const Napi::Value& value) {
  if (!value.IsString()) return CD_ENCODING_PLAIN;
  const std::string name = value.As<Napi::String>().Utf8Value();
  if (name == "mxfp4") return CD_ENCODING_MXFP4;
  if (name == "q8_0") return CD_ENCODING_GGML_Q8_0;
  if (name == "q4_0") return CD_ENCODING_GGML_Q4_0;
  if (name == "q4_k") return CD_ENCODING_GGML_Q4_K;
  if (name == "q5_k") return CD_ENCODING_GGML_Q5_K;
  if (name == "q6_k") return CD_ENCODING_GGML_Q6_K;
  if (name == "ggml_mxfp4") return CD_ENCODING_GGML_MXFP4;
  return CD_ENCODING_PLAIN;
}

// A TensorRef (native/checkpoint.ts); absent (undefined or null) is an empty ref.
cd_tensor_ref tensor_ref_from(const Napi::Value& value) {
  cd_tensor_ref ref{};
  if (value.IsUndefined() || value.IsNull()) return ref;
  const Napi::Object object = value.As<Napi::Object>();
  ref.file_index = int_of(object, "fileIndex");
  ref.offset_bytes = uint64_t(int64_or_zero(object, "offsetBytes"));
  ref.size_bytes = uint64_t(int64_or_zero(object, "sizeBytes"));
  ref.dtype = dtype_from(object.Get("dtype"));
  ref.encoding = encoding_from(object.Get("encoding"));
  ref.row_stride = int64_or_zero(object, "rowStride");
  ref.col_stride = int64_or_zero(object, "colStride");
  ref.scales_file_index = int32_t(int64_or_zero(object, "scalesFileIndex"));
  ref.scales_offset_bytes = uint64_t(int64_or_zero(object, "scalesOffsetBytes"));
  ref.scales_size_bytes = uint64_t(int64_or_zero(object, "scalesSizeBytes"));
  ref.rotary_permuted_head_dim = int32_t(int64_or_zero(object, "rotaryPermutedHeadDim"));
  return ref;
}

cd_activation activation_from(const Napi::Value& value) {
  const std::string name = value.As<Napi::String>().Utf8Value();
  if (name == "gelu_tanh") return CD_ACTIVATION_GELU_TANH;
  if (name == "clamped_swiglu") return CD_ACTIVATION_CLAMPED_SWIGLU;
  return CD_ACTIVATION_SILU;
}

class LoadWorker : public Napi::AsyncWorker {
 public:
  LoadWorker(Napi::Env env, const Napi::Object& spec, const Napi::Object& options)
      : Napi::AsyncWorker(env), deferred_(Napi::Promise::Deferred::New(env)) {
    const Napi::Array paths = spec.Get("filePaths").As<Napi::Array>();
    for (uint32_t i = 0; i < paths.Length(); ++i) {
      file_paths_.push_back(paths.Get(i).As<Napi::String>().Utf8Value());
    }
    for (const std::string& path : file_paths_) file_path_pointers_.push_back(path.c_str());
    const Napi::Array ropes = spec.Get("ropes").As<Napi::Array>();
    for (uint32_t i = 0; i < ropes.Length(); ++i) rope_inv_freqs_.push_back(copy_of<double>(ropes.Get(i).As<Napi::Object>().Get("invFreq")));
    for (uint32_t i = 0; i < ropes.Length(); ++i) {
      const Napi::Object rope = ropes.Get(i).As<Napi::Object>();
      ropes_.push_back(cd_rope_spec{int_of(rope, "rotaryDim"), rope_inv_freqs_[i].data(), double_of(rope, "attentionScaling")});
    }
    const Napi::Array layers = spec.Get("layers").As<Napi::Array>();
    experts_.resize(layers.Length());
    for (uint32_t i = 0; i < layers.Length(); ++i) {
      const Napi::Object layer = layers.Get(i).As<Napi::Object>();
      const auto ref = [&](const char* key) { return tensor_ref_from(layer.Get(key)); };
      cd_layer_spec out{};
      out.input_norm = ref("inputNorm");
      out.q_proj = ref("qProj");
      out.k_proj = ref("kProj");
      out.v_proj = ref("vProj");
      out.q_bias = ref("qBias");
      out.k_bias = ref("kBias");
      out.v_bias = ref("vBias");
      out.q_norm = ref("qNorm");
      out.k_norm = ref("kNorm");
      out.sinks = ref("sinks");
      out.o_proj = ref("oProj");
      out.o_bias = ref("oBias");
      out.attn_out_norm = ref("attentionOutputNorm");
      out.ffn_norm = ref("ffnNorm");
      out.ffn_out_norm = ref("ffnOutputNorm");
      out.sliding_window_tokens = int_of(layer, "slidingWindowTokens");
      out.rope_index = int_of(layer, "ropeIndex");
      out.kv_group = int_of(layer, "kvGroup");
      out.kv_slot = int_of(layer, "kvSlot");
      out.gate_proj = ref("gateProj");
      out.up_proj = ref("upProj");
      out.down_proj = ref("downProj");
      const Napi::Value experts = layer.Get("experts");
      if (experts.IsArray()) {
        const Napi::Array list = experts.As<Napi::Array>();
        for (uint32_t e = 0; e < list.Length(); ++e) {
          const Napi::Object expert = list.Get(e).As<Napi::Object>();
          experts_[i].push_back(cd_expert_spec{
              tensor_ref_from(expert.Get("gateProj")), tensor_ref_from(expert.Get("upProj")),
              tensor_ref_from(expert.Get("downProj")), tensor_ref_from(expert.Get("gateBias")),
              tensor_ref_from(expert.Get("upBias")), tensor_ref_from(expert.Get("downBias"))});
        }
        out.router = ref("router");
        out.router_bias = ref("routerBias");
      }
      out.num_experts = int32_t(experts_[i].size());
      out.experts = experts_[i].data();
      layers_.push_back(out);
    }
    spec_ = cd_model_spec{};
    spec_.file_paths = file_path_pointers_.data();
    spec_.num_files = int32_t(file_path_pointers_.size());
    spec_.num_layers = int_of(spec, "numLayers");
    spec_.hidden_size = int_of(spec, "hiddenSize");
    spec_.intermediate_size = int_of(spec, "intermediateSize");
    spec_.num_heads = int_of(spec, "numHeads");
    spec_.num_kv_heads = int_of(spec, "numKvHeads");
    spec_.head_dim = int_of(spec, "headDim");
    spec_.vocab_size = int_of(spec, "vocabSize");
    spec_.rms_norm_eps = double_of(spec, "rmsNormEps");
    spec_.norm_adds_one = spec.Get("normAddsOne").ToBoolean().Value() ? 1 : 0;
    spec_.norms_in_fp32 = spec.Get("normsInFp32").ToBoolean().Value() ? 1 : 0;
    spec_.embedding_scale = double_of(spec, "embeddingScale");
    spec_.attention_scale = double_of(spec, "attentionScale");
    spec_.attention_softcap = double_of(spec, "attentionSoftcap");
    spec_.final_softcap = double_of(spec, "finalSoftcap");
    spec_.activation = activation_from(spec.Get("activation"));
    spec_.swiglu_alpha = double_of(spec, "swigluAlpha");
    spec_.swiglu_limit = double_of(spec, "swigluLimit");
    spec_.moe_intermediate_size = int_of(spec, "moeIntermediateSize");
    spec_.num_experts_per_token = int_of(spec, "numExpertsPerToken");
    spec_.routing = spec.Get("routing").As<Napi::String>().Utf8Value() == "topk_softmax" ? CD_ROUTING_TOPK_SOFTMAX
                                                                                       : CD_ROUTING_SOFTMAX_TOPK;
    spec_.norm_topk_prob = spec.Get("normTopkProb").ToBoolean().Value() ? 1 : 0;
    spec_.ropes = ropes_.data();
    spec_.num_ropes = int32_t(ropes_.size());
    spec_.num_kv_groups = int_of(spec, "numKvGroups");
    spec_.layers_per_kv_block = int_of(spec, "layersPerKvBlock");
    spec_.embed_tokens = tensor_ref_from(spec.Get("embedTokens"));
    spec_.final_norm = tensor_ref_from(spec.Get("finalNorm"));
    spec_.lm_head = tensor_ref_from(spec.Get("lmHead"));
    spec_.layers = layers_.data();
    options_ = cd_load_options{dtype_from(options.Get("weightDtype")),
                               quantization_from(options.Get("quantization").As<Napi::String>().Utf8Value()),
                               dtype_from(options.Get("kvCacheDtype")),
                               int_of(options, "numKvBlocks"),
                               int_of(options, "blockSizeTokens"),
                               int_of(options, "numThreads"),
                               kernel_from(options.Get("kernel")),
                               options.Get("device").As<Napi::String>().Utf8Value() == "cuda" ? CD_DEVICE_CUDA
                                                                                               : CD_DEVICE_CPU,
                               1, 0, nullptr, 0, nullptr,
                               int_of(options, "deviceIndex")};
    const Napi::Value tensor_parallel = options.Get("tensorParallel");
    if (tensor_parallel.IsObject()) {
      const Napi::Object tp = tensor_parallel.As<Napi::Object>();
      tp_group_ = tp.Get("group").As<Napi::String>().Utf8Value();
      options_.tp_size = int_of(tp, "size");
      options_.tp_rank = int_of(tp, "rank");
      options_.tp_group = tp_group_.c_str();
      options_.tp_connect_timeout_ms = int_of(tp, "connectTimeoutMs");
      const Napi::Value pids = tp.Get("rankPids");
      if (pids.IsArray()) {
        const Napi::Array list = pids.As<Napi::Array>();
        for (uint32_t i = 0; i < list.Length(); ++i) tp_rank_pids_.push_back(list.Get(i).As<Napi::Number>().Int32Value());
        options_.tp_rank_pids = tp_rank_pids_.data();
      }
    }
  }

  Napi::Promise promise() const { return deferred_.Promise(); }

  void Execute() override {
    status_ = cd_model_load(&spec_, &options_, &model_, error_, kErrorCapacity);
  }

  void OnOK() override {
    Napi::Env env = Env();
    if (status_ != CD_OK) {
      reject(deferred_, env, status_, error_);
      return;
    }
    cd_model_info info;
    cd_model_get_info(model_, &info);
    Napi::Object result = Napi::Object::New(env);
    result.Set("handle", new_model_handle(env, model_));
    result.Set("kernel", Napi::String::New(env, cd_kernel_name(info.kernel)));
    result.Set("kvBytesPerBlock", Napi::Number::New(env, double(info.kv_bytes_per_block)));
    result.Set("numaNode", Napi::Number::New(env, info.numa_node));
    deferred_.Resolve(result);
  }

 private:
  Napi::Promise::Deferred deferred_;
  std::vector<std::string> file_paths_;
  std::vector<const char*> file_path_pointers_;
  std::vector<std::vector<double>> rope_inv_freqs_;
  std::vector<cd_rope_spec> ropes_;
  std::vector<std::vector<cd_expert_spec>> experts_;
  std::vector<cd_layer_spec> layers_;
  cd_model_spec spec_{};
  cd_load_options options_{};
  std::string tp_group_;
  std::vector<int32_t> tp_rank_pids_;
  cd_model* model_ = nullptr;
  cd_status status_ = CD_OK;
  char error_[kErrorCapacity] = {};
};

}  // namespace

// loadModel(spec, options) -> Promise<{ handle, kernel, kvBytesPerBlock, numaNode }>
Napi::Value LoadModel(const Napi::CallbackInfo& info) {
  auto* worker = new LoadWorker(info.Env(), info[0].As<Napi::Object>(), info[1].As<Napi::Object>());
  worker->Queue();
  return worker->promise();
}

}  // namespace conduit::binding
