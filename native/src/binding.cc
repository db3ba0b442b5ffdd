// N-API registration only: the JS names of the binding's entry points. Each family's
// marshalling lives beside it: binding_load.cc (loading), binding_forward.cc (a forward pass and
// a tensor-parallel rank's loop), binding_probes.cc (measurements, queries, block hashing).
#include "binding_common.h"

namespace {

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  using namespace conduit::binding;
  exports.Set("chainBlockHashes", Napi::Function::New(env, ChainBlockHashes));
  exports.Set("probeStreamRead", Napi::Function::New(env, ProbeStreamRead));
  exports.Set("probePeak", Napi::Function::New(env, ProbePeak));
  exports.Set("probeThreadHandoff", Napi::Function::New(env, ProbeThreadHandoff));
  exports.Set("probeMatmul", Napi::Function::New(env, ProbeMatmul));
  exports.Set("loadModel", Napi::Function::New(env, LoadModel));
  exports.Set("forward", Napi::Function::New(env, Forward));
  exports.Set("forwardFieldKeys", Napi::Function::New(env, ForwardFieldKeys));
  exports.Set("freeModel", Napi::Function::New(env, FreeModel));
  exports.Set("serveRank", Napi::Function::New(env, ServeRank));
  exports.Set("collectiveNs", Napi::Function::New(env, CollectiveNs));
  exports.Set("matrixFormats", Napi::Function::New(env, MatrixFormats));
  exports.Set("setActiveThreads", Napi::Function::New(env, SetActiveThreads));
  exports.Set("kernelSupported", Napi::Function::New(env, KernelSupported));
  exports.Set("cudaDeviceCount", Napi::Function::New(env, CudaDeviceCount));
  return exports;
}

}  // namespace

NODE_API_MODULE(conduit_native, Init)
