#include <napi.h>

static Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("cpuHasAvx512", Napi::Boolean::New(env, __builtin_cpu_supports("avx512f")));
  return exports;
}

NODE_API_MODULE(conduit_native, Init)
