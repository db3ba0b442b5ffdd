#include "amx.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace conduit {

namespace {

#if defined(__x86_64__) && defined(__linux__)
// From Linux's arch/x86/include/uapi/asm/prctl.h and the XSAVE feature numbers.
constexpr int kArchGetXcompPerm = 0x1022;
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtilecfg = 17;
constexpr int kXfeatureXtiledata = 18;

uint64_t read_xcr0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (uint64_t(edx) << 32) | eax;
}

AmxSupport detect() {
  AmxSupport support{};
  unsigned eax, ebx, ecx, edx;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
    const bool bf16 = (edx >> 22) & 1, tile = (edx >> 24) & 1, int8 = (edx >> 25) & 1;
    support.cpu_has_amx = tile && bf16;
    support.cpu_has_amx_int8 = tile && int8;
  }
  if (!support.cpu_has_amx) {
    std::snprintf(support.reason, sizeof support.reason, "CPU has no AMX (CPUID reports no AMX-TILE and AMX-BF16)");
    return support;
  }
  const bool osxsave = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && ((ecx >> 27) & 1);
  const uint64_t tile_bits = (uint64_t(1) << kXfeatureXtilecfg) | (uint64_t(1) << kXfeatureXtiledata);
  if (!osxsave || (read_xcr0() & tile_bits) != tile_bits) {
    std::snprintf(support.reason, sizeof support.reason, "the OS does not enable the AMX tile state (XCR0 bits 17-18)");
    return support;
  }
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
    std::snprintf(support.reason, sizeof support.reason,
                  "the kernel refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM: %s)", std::strerror(errno));
    return support;
  }
  uint64_t permitted = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &permitted) != 0 || !((permitted >> kXfeatureXtiledata) & 1)) {
    std::snprintf(support.reason, sizeof support.reason, "the kernel did not grant the AMX tile data (ARCH_GET_XCOMP_PERM)");
    return support;
  }
  support.usable = true;
  return support;
}
#else
AmxSupport detect() {
  AmxSupport support{};
  std::snprintf(support.reason, sizeof support.reason, "AMX needs x86-64 Linux");
  return support;
}
#endif

}  // namespace

const AmxSupport& amx_support() {
  static const AmxSupport support = detect();
  return support;
}

}  // namespace conduit
