// The N-API side of a forward pass: a ForwardBatch (native/api.ts) becomes a cd_batch on the JS
// thread, the pass runs on the runtime's own threads, and its end comes back to the JS thread
// through a thread-safe function that settles the promise.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "batch_fields.h"
#include "binding_common.h"

namespace conduit::binding {
namespace {

struct ModelHandle;
struct ForwardRequest;
void complete_forward(Napi::Env env, Napi::Function, ModelHandle* handle, ForwardRequest* request);
using ForwardDone = Napi::TypedThreadSafeFunction<ModelHandle, ForwardRequest, complete_forward>;

// The batch's arrays as the runtime reads them, refilled every pass: they keep their capacity, so
// a step allocates nothing once the largest batch has been seen.
struct BatchBuffers {
#define CONDUIT_BUFFER(field, key, type) std::vector<type> field;
  CD_BATCH_ARRAYS(CONDUIT_BUFFER)
  CD_BATCH_OPTIONAL_ARRAYS(CONDUIT_BUFFER)
#undef CONDUIT_BUFFER
};

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
  // One call at a time (native/index.ts queues none): the buffers belong to the call in flight.
  bool call_in_flight = false;
  BatchBuffers buffers;
  // The Int32Array the pool reads its active thread count from: held until the model is freed.
  Napi::ObjectReference active_threads_cell;
};

void let_go(ModelHandle* handle) {
  if (--handle->num_holders == 0) delete handle;
}

template <typename T>
const T* assign_from(std::vector<T>& buffer, const Napi::Value& value) {
  const Napi::TypedArrayOf<T> array = value.As<Napi::TypedArrayOf<T>>();
  buffer.assign(array.Data(), array.Data() + array.ElementLength());
  return buffer.data();
}

bool absent(const Napi::Value& value) { return value.IsUndefined() || value.IsNull(); }

// An output typed array's storage; null when it is empty or absent (an output nothing asked for).
template <typename T>
T* data_of(const Napi::Value& value) {
  if (!value.IsTypedArray()) return nullptr;
  Napi::TypedArrayOf<T> array = value.As<Napi::TypedArrayOf<T>>();
  return array.ElementLength() == 0 ? nullptr : array.Data();
}

// The batch's fields, then the outputs, come as the call's arguments after the handle, the batch
// and the outputs objects, in forwardFieldKeys() order: reading some forty properties by name would
// make and internalize a string for each, every step, on a cache the pass has just flushed.
constexpr size_t kFirstFieldArgument = 3;
#define CONDUIT_COUNT(...) +1
constexpr size_t kNumFieldArguments = 0 CD_BATCH_SCALARS(CONDUIT_COUNT) CD_BATCH_ARRAYS(CONDUIT_COUNT)
    CD_BATCH_OPTIONAL_ARRAYS(CONDUIT_COUNT) CD_FORWARD_OUTPUTS(CONDUIT_COUNT);
#undef CONDUIT_COUNT

// One call from its start to its settled promise. Outputs are written straight into the caller's
// typed arrays, which stay referenced until the promise settles.
struct ForwardRequest {
  ForwardRequest(const Napi::CallbackInfo& info, ModelHandle* model_handle)
      : handle(model_handle), deferred(Napi::Promise::Deferred::New(info.Env())) {
    BatchBuffers& buffers = handle->buffers;
    size_t argument = kFirstFieldArgument;
#define CONDUIT_SCALAR(field, key) batch.field = info[argument++].As<Napi::Number>().Int32Value();
    CD_BATCH_SCALARS(CONDUIT_SCALAR)
#undef CONDUIT_SCALAR
#define CONDUIT_ARRAY(field, key, type) batch.field = assign_from(buffers.field, info[argument++]);
    CD_BATCH_ARRAYS(CONDUIT_ARRAY)
#undef CONDUIT_ARRAY
#define CONDUIT_OPTIONAL(field, key, type) \
  if (const Napi::Value value = info[argument++]; !absent(value)) batch.field = assign_from(buffers.field, value);
    CD_BATCH_OPTIONAL_ARRAYS(CONDUIT_OPTIONAL)
#undef CONDUIT_OPTIONAL
#define CONDUIT_OUTPUT(field, key, type) output.field = data_of<type>(info[argument++]);
    CD_FORWARD_OUTPUTS(CONDUIT_OUTPUT)
#undef CONDUIT_OUTPUT
    const Napi::Object batch_object = info[1].As<Napi::Object>();
    outputs = Napi::Persistent(info[2].As<Napi::Object>());
    if (batch.bitmask_rows != nullptr) point_batch_at_bitmasks(batch_object);
  }

  // A tensor-parallel rank's serving loop: settles like a pass, with no batch of its own.
  ForwardRequest(Napi::Env env, ModelHandle* model_handle)
      : handle(model_handle), deferred(Napi::Promise::Deferred::New(env)) {}

  // The bitmask and its counter are read in place, not copied: other threads may still be
  // writing them while the pass runs. They stay referenced until the promise settles.
  void point_batch_at_bitmasks(const Napi::Object& batch_object) {
    Napi::TypedArrayOf<int32_t> bitmask = batch_object.Get("tokenBitmask").As<Napi::TypedArrayOf<int32_t>>();
    bitmask_reference = Napi::Persistent(bitmask);
    batch.token_bitmask = reinterpret_cast<const uint32_t*>(bitmask.Data());
    batch.bitmask_words = int_of(batch_object, "bitmaskWords");
    const Napi::Value ready = batch_object.Get("bitmaskReady");
    if (absent(ready)) return;
    Napi::TypedArrayOf<int32_t> ready_array = ready.As<Napi::TypedArrayOf<int32_t>>();
    ready_reference = Napi::Persistent(ready_array);
    batch.bitmask_ready = ready_array.Data();
    batch.bitmask_ready_target = int_of(batch_object, "bitmaskReadyTarget");
  }

