// N-API registration and marshalling only: JS values become plain C structs on the main thread,
// the C API runs in AsyncWorker::Execute (which only waits while the runtime's own threads
// compute), and statuses become rejected promises.
#include <napi.h>

#include <cstring>
#include <string>
#include <vector>

#include "conduit.h"

namespace {

constexpr size_t kErrorCapacity = 1024;

// Owns the native model behind the JS handle; close() frees it early, the finalizer otherwise.
struct ModelHandle {
  cd_model* model = nullptr;
};

const char* status_code(cd_status status) {
  switch (status) {
    case CD_ERR_INVALID_ARGUMENT: return "CD_ERR_INVALID_ARGUMENT";
    case CD_ERR_UNSUPPORTED_KERNEL: return "CD_ERR_UNSUPPORTED_KERNEL";
    case CD_ERR_IO: return "CD_ERR_IO";
    case CD_ERR_OUT_OF_MEMORY: return "CD_ERR_OUT_OF_MEMORY";
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
  for (cd_kernel kernel : {CD_KERNEL_AVX512, CD_KERNEL_AVX2, CD_KERNEL_SCALAR}) {
    if (name == cd_kernel_name(kernel)) return kernel;
  }
  return CD_KERNEL_AUTO;
}

int32_t int_of(const Napi::Object& object, const char* key) {
  return object.Get(key).As<Napi::Number>().Int32Value();
}

cd_tensor_ref tensor_ref_from(const Napi::Value& value) {
  const Napi::Object object = value.As<Napi::Object>();
  return cd_tensor_ref{int_of(object, "fileIndex"),
                       uint64_t(object.Get("offsetBytes").As<Napi::Number>().Int64Value()),
                       uint64_t(object.Get("sizeBytes").As<Napi::Number>().Int64Value()),
                       dtype_from(object.Get("dtype"))};
}

cd_tensor_ref optional_tensor_ref_from(const Napi::Value& value) {
  if (value.IsUndefined() || value.IsNull()) return cd_tensor_ref{0, 0, 0, CD_DTYPE_F32};
  return tensor_ref_from(value);
}

template <typename T>
std::vector<T> copy_of(const Napi::Value& value) {
  const Napi::TypedArrayOf<T> array = value.As<Napi::TypedArrayOf<T>>();
  return std::vector<T>(array.Data(), array.Data() + array.ElementLength());
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
    rope_inv_freq_ = copy_of<double>(spec.Get("ropeInvFreq"));
    const Napi::Array layers = spec.Get("layers").As<Napi::Array>();
    for (uint32_t i = 0; i < layers.Length(); ++i) {
      const Napi::Object layer = layers.Get(i).As<Napi::Object>();
      layers_.push_back(cd_layer_spec{
          tensor_ref_from(layer.Get("inputNorm")), tensor_ref_from(layer.Get("qProj")),
          tensor_ref_from(layer.Get("kProj")), tensor_ref_from(layer.Get("vProj")),
          optional_tensor_ref_from(layer.Get("qBias")), optional_tensor_ref_from(layer.Get("kBias")),
          optional_tensor_ref_from(layer.Get("vBias")), tensor_ref_from(layer.Get("oProj")),
          tensor_ref_from(layer.Get("postAttentionNorm")), tensor_ref_from(layer.Get("gateProj")),
          tensor_ref_from(layer.Get("upProj")), tensor_ref_from(layer.Get("downProj"))});
    }
    spec_ = cd_model_spec{file_path_pointers_.data(),
                          int32_t(file_path_pointers_.size()),
                          int_of(spec, "numLayers"),
                          int_of(spec, "hiddenSize"),
                          int_of(spec, "intermediateSize"),
                          int_of(spec, "numHeads"),
                          int_of(spec, "numKvHeads"),
                          int_of(spec, "headDim"),
                          int_of(spec, "vocabSize"),
                          spec.Get("rmsNormEps").As<Napi::Number>().DoubleValue(),
                          int_of(spec, "slidingWindowTokens"),
                          rope_inv_freq_.data(),
                          tensor_ref_from(spec.Get("embedTokens")),
                          tensor_ref_from(spec.Get("finalNorm")),
                          tensor_ref_from(spec.Get("lmHead")),
                          layers_.data()};
    options_ = cd_load_options{dtype_from(options.Get("weightDtype")),
                               options.Get("quantization").As<Napi::String>().Utf8Value() == "int8"
                                   ? CD_QUANTIZATION_INT8
                                   : CD_QUANTIZATION_NONE,
                               dtype_from(options.Get("kvCacheDtype")),
                               int_of(options, "numKvBlocks"),
                               int_of(options, "blockSizeTokens"),
                               int_of(options, "numThreads"),
                               kernel_from(options.Get("kernel"))};
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
    auto* handle = new ModelHandle{model_};
    cd_model_info info;
    cd_model_get_info(model_, &info);
    Napi::Object result = Napi::Object::New(env);
    result.Set("handle", Napi::External<ModelHandle>::New(env, handle, [](Napi::Env, ModelHandle* h) {
                 cd_model_free(h->model);
                 delete h;
               }));
    result.Set("kernel", Napi::String::New(env, cd_kernel_name(info.kernel)));
    result.Set("kvBytesPerBlock", Napi::Number::New(env, double(info.kv_bytes_per_block)));
    deferred_.Resolve(result);
  }

 private:
  Napi::Promise::Deferred deferred_;
  std::vector<std::string> file_paths_;
  std::vector<const char*> file_path_pointers_;
  std::vector<double> rope_inv_freq_;
  std::vector<cd_layer_spec> layers_;
  cd_model_spec spec_{};
  cd_load_options options_{};
  cd_model* model_ = nullptr;
  cd_status status_ = CD_OK;
  char error_[kErrorCapacity] = {};
};

// Inputs are copied so the caller may reuse its arrays at once; outputs are written straight into
// the caller's typed arrays, which stay referenced until the promise settles.
class ForwardWorker : public Napi::AsyncWorker {
 public:
  ForwardWorker(Napi::Env env, ModelHandle* handle, const Napi::Object& batch, const Napi::Object& outputs)
      : Napi::AsyncWorker(env), deferred_(Napi::Promise::Deferred::New(env)), handle_(handle) {
    token_ids_ = copy_of<int32_t>(batch.Get("tokenIds"));
    positions_ = copy_of<int32_t>(batch.Get("positions"));
    query_starts_ = copy_of<int32_t>(batch.Get("queryStarts"));
    block_tables_ = copy_of<int32_t>(batch.Get("blockTables"));
    seq_flags_ = copy_of<uint8_t>(batch.Get("seqFlags"));
    temperatures_ = copy_of<float>(batch.Get("temperatures"));
    top_ps_ = copy_of<float>(batch.Get("topPs"));
    top_ks_ = copy_of<int32_t>(batch.Get("topKs"));
    seeds_ = copy_of<uint64_t>(batch.Get("seeds"));
    output_indices_ = copy_of<int32_t>(batch.Get("outputIndices"));
    batch_ = cd_batch{int_of(batch, "numSeqs"), int_of(batch, "numTokens"), token_ids_.data(),
                      positions_.data(), query_starts_.data(), int_of(batch, "maxBlocksPerSeq"),
                      block_tables_.data(), seq_flags_.data(), temperatures_.data(), top_ps_.data(),
                      top_ks_.data(), seeds_.data(), output_indices_.data()};
    Napi::Int32Array sampled_ids = outputs.Get("sampledTokenIds").As<Napi::Int32Array>();
    Napi::Float32Array sampled_logprobs = outputs.Get("sampledLogprobs").As<Napi::Float32Array>();
    Napi::Float32Array logits = outputs.Get("logits").As<Napi::Float32Array>();
    output_ = cd_forward_output{sampled_ids.Data(), sampled_logprobs.Data(), logits.Data()};
    outputs_ = Napi::Persistent(outputs);
  }

