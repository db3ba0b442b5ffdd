// NCCL, opened at run time: the toolkit on our machines ships no NCCL, so nothing links against
// it and no NCCL header is needed. The few entry points the GPU group uses are declared here from
// NCCL's documented C API (nccl.h: ncclResult_t, ncclDataType_t, ncclCommInitAll, ncclAllGather,
// ncclGroupStart/End, ncclCommDestroy, ncclGetErrorString, ncclGetVersion). Host code only:
// streams pass as void* (cudaStream_t is a pointer), so this file is tested on CPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace conduit {
namespace cuda {

// From NCCL's nccl.h, whose values are part of its stable ABI.
using NcclResult = int32_t;  // ncclResult_t: ncclSuccess = 0
constexpr NcclResult kNcclSuccess = 0;
constexpr int32_t kNcclUint8 = 1;  // ncclDataType_t ncclUint8: byte copies, which cannot reduce
using NcclComm = struct NcclCommOpaque*;  // ncclComm_t

struct NcclLibrary {
  void* handle = nullptr;
  int32_t version = 0;  // ncclGetVersion: major * 10000 + minor * 100 + patch (2.9 onward)
  NcclResult (*get_version)(int* version) = nullptr;
  NcclResult (*comm_init_all)(NcclComm* comms, int num_devices, const int* device_list) = nullptr;
  NcclResult (*all_gather)(const void* send, void* receive, size_t send_count, int32_t data_type, NcclComm comm,
                           void* stream) = nullptr;
  NcclResult (*group_start)() = nullptr;
  NcclResult (*group_end)() = nullptr;
  NcclResult (*comm_destroy)(NcclComm comm) = nullptr;
  const char* (*error_string)(NcclResult result) = nullptr;
};

// The library at file_name (libnccl.so.2 in practice), opened once per call and never closed (NCCL
// keeps threads of its own). Returns nullptr and sets why, naming the file and dlopen's or dlsym's
// message, when it does not open or lacks an entry point.
const NcclLibrary* open_nccl(const char* file_name, std::string& why);

// "NCCL <call> failed: <NCCL's text>", for errors.
std::string nccl_failure(const NcclLibrary& nccl, const char* call, NcclResult result);

}  // namespace cuda
}  // namespace conduit