  ModelHandle* handle;
  Napi::Promise::Deferred deferred;
  Napi::ObjectReference outputs;
  Napi::Reference<Napi::TypedArrayOf<int32_t>> bitmask_reference, ready_reference;
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
  handle->call_in_flight = false;
  if (env == nullptr) return;
  handle->forward_done.Unref(env);
  if (request->status != CD_OK) {
    reject(request->deferred, env, request->status, request->error.c_str());
    return;
  }
  request->deferred.Resolve(env.Undefined());
}

ModelHandle* handle_of(const Napi::Value& value) { return value.As<Napi::External<ModelHandle>>().Data(); }

// The handle of a call about to start; throws while another call holds it.
ModelHandle* claim(const Napi::CallbackInfo& info) {
  ModelHandle* handle = handle_of(info[0]);
  if (handle->call_in_flight) {
    throw Napi::Error::New(info.Env(), "a native call is already in flight on this model; one at a time");
  }
  handle->call_in_flight = true;
  return handle;
}

}  // namespace

Napi::Value new_model_handle(Napi::Env env, cd_model* model) {
  auto* handle = new ModelHandle{};
  handle->model = model;
  handle->forward_done = ForwardDone::New(env, "conduit forward", 0, 1, handle, [](Napi::Env, void*, ModelHandle* h) {
    h->forward_done_open = false;
    let_go(h);
  });
  handle->forward_done.Unref(env);
  return Napi::External<ModelHandle>::New(env, handle, [](Napi::Env, ModelHandle* h) {
    cd_model_free(h->model);
    h->model = nullptr;
    if (h->forward_done_open) h->forward_done.Release();
    let_go(h);
  });
}

// forwardFieldKeys() -> [batch keys, output keys]: the order forward() takes their values in.
Napi::Value ForwardFieldKeys(const Napi::CallbackInfo& info) {
  const Napi::Env env = info.Env();
  Napi::Array batch_keys = Napi::Array::New(env);
  Napi::Array output_keys = Napi::Array::New(env);
#define CONDUIT_KEY(field, key, ...) batch_keys.Set(batch_keys.Length(), key);
  CD_BATCH_SCALARS(CONDUIT_KEY)
  CD_BATCH_ARRAYS(CONDUIT_KEY)
  CD_BATCH_OPTIONAL_ARRAYS(CONDUIT_KEY)
#undef CONDUIT_KEY
#define CONDUIT_KEY(field, key, ...) output_keys.Set(output_keys.Length(), key);
  CD_FORWARD_OUTPUTS(CONDUIT_KEY)
#undef CONDUIT_KEY
  Napi::Array keys = Napi::Array::New(env, 2);
  keys.Set(uint32_t(0), batch_keys);
  keys.Set(uint32_t(1), output_keys);
  return keys;
}

// forward(handle, batch, outputs, ...batch values, ...output values) -> Promise<void>
Napi::Value Forward(const Napi::CallbackInfo& info) {
  if (info.Length() != kFirstFieldArgument + kNumFieldArguments) {
    throw Napi::TypeError::New(info.Env(), "forward() takes the handle, the batch, the outputs and " +
                                               std::to_string(kNumFieldArguments) + " field values");
  }
  ModelHandle* handle = claim(info);
  std::unique_ptr<ForwardRequest> request;
  try {
    request = std::make_unique<ForwardRequest>(info, handle);
  } catch (...) {
    handle->call_in_flight = false;
    throw;
  }
  const Napi::Promise promise = request->deferred.Promise();
  handle->forward_done.Ref(info.Env());
  ForwardRequest* started = request.release();
  cd_model_forward(handle->model, &started->batch, &started->output, on_forward_done, started);
  return promise;
}

// serveRank(handle) -> Promise<void>: a tensor-parallel rank > 0 runs rank 0's passes until it stops.
Napi::Value ServeRank(const Napi::CallbackInfo& info) {
  ModelHandle* handle = claim(info);
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

// matrixFormats(handle) -> "name format\n" lines (cd_model_matrix_formats); "" once freed.
Napi::Value MatrixFormats(const Napi::CallbackInfo& info) {
  const cd_model* model = handle_of(info[0])->model;
  if (model == nullptr) return Napi::String::New(info.Env(), "");
  std::string text(cd_model_matrix_formats(model, nullptr, 0), '\0');
  cd_model_matrix_formats(model, text.data(), text.size() + 1);
  return Napi::String::New(info.Env(), text);
}

// setActiveThreads(handle, cell): the pool reads its active thread count from cell[0] (an
// Int32Array, over a SharedArrayBuffer where other threads store to it) from now on.
Napi::Value SetActiveThreads(const Napi::CallbackInfo& info) {
  ModelHandle* handle = handle_of(info[0]);
  if (handle->model == nullptr) return info.Env().Undefined();
  Napi::TypedArrayOf<int32_t> cell = info[1].As<Napi::TypedArrayOf<int32_t>>();
  if (cell.ElementLength() < 1) throw Napi::RangeError::New(info.Env(), "the active threads cell needs one element");
  cd_model_set_active_threads(handle->model, cell.Data());
  handle->active_threads_cell = Napi::Persistent(cell.As<Napi::Object>());
  return info.Env().Undefined();
}

// freeModel(handle): idempotent; the caller guarantees no forward is in flight.
Napi::Value FreeModel(const Napi::CallbackInfo& info) {
  ModelHandle* handle = handle_of(info[0]);
  cd_model_free(handle->model);
  handle->model = nullptr;
  handle->active_threads_cell.Reset();
  return info.Env().Undefined();
}

}  // namespace conduit::binding
