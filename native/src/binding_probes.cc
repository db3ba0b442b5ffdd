// The N-API side of the runtime's measurements and helpers outside a model: the probes (which
// block the event loop for their few seconds; they exist for the benchmark tool only), kernel and
// device queries, and block hashing.
#include "binding_common.h"
#include "block_hash.h"

namespace conduit::binding {

// probeStreamRead(sizeBytes, numThreads, numRepeats) -> bytes per second
Napi::Value ProbeStreamRead(const Napi::CallbackInfo& info) {
  char error[kErrorCapacity] = {};
  double bytes_per_second = 0;
  const cd_status status = cd_probe_stream_read(size_t(info[0].As<Napi::Number>().Int64Value()),
                                                info[1].As<Napi::Number>().Int32Value(),
                                                info[2].As<Napi::Number>().Int32Value(),
                                                &bytes_per_second, error, kErrorCapacity);
  return result_or_throw(info.Env(), status, error, Napi::Number::New(info.Env(), bytes_per_second));
}

// probePeak(kernel, numThreads) -> flops per second
Napi::Value ProbePeak(const Napi::CallbackInfo& info) {
  char error[kErrorCapacity] = {};
  double flops_per_second = 0;
  const cd_status status = cd_probe_peak(kernel_from(info[0]), info[1].As<Napi::Number>().Int32Value(),
                                         &flops_per_second, error, kErrorCapacity);
  return result_or_throw(info.Env(), status, error, Napi::Number::New(info.Env(), flops_per_second));
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
  return result_or_throw(info.Env(), status, error, result);
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
  return result_or_throw(info.Env(), status, error, Napi::Number::New(info.Env(), seconds));
}

// kernelSupported(name) -> boolean
Napi::Value KernelSupported(const Napi::CallbackInfo& info) {
  return Napi::Boolean::New(info.Env(), cd_kernel_supported(kernel_from(info[0])) != 0);
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

}  // namespace conduit::binding