  Napi::Promise promise() const { return deferred_.Promise(); }

  void Execute() override {
    status_ = cd_model_forward(handle_->model, &batch_, &output_, error_, kErrorCapacity);
  }

  void OnOK() override {
    if (status_ != CD_OK) {
      reject(deferred_, Env(), status_, error_);
      return;
    }
    deferred_.Resolve(Env().Undefined());
  }

 private:
  Napi::Promise::Deferred deferred_;
  ModelHandle* handle_;
  Napi::ObjectReference outputs_;
  std::vector<int32_t> token_ids_, positions_, query_starts_, block_tables_, top_ks_, output_indices_;
  std::vector<uint8_t> seq_flags_;
  std::vector<float> temperatures_, top_ps_;
  std::vector<uint64_t> seeds_;
  cd_batch batch_{};
  cd_forward_output output_{};
  cd_status status_ = CD_OK;
  char error_[kErrorCapacity] = {};
};

ModelHandle* handle_of(const Napi::Value& value) { return value.As<Napi::External<ModelHandle>>().Data(); }

// loadModel(spec, options) -> Promise<{ handle, kernel, kvBytesPerBlock }>
Napi::Value LoadModel(const Napi::CallbackInfo& info) {
  auto* worker = new LoadWorker(info.Env(), info[0].As<Napi::Object>(), info[1].As<Napi::Object>());
  worker->Queue();
  return worker->promise();
}

// forward(handle, batch, outputs) -> Promise<void>
Napi::Value Forward(const Napi::CallbackInfo& info) {
  auto* worker = new ForwardWorker(info.Env(), handle_of(info[0]), info[1].As<Napi::Object>(),
                                   info[2].As<Napi::Object>());
  worker->Queue();
  return worker->promise();
}

// freeModel(handle): idempotent; the caller guarantees no forward is in flight.
Napi::Value FreeModel(const Napi::CallbackInfo& info) {
  ModelHandle* handle = handle_of(info[0]);
  cd_model_free(handle->model);
  handle->model = nullptr;
  return info.Env().Undefined();
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
      options.Get("quantization").As<Napi::String>().Utf8Value() == "int8" ? CD_QUANTIZATION_INT8
                                                                          : CD_QUANTIZATION_NONE,
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

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("probeStreamRead", Napi::Function::New(env, ProbeStreamRead));
  exports.Set("probePeak", Napi::Function::New(env, ProbePeak));
  exports.Set("probeThreadHandoff", Napi::Function::New(env, ProbeThreadHandoff));
  exports.Set("probeMatmul", Napi::Function::New(env, ProbeMatmul));
  exports.Set("loadModel", Napi::Function::New(env, LoadModel));
  exports.Set("forward", Napi::Function::New(env, Forward));
  exports.Set("freeModel", Napi::Function::New(env, FreeModel));
  exports.Set("kernelSupported", Napi::Function::New(env, KernelSupported));
  return exports;
}

}  // namespace

NODE_API_MODULE(conduit_native, Init)
