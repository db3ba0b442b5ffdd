// Whether this process may run the amx kernel path: the CPU reports AMX-TILE and AMX-BF16, the OS
// enables the tile state in XCR0, and Linux grants this process the tile data
// (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), asked once per process; the grant covers
// every thread). Each thread that computes still loads the tile configuration itself
// (kernels_amx.cc).
#pragma once

#include <cstdint>

namespace conduit {

struct AmxSupport {
  bool cpu_has_amx;  // CPUID: AMX-TILE and AMX-BF16 (AMX-INT8 is reported, not required)
  bool cpu_has_amx_int8;
  bool usable;       // and the OS granted the tile state
  // Why not, when !usable ("CPU has no AMX", or the OS's refusal and its errno).
  char reason[160];
};

// Detected and requested on the first call, remembered after.
const AmxSupport& amx_support();

}  // namespace conduit
