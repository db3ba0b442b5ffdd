// The backend registry: the CPU's is built in; any other comes from a plugin opened on first use,
// from CONDUIT_DEVICE_PLUGIN_DIR or the dynamic loader's search path.
#include "device.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "error.h"

namespace conduit {

namespace {

std::mutex registry_mutex;
std::vector<const DeviceBackend*>& registry() {
  static std::vector<const DeviceBackend*> backends{&cpu_backend()};
  return backends;
}

const char* device_name(cd_device device) { return device == CD_DEVICE_CUDA ? "cuda" : "cpu"; }

// Opens libconduit_<name>.so and registers what it exports; throws saying why not.
void open_plugin(cd_device device) {
  const std::string file = std::string("libconduit_") + device_name(device) + ".so";
  const char* dir = std::getenv("CONDUIT_DEVICE_PLUGIN_DIR");
  const std::string path = dir != nullptr && *dir != '\0' ? std::string(dir) + "/" + file : file;
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* reason = dlerror();
    throw Error(CD_ERR_UNSUPPORTED_DEVICE, std::string("device '") + device_name(device) + "' is not available: " +
                                               (reason != nullptr ? reason : ("cannot open " + path)));
  }
  const auto entry = reinterpret_cast<conduit_device_backend_fn>(dlsym(handle, "conduit_device_backend"));
  if (entry == nullptr) {
    throw Error(CD_ERR_UNSUPPORTED_DEVICE, path + " does not export conduit_device_backend");
  }
  char why[512] = {};
  const DeviceBackend* backend = entry(why, sizeof why);
  if (backend == nullptr || backend->available(why, sizeof why) == 0) {
    throw Error(CD_ERR_UNSUPPORTED_DEVICE, std::string("device '") + device_name(device) + "' is not available: " + why);
  }
  registry().push_back(backend);
}

}  // namespace

void register_device_backend(const DeviceBackend& backend) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry().push_back(&backend);
}

const DeviceBackend& device_backend(cd_device device) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  for (const DeviceBackend* backend : registry()) {
    if (backend->device == device) return *backend;
  }
  open_plugin(device);
  return *registry().back();
}

}  // namespace conduit
