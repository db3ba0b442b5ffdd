#include "binding_common.h"

namespace conduit::binding {

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

cd_quantization quantization_from(const std::string& name) {
  if (name == "int8") return CD_QUANTIZATION_INT8;
  if (name == "int4") return CD_QUANTIZATION_INT4;
  return CD_QUANTIZATION_NONE;
}

int32_t int_of(const Napi::Object& object, const char* key) {
  return object.Get(key).As<Napi::Number>().Int32Value();
}

int64_t int64_or_zero(const Napi::Object& object, const char* key) {
  const Napi::Value value = object.Get(key);
  return value.IsNumber() ? value.As<Napi::Number>().Int64Value() : 0;
}

double double_of(const Napi::Object& object, const char* key) { return object.Get(key).As<Napi::Number>().DoubleValue(); }

void reject(Napi::Promise::Deferred& deferred, Napi::Env env, cd_status status, const char* message) {
  Napi::Error error = Napi::Error::New(env, message);
  error.Set("code", Napi::String::New(env, status_code(status)));
  deferred.Reject(error.Value());
}

Napi::Value result_or_throw(Napi::Env env, cd_status status, const char* message, Napi::Value result) {
  if (status == CD_OK) return result;
  Napi::Error error = Napi::Error::New(env, message);
  error.Set("code", Napi::String::New(env, status_code(status)));
  throw error;
}

}  // namespace conduit::binding
