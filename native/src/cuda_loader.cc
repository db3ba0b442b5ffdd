#include "cuda_loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

namespace conduit {

namespace {

std::string plugin_path() {
  if (const char* dir = std::getenv("CONDUIT_DEVICE_PLUGIN_DIR"); dir != nullptr && *dir != '\0') {
    return std::string(dir) + "/" CONDUIT_CUDA_PLUGIN_FILE;
  }
  Dl_info info{};
  // The folder of whichever binary this function was linked into.
  if (dladdr(reinterpret_cast<const void*>(&plugin_path), &info) == 0 || info.dli_fname == nullptr) {
    return CONDUIT_CUDA_PLUGIN_FILE;
  }
  std::string binary = info.dli_fname;
  const size_t slash = binary.rfind('/');
  return slash == std::string::npos ? std::string(CONDUIT_CUDA_PLUGIN_FILE)
                                    : binary.substr(0, slash + 1) + CONDUIT_CUDA_PLUGIN_FILE;
}

struct Opened {
  const cdc_plugin* plugin = nullptr;
  std::string why;
};

Opened open_plugin() {
  const std::string path = plugin_path();
  // RTLD_LOCAL: the plugin's statically linked cudart stays its own.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    return {nullptr, std::string(error != nullptr ? error : "cannot open " + path) +
                         " (the CUDA plugin is built only where nvcc is found at build time)"};
  }
  auto entry = reinterpret_cast<cdc_plugin_entry>(dlsym(handle, CONDUIT_CUDA_PLUGIN_SYMBOL));
  if (entry == nullptr) return {nullptr, path + " has no " CONDUIT_CUDA_PLUGIN_SYMBOL " symbol"};
  const cdc_plugin* plugin = entry();
  if (plugin == nullptr || plugin->abi_version != CONDUIT_CUDA_PLUGIN_ABI_VERSION) {
    return {nullptr, path + " was built for another version of the runtime; rebuild it (npm run build:native)"};
  }
  // Never closed: its CUDA context and statics live as long as the process.
  return {plugin, {}};
}

}  // namespace

const cdc_plugin* cuda_plugin(std::string& why) {
  static std::mutex mutex;
  static const cdc_plugin* plugin = nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  // A failure is not remembered: the plugin may be built or pointed at later in the process.
  if (plugin == nullptr) {
    Opened opened = open_plugin();
    plugin = opened.plugin;
    why = opened.why;
  }
  return plugin;
}

}  // namespace conduit
