// A tensor-parallel group of GPU ranks in one process, behind one all-gather (comm.h's contract:
// the group gathers segment partials and never reduces; every rank then folds the same fixed
// tree, src/row_parallel.h). One host thread enqueues every rank's work on the rank's own stream,
// so the collective is a set of stream-ordered copies, not a rendezvous of threads.
//   - NCCL (ncclCommInitAll + ncclAllGather) when every rank has a GPU of its own and
//     libnccl.so.2 opens;
//   - otherwise copies of our own: cudaMemcpyPeerAsync between GPUs, device-to-device copies when
//     ranks share one GPU (the only way to test TP with one GPU), ordered by events.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

namespace conduit {
namespace cuda {

struct DeviceRank {
  int32_t device = 0;
  cudaStream_t stream = nullptr;
};

class DeviceGroup {
 public:
  virtual ~DeviceGroup() = default;
  // Enqueues on every rank r's stream: all[r][q * bytes, (q + 1) * bytes) = mine[q], for every q,
  // after the work already on rank q's stream; no rank's later work overwrites mine[q] before every
  // rank has copied it. mine[r] may lie inside all[r] at r's place (then it is not copied).
  virtual void all_gather(const void* const* mine, size_t bytes, void* const* all) = 0;
  // "nccl 2.x.y" or "device copies", for the check program and errors.
  virtual std::string describe() const = 0;
};

// Throws conduit::Error on a CUDA or NCCL failure. nccl_why: why NCCL was not used (empty when
// it was).
std::unique_ptr<DeviceGroup> open_device_group(const std::vector<DeviceRank>& ranks, std::string& nccl_why);

// The GPU check's test of the group: num_ranks ranks on device, each on its own stream, gather
// random bytes (rank_bytes each), apart and in place, checked bitwise on the host; throws
// Error(CD_ERR_INTERNAL) naming the first rank and byte that differ. Returns the seconds of one
// gather (the best of several); describe: the group's describe() and why NCCL was not used.
double probe_all_gather(int32_t device, int32_t num_ranks, size_t rank_bytes, std::string& describe);

}  // namespace cuda
}  // namespace conduit
