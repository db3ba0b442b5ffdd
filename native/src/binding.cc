// N-API registration and marshalling only: JS values become plain C structs on the main thread,
// loading runs in an AsyncWorker, a forward pass on the runtime's own threads (its end comes back
// through a thread-safe function), and statuses become rejected promises.
#include <napi.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "conduit.h"
#include "block_hash.h"

namespace {

constexpr size_t kErrorCapacity = 1024;

struct ModelHandle;
struct ForwardRequest;
void complete_forward(Napi::Env env, Napi::Function, ModelHandle* handle, ForwardRequest* request);
using ForwardDone = Napi::TypedThreadSafeFunction<ModelHandle, ForwardRequest, complete_forward>;

// Owns the native model behind the JS handle; close() frees it early, the finalizer otherwise.
// The handle's object and its thread-safe function each hold it (JS thread only): at exit Node
// finalizes the function first, and releasing it then would abort.
struct ModelHandle {
  cd_model* model = nullptr;
  // Carries each finished pass to the JS thread; referenced (keeping the event loop alive) only
  // while a pass runs.
  ForwardDone forward_done;
  bool forward_done_open = true;
  int32_t num_holders = 2;
};

void let_go(ModelHandle* handle) {
  if (--handle->num_holders == 0) delete handle;
}

const char* status_code(cd_status status) {
  switch (status) {
    case CD_ERR_INVALID_ARGUMENT: return "CD_ERR_INVALID_ARGUMENT";
    case CD_ERR_UNSUPPORTED_KERNEL: return "CD_ERR_UNSUPPORTED_KERNEL";
    case CD_ERR_IO: return "CD_ERR_IO";
    case CD_ERR_OUT_OF_MEMORY: return "CD_ERR_OUT_OF_MEMORY";
    case CD_ERR_UNSUPPORTED_DEVICE: return "CD_ERR_UNSUPPORTED_DEVICE";
    case CD_ERR_RANK_UNAVAILABLE: return "CD_ERR_RANK_UNAVAILABLE";
    default: return "CD_ERR_INTERNAL";
  }
}

cd_dtype dtype_from(const Napi::Value& value) {
  const std::string name = value.As<Napi::String>().Utf8Value();
  if (name == "bf16") return CD_DTYPE_BF16;
  if (name == "fp16") return CD_DTYPE_F16;
  return CD_DTYPE_F32;
}

cd_kernel kernel_from(const Napi::Value& value) {
  const std::string name = value.As<Napi::String>().Utf8Value();
  for (cd_kernel kernel : {CD_KERNEL_AMX, CD_KERNEL_AVX512, CD_KERNEL_AVX2, CD_KERNEL_SCALAR}) {
    if (name == cd_kernel_name(kernel)) return kernel;
  }
  return CD_KERNEL_AUTO;
}

int32_t int_of(const Napi::Object& object, const char* key) {
  return object.Get(key).As<Napi::Number>().Int32Value();
}

int64_t int64_or_zero(const Napi::Object& object, const char* key) {
  const Napi::Value value = object.Get(key);
  return value.IsNumber() ? value.As<Napi::Number>().Int64Value() : 0;
}

double double_of(const Napi::Object& object, const char* key) { return object.Get(key).As<Napi::Number>().DoubleValue(); }

cd_quantization quantization_from(const std::string& name) {
  if (name == "int8") return CD_QUANTIZATION_INT8;
  if (name == "int4") return CD_QUANTIZATION_INT4;
  return CD_QUANTIZATION_NONE;
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

template <typename T>
std::vector<T> copy_of(const Napi::Value& value) {
  const Napi::TypedArrayOf<T> array = value.As<Napi::TypedArrayOf<T>>();
  return std::vector<T>(array.Data(), array.Data() + array.ElementLength());
}

// An output typed array's storage; null when it is empty (an output nothing asked for).
template <typename T>
T* data_of(const Napi::Object& outputs, const char* key) {
  Napi::TypedArrayOf<T> array = outputs.Get(key).As<Napi::TypedArrayOf<T>>();
  return array.ElementLength() == 0 ? nullptr : array.Data();
}

void reject(Napi::Promise::Deferred& deferred, Napi::Env env, cd_status status, const char* message) {
  Napi::Error error = Napi::Error::New(env, message);
  error.Set("code", Napi::String::New(env, status_code(status)));
  deferred.Reject(error.Value());
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
    auto* handle = new ModelHandle{model_, {}};
    handle->forward_done = ForwardDone::New(env, "conduit forward", 0, 1, handle, [](Napi::Env, void*, ModelHandle* h) {
      h->forward_done_open = false;
      let_go(h);
    });
    handle->forward_done.Unref(env);
    cd_model_info info;
    cd_model_get_info(model_, &info);
    Napi::Object result = Napi::Object::New(env);
    result.Set("handle", Napi::External<ModelHandle>::New(env, handle, [](Napi::Env, ModelHandle* h) {
                 cd_model_free(h->model);
                 h->model = nullptr;
                 if (h->forward_done_open) h->forward_done.Release();
                 let_go(h);
               }));
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

// One forward pass from the call to its settled promise. Inputs are copied so the caller may
// reuse its arrays at once; outputs are written straight into the caller's typed arrays, which
// stay referenced until the promise settles.
struct ForwardRequest {
  ForwardRequest(Napi::Env env, ModelHandle* model_handle, const Napi::Object& batch_object, const Napi::Object& outputs_object)
      : handle(model_handle), deferred(Napi::Promise::Deferred::New(env)) {
    copy_inputs(batch_object);
    point_batch_at_inputs(batch_object);
    output = cd_forward_output{data_of<int32_t>(outputs_object, "sampledTokenIds"),
                               data_of<float>(outputs_object, "sampledLogprobs"),
                               data_of<float>(outputs_object, "logits"),
                               data_of<int32_t>(outputs_object, "topTokenIds"),
                               data_of<float>(outputs_object, "topLogprobs"),
                               data_of<float>(outputs_object, "promptLogprobs"),
                               data_of<int32_t>(outputs_object, "promptTopTokenIds"),
                               data_of<float>(outputs_object, "promptTopLogprobs"),
                               data_of<int32_t>(outputs_object, "promptRanks"),
                               nullptr};
    outputs = Napi::Persistent(outputs_object);
    point_batch_at_bitmasks(batch_object);
    point_batch_at_drafts(batch_object, outputs_object);
  }

  // Proposals ride only in batches that carry them (numDraftTokens absent or null: none).
  void point_batch_at_drafts(const Napi::Object& batch_object, const Napi::Object& outputs_object) {
    const Napi::Value drafts = batch_object.Get("numDraftTokens");
    if (drafts.IsUndefined() || drafts.IsNull()) return;
    num_draft_tokens = copy_of<int32_t>(drafts);
    batch.num_draft_tokens = num_draft_tokens.data();
    output.num_accepted_tokens = data_of<int32_t>(outputs_object, "numAcceptedTokens");
  }

  // A tensor-parallel rank's serving loop: settles like a pass, with no batch of its own.
  ForwardRequest(Napi::Env env, ModelHandle* model_handle)
      : handle(model_handle), deferred(Napi::Promise::Deferred::New(env)) {}

  // The bitmask rows and their counter are read in place, not copied: other threads may still be
  // writing them while the pass runs. They stay referenced until the promise settles.
  void point_batch_at_bitmasks(const Napi::Object& batch_object) {
    const Napi::Value rows = batch_object.Get("bitmaskRows");
    if (rows.IsUndefined() || rows.IsNull()) return;
    bitmask_rows = copy_of<int32_t>(rows);
    Napi::TypedArrayOf<int32_t> bitmask = batch_object.Get("tokenBitmask").As<Napi::TypedArrayOf<int32_t>>();
    bitmask_reference = Napi::Persistent(bitmask);
    batch.bitmask_rows = bitmask_rows.data();
    batch.token_bitmask = reinterpret_cast<const uint32_t*>(bitmask.Data());
    batch.bitmask_words = int_of(batch_object, "bitmaskWords");
    const Napi::Value ready = batch_object.Get("bitmaskReady");
    if (ready.IsUndefined() || ready.IsNull()) return;
    Napi::TypedArrayOf<int32_t> ready_array = ready.As<Napi::TypedArrayOf<int32_t>>();
    ready_reference = Napi::Persistent(ready_array);
    batch.bitmask_ready = ready_array.Data();
    batch.bitmask_ready_target = int_of(batch_object, "bitmaskReadyTarget");
  }

  void copy_inputs(const Napi::Object& batch_object) {
    token_ids = copy_of<int32_t>(batch_object.Get("tokenIds"));
    positions = copy_of<int32_t>(batch_object.Get("positions"));
    query_starts = copy_of<int32_t>(batch_object.Get("queryStarts"));
    block_tables = copy_of<int32_t>(batch_object.Get("blockTables"));
    seq_flags = copy_of<uint8_t>(batch_object.Get("seqFlags"));
    temperatures = copy_of<float>(batch_object.Get("temperatures"));
    top_ps = copy_of<float>(batch_object.Get("topPs"));
    top_ks = copy_of<int32_t>(batch_object.Get("topKs"));
    seeds = copy_of<uint64_t>(batch_object.Get("seeds"));
    output_indices = copy_of<int32_t>(batch_object.Get("outputIndices"));
    min_ps = copy_of<float>(batch_object.Get("minPs"));
    presence_penalties = copy_of<float>(batch_object.Get("presencePenalties"));
    frequency_penalties = copy_of<float>(batch_object.Get("frequencyPenalties"));
    repetition_penalties = copy_of<float>(batch_object.Get("repetitionPenalties"));
    penalty_starts = copy_of<int32_t>(batch_object.Get("penaltyStarts"));
    penalty_token_ids = copy_of<int32_t>(batch_object.Get("penaltyTokenIds"));
    penalty_output_counts = copy_of<int32_t>(batch_object.Get("penaltyOutputCounts"));
    penalty_in_prompt = copy_of<uint8_t>(batch_object.Get("penaltyInPrompt"));
    bias_starts = copy_of<int32_t>(batch_object.Get("biasStarts"));
    bias_token_ids = copy_of<int32_t>(batch_object.Get("biasTokenIds"));
    bias_values = copy_of<float>(batch_object.Get("biasValues"));
    num_top_logprobs = copy_of<int32_t>(batch_object.Get("numTopLogprobs"));
    num_prompt_top_logprobs = copy_of<int32_t>(batch_object.Get("numPromptTopLogprobs"));
    prompt_next_token_ids = copy_of<int32_t>(batch_object.Get("promptNextTokenIds"));
  }

  void point_batch_at_inputs(const Napi::Object& batch_object) {
    batch.num_seqs = int_of(batch_object, "numSeqs");
    batch.num_tokens = int_of(batch_object, "numTokens");
    batch.token_ids = token_ids.data();
    batch.positions = positions.data();
    batch.query_starts = query_starts.data();
    batch.max_blocks_per_seq = int_of(batch_object, "maxBlocksPerSeq");
    batch.block_tables = block_tables.data();
    batch.seq_flags = seq_flags.data();
    batch.temperatures = temperatures.data();
    batch.top_ps = top_ps.data();
    batch.top_ks = top_ks.data();
    batch.seeds = seeds.data();
    batch.output_indices = output_indices.data();
    batch.min_ps = min_ps.data();
    batch.presence_penalties = presence_penalties.data();
    batch.frequency_penalties = frequency_penalties.data();
    batch.repetition_penalties = repetition_penalties.data();
    batch.penalty_starts = penalty_starts.data();
    batch.penalty_token_ids = penalty_token_ids.data();
    batch.penalty_output_counts = penalty_output_counts.data();
    batch.penalty_in_prompt = penalty_in_prompt.data();
    batch.bias_starts = bias_starts.data();
    batch.bias_token_ids = bias_token_ids.data();
    batch.bias_values = bias_values.data();
    batch.num_top_logprobs = num_top_logprobs.data();
    batch.num_prompt_top_logprobs = num_prompt_top_logprobs.data();
    batch.prompt_next_token_ids = prompt_next_token_ids.data();
  }

  ModelHandle* handle;
  Napi::Promise::Deferred deferred;
  Napi::ObjectReference outputs;
  Napi::Reference<Napi::TypedArrayOf<int32_t>> bitmask_reference, ready_reference;
  std::vector<int32_t> bitmask_rows, num_draft_tokens;
  std::vector<int32_t> token_ids, positions, query_starts, block_tables, top_ks, output_indices, penalty_starts,
      penalty_token_ids, penalty_output_counts, bias_starts, bias_token_ids, num_top_logprobs, num_prompt_top_logprobs,
      prompt_next_token_ids;
  std::vector<uint8_t> seq_flags, penalty_in_prompt;
  std::vector<float> temperatures, top_ps, min_ps, presence_penalties, frequency_penalties, repetition_penalties,
      bias_values;
  std::vector<uint64_t> seeds;
  cd_batch batch{};
  cd_forward_output output{};
  cd_status status = CD_OK;
  std::string error;
};

// On a runtime thread, as the pass ends.
void on_forward_done(void* user_data, cd_status status, const char* error) {
  auto* request = static_cast<ForwardRequest*>(user_data);
  request->status = status;
  if (error != nullptr) request->error = error;
  request->handle->forward_done.NonBlockingCall(request);
}

// On the JS thread (env is null when the environment is being torn down).
void complete_forward(Napi::Env env, Napi::Function, ModelHandle* handle, ForwardRequest* request) {
  const std::unique_ptr<ForwardRequest> owned(request);
  if (env == nullptr) return;
  handle->forward_done.Unref(env);
  if (request->status != CD_OK) {
    reject(request->deferred, env, request->status, request->error.c_str());
    return;
  }
  request->deferred.Resolve(env.Undefined());
}

ModelHandle* handle_of(const Napi::Value& value) { return value.As<Napi::External<ModelHandle>>().Data(); }

// loadModel(spec, options) -> Promise<{ handle, kernel, kvBytesPerBlock }>
Napi::Value LoadModel(const Napi::CallbackInfo& info) {
  auto* worker = new LoadWorker(info.Env(), info[0].As<Napi::Object>(), info[1].As<Napi::Object>());
  worker->Queue();
  return worker->promise();
}

// forward(handle, batch, outputs) -> Promise<void>
Napi::Value Forward(const Napi::CallbackInfo& info) {
  ModelHandle* handle = handle_of(info[0]);
  auto* request = new ForwardRequest(info.Env(), handle, info[1].As<Napi::Object>(), info[2].As<Napi::Object>());
  const Napi::Promise promise = request->deferred.Promise();
  handle->forward_done.Ref(info.Env());
  cd_model_forward(handle->model, &request->batch, &request->output, on_forward_done, request);
  return promise;
}

// serveRank(handle) -> Promise<void>: a tensor-parallel rank > 0 runs rank 0's passes until it stops.
Napi::Value ServeRank(const Napi::CallbackInfo& info) {
  ModelHandle* handle = handle_of(info[0]);
  auto* request = new ForwardRequest(info.Env(), handle);
  const Napi::Promise promise = request->deferred.Promise();
  handle->forward_done.Ref(info.Env());
  cd_model_serve_rank(handle->model, on_forward_done, request);
  return promise;
}

// collectiveNs(handle) -> number: nanoseconds this rank has spent in collectives.
Napi::Value CollectiveNs(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), double(cd_model_collective_ns(handle_of(info[0])->model)));
}

// freeModel(handle): idempotent; the caller guarantees no forward is in flight.
Napi::Value FreeModel(const Napi::CallbackInfo& info) {
  ModelHandle* handle = handle_of(info[0]);
  cd_model_free(handle->model);
  handle->model = nullptr;
  return info.Env().Undefined();
}

// cudaDeviceCount() -> { count, reason }: count -1 with the reason when CUDA cannot run here.
Napi::Value CudaDeviceCount(const Napi::CallbackInfo& info) {
  char why[512] = {};
  const int32_t count = cd_cuda_device_count(why, sizeof why);
  Napi::Object result = Napi::Object::New(info.Env());
  result.Set("count", Napi::Number::New(info.Env(), count));
  result.Set("reason", Napi::String::New(info.Env(), why));
  return result;
}

// kernelSupported(name) -> boolean
Napi::Value KernelSupported(const Napi::CallbackInfo& info) {
  return Napi::Boolean::New(info.Env(), cd_kernel_supported(kernel_from(info[0])) != 0);
}

// The probes block the event loop for their few seconds: they exist for the benchmark tool only.
Napi::Value ThrowIfFailed(Napi::Env env, cd_status status, const char* message, Napi::Value result) {
  if (status == CD_OK) return result;
  Napi::Error error = Napi::Error::New(env, message);
  error.Set("code", Napi::String::New(env, status_code(status)));
  throw error;
}

// probeStreamRead(sizeBytes, numThreads, numRepeats) -> bytes per second
Napi::Value ProbeStreamRead(const Napi::CallbackInfo& info) {
  char error[kErrorCapacity] = {};
  double bytes_per_second = 0;
  const cd_status status = cd_probe_stream_read(size_t(info[0].As<Napi::Number>().Int64Value()),
                                                info[1].As<Napi::Number>().Int32Value(),
                                                info[2].As<Napi::Number>().Int32Value(),
                                                &bytes_per_second, error, kErrorCapacity);
  return ThrowIfFailed(info.Env(), status, error, Napi::Number::New(info.Env(), bytes_per_second));
}

// probePeak(kernel, numThreads) -> flops per second
Napi::Value ProbePeak(const Napi::CallbackInfo& info) {
  char error[kErrorCapacity] = {};
  double flops_per_second = 0;
  const cd_status status = cd_probe_peak(kernel_from(info[0]), info[1].As<Napi::Number>().Int32Value(),
                                         &flops_per_second, error, kErrorCapacity);
  return ThrowIfFailed(info.Env(), status, error, Napi::Number::New(info.Env(), flops_per_second));
}

// probeThreadHandoff(numThreads, numCalls) -> { wakeLatencyNs, callNs }
Napi::Value ProbeThreadHandoff(const Napi::CallbackInfo& info) {
  char error[kErrorCapacity] = {};
  double wake_latency_ns = 0;
  double call_ns = 0;
  const cd_status status = cd_probe_thread_handoff(info[0].As<Napi::Number>().Int32Value(),
                                                   info[1].As<Napi::Number>().Int32Value(), &wake_latency_ns,
                                                   &call_ns, error, kErrorCapacity);
  Napi::Object result = Napi::Object::New(info.Env());
  result.Set("wakeLatencyNs", Napi::Number::New(info.Env(), wake_latency_ns));
  result.Set("callNs", Napi::Number::New(info.Env(), call_ns));
  return ThrowIfFailed(info.Env(), status, error, result);
}

// probeMatmul({ kernel, dtype, quantization, numRows, k, n, numThreads, numRepeats }) -> seconds
Napi::Value ProbeMatmul(const Napi::CallbackInfo& info) {
  const Napi::Object options = info[0].As<Napi::Object>();
  const cd_matmul_probe probe{
      kernel_from(options.Get("kernel")),
      dtype_from(options.Get("dtype")),
      quantization_from(options.Get("quantization").As<Napi::String>().Utf8Value()),
      int_of(options, "numRows"),
      int_of(options, "k"),
      int_of(options, "n"),
      int_of(options, "numThreads"),
      int_of(options, "numRepeats")};
  char error[kErrorCapacity] = {};
  double seconds = 0;
  const cd_status status = cd_probe_matmul(&probe, &seconds, error, kErrorCapacity);
  return ThrowIfFailed(info.Env(), status, error, Napi::Number::New(info.Env(), seconds));
}

// chainBlockHashes(parentHash: Uint8Array(16), tokenIds: Int32Array, blockSizeTokens, numBlocks, hashes: Uint8Array)
// Lengths are checked in native/index.ts.
Napi::Value ChainBlockHashes(const Napi::CallbackInfo& info) {
  const Napi::Uint8Array parent = info[0].As<Napi::Uint8Array>();
  const Napi::Int32Array token_ids = info[1].As<Napi::Int32Array>();
  Napi::Uint8Array hashes = info[4].As<Napi::Uint8Array>();
  cd_chain_block_hashes(parent.Data(), token_ids.Data(), info[2].As<Napi::Number>().Int32Value(),
                        info[3].As<Napi::Number>().Int32Value(), hashes.Data());
  return info.Env().Undefined();
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("chainBlockHashes", Napi::Function::New(env, ChainBlockHashes));
  exports.Set("probeStreamRead", Napi::Function::New(env, ProbeStreamRead));
  exports.Set("probePeak", Napi::Function::New(env, ProbePeak));
  exports.Set("probeThreadHandoff", Napi::Function::New(env, ProbeThreadHandoff));
  exports.Set("probeMatmul", Napi::Function::New(env, ProbeMatmul));
  exports.Set("loadModel", Napi::Function::New(env, LoadModel));
  exports.Set("forward", Napi::Function::New(env, Forward));
  exports.Set("freeModel", Napi::Function::New(env, FreeModel));
  exports.Set("serveRank", Napi::Function::New(env, ServeRank));
  exports.Set("collectiveNs", Napi::Function::New(env, CollectiveNs));
  exports.Set("kernelSupported", Napi::Function::New(env, KernelSupported));
  exports.Set("cudaDeviceCount", Napi::Function::New(env, CudaDeviceCount));
  return exports;
}

}  // namespace

NODE_API_MODULE(conduit_native, Init)
