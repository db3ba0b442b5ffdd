// Finding and opening the CUDA plugin (cuda/plugin_abi.h) the first time something asks for it.
#pragma once

#include <string>

#include "cuda/plugin_abi.h"

namespace conduit {

// The plugin's table, or nullptr with the reason in why: the file missing (a build without nvcc),
// dlopen's or dlsym's error, or an ABI version that is not this runtime's. Opened once per
// process (never closed). The file is libconduit_cuda.so in CONDUIT_DEVICE_PLUGIN_DIR when set
// (the device interface's variable, src/device.cc), else in the folder of the binary that holds
// this runtime (the addon, or an executable linked with conduit_runtime).
const cdc_plugin* cuda_plugin(std::string& why);

}  // namespace conduit
