// What the N-API binding's marshallers share: JS values to the C API's enums and numbers, a
// cd_status to a JS error that carries its code, and each marshaller's entry points for
// registration (binding.cc).
#pragma once

#include <napi.h>

#include <cstdint>
#include <string>

#include "conduit.h"

namespace conduit::binding {

constexpr size_t kErrorCapacity = 1024;

const char* status_code(cd_status status);
cd_dtype dtype_from(const Napi::Value& value);
cd_kernel kernel_from(const Napi::Value& value);
cd_quantization quantization_from(const std::string& name);
int32_t int_of(const Napi::Object& object, const char* key);
int64_t int64_or_zero(const Napi::Object& object, const char* key);
double double_of(const Napi::Object& object, const char* key);
void reject(Napi::Promise::Deferred& deferred, Napi::Env env, cd_status status, const char* message);
// Throws status as a JS error unless it is CD_OK; returns result otherwise.
Napi::Value result_or_throw(Napi::Env env, cd_status status, const char* message, Napi::Value result);

// binding_load.cc
Napi::Value LoadModel(const Napi::CallbackInfo& info);
// binding_forward.cc
Napi::Value Forward(const Napi::CallbackInfo& info);
Napi::Value ForwardFieldKeys(const Napi::CallbackInfo& info);
Napi::Value ServeRank(const Napi::CallbackInfo& info);
Napi::Value CollectiveNs(const Napi::CallbackInfo& info);
Napi::Value MatrixFormats(const Napi::CallbackInfo& info);
Napi::Value SetActiveThreads(const Napi::CallbackInfo& info);
Napi::Value FreeModel(const Napi::CallbackInfo& info);
// The JS handle of a loaded model (binding_load.cc hands it out; binding_forward.cc owns its layout).
Napi::Value new_model_handle(Napi::Env env, cd_model* model);
// binding_probes.cc
Napi::Value ProbeStreamRead(const Napi::CallbackInfo& info);
Napi::Value ProbePeak(const Napi::CallbackInfo& info);
Napi::Value ProbeThreadHandoff(const Napi::CallbackInfo& info);
Napi::Value ProbeMatmul(const Napi::CallbackInfo& info);
Napi::Value KernelSupported(const Napi::CallbackInfo& info);
Napi::Value CudaDeviceCount(const Napi::CallbackInfo& info);
Napi::Value ChainBlockHashes(const Napi::CallbackInfo& info);

}  // namespace conduit::binding
