#include "cuda/nccl.h"

#include <dlfcn.h>

#include <memory>

namespace conduit {
namespace cuda {

namespace {

template <typename Fn>
bool bind(void* handle, const char* symbol, Fn& out, std::string& why) {
  out = reinterpret_cast<Fn>(dlsym(handle, symbol));
  if (out == nullptr) why = std::string("it has no ") + symbol;
  return out != nullptr;
}

}  // namespace

const NcclLibrary* open_nccl(const char* file_name, std::string& why) {
  void* handle = dlopen(file_name, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* message = dlerror();
    why = std::string("NCCL is not available: dlopen ") + file_name + ": " + (message != nullptr ? message : "failed");
    return nullptr;
  }
  auto nccl = std::make_unique<NcclLibrary>();
  nccl->handle = handle;
  std::string missing;
  const bool complete = bind(handle, "ncclGetVersion", nccl->get_version, missing) &&
                        bind(handle, "ncclCommInitAll", nccl->comm_init_all, missing) &&
                        bind(handle, "ncclAllGather", nccl->all_gather, missing) &&
                        bind(handle, "ncclGroupStart", nccl->group_start, missing) &&
                        bind(handle, "ncclGroupEnd", nccl->group_end, missing) &&
                        bind(handle, "ncclCommDestroy", nccl->comm_destroy, missing) &&
                        bind(handle, "ncclGetErrorString", nccl->error_string, missing);
  if (!complete) {
    dlclose(handle);
    why = std::string("NCCL is not available: ") + file_name + " opened, but " + missing;
    return nullptr;
  }
  int version = 0;
  if (nccl->get_version(&version) != kNcclSuccess) version = 0;
  nccl->version = version;
  return nccl.release();
}

std::string nccl_failure(const NcclLibrary& nccl, const char* call, NcclResult result) {
  return std::string("NCCL ") + call + " failed: " + nccl.error_string(result) + " (ncclResult_t " + std::to_string(result) +
         ")";
}

}  // namespace cuda
}  // namespace conduit
