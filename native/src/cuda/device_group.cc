#include "cuda/device_group.h"

#include <chrono>
#include <random>
#include <set>

#include "cuda/common.cuh"
#include "cuda/nccl.h"
#include "cuda/tp_plan.h"

namespace conduit {
namespace cuda {

namespace {

bool mine_in_place(const void* const* mine, size_t bytes, void* const* all, size_t num_ranks) {
  for (size_t r = 0; r < num_ranks; ++r) {
    if (mine[r] != static_cast<const char*>(all[r]) + r * bytes) return false;
  }
  return true;
}

// Copies of our own, ordered by events: each rank records `ready` once its partials are written;
// each destination waits for its sources' `ready`, copies, records `copied`; each source waits
// for every `copied` before its stream runs on (so it never overwrites bytes still being read).
class CopyGroup final : public DeviceGroup {
 public:
  explicit CopyGroup(const std::vector<DeviceRank>& ranks) : ranks_(ranks) {
    for (const DeviceRank& rank : ranks_) {
      CDC_CHECK(cudaSetDevice(rank.device));
      cudaEvent_t ready = nullptr;
      cudaEvent_t copied = nullptr;
      CDC_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
      CDC_CHECK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
      ready_.push_back(ready);
      copied_.push_back(copied);
    }
  }
  ~CopyGroup() override {
    for (size_t r = 0; r < ranks_.size(); ++r) {
      cudaSetDevice(ranks_[r].device);
      cudaEventDestroy(ready_[r]);
      cudaEventDestroy(copied_[r]);
    }
  }

  void all_gather(const void* const* mine, size_t bytes, void* const* all) override {
    const int32_t size = int32_t(ranks_.size());
    for (int32_t r = 0; r < size; ++r) {
      CDC_CHECK(cudaSetDevice(ranks_[size_t(r)].device));
      CDC_CHECK(cudaEventRecord(ready_[size_t(r)], ranks_[size_t(r)].stream));
    }
    const std::vector<GatherCopy> copies = gather_copies(size, bytes, mine_in_place(mine, bytes, all, ranks_.size()));
    for (const GatherCopy& copy : copies) {
      const DeviceRank& dst = ranks_[size_t(copy.dst_rank)];
      const DeviceRank& src = ranks_[size_t(copy.src_rank)];
      CDC_CHECK(cudaSetDevice(dst.device));
      CDC_CHECK(cudaStreamWaitEvent(dst.stream, ready_[size_t(copy.src_rank)], 0));
      CDC_CHECK(cudaMemcpyPeerAsync(static_cast<char*>(all[copy.dst_rank]) + copy.dst_offset_bytes, dst.device,
                                    mine[copy.src_rank], src.device, bytes, dst.stream));
    }
    for (int32_t r = 0; r < size; ++r) {
      CDC_CHECK(cudaSetDevice(ranks_[size_t(r)].device));
      CDC_CHECK(cudaEventRecord(copied_[size_t(r)], ranks_[size_t(r)].stream));
    }
    for (int32_t q = 0; q < size; ++q) {
      CDC_CHECK(cudaSetDevice(ranks_[size_t(q)].device));
      for (int32_t r = 0; r < size; ++r) {
        if (r != q) CDC_CHECK(cudaStreamWaitEvent(ranks_[size_t(q)].stream, copied_[size_t(r)], 0));
      }
    }
  }

  std::string describe() const override { return "device copies"; }

 private:
  std::vector<DeviceRank> ranks_;
  std::vector<cudaEvent_t> ready_;
  std::vector<cudaEvent_t> copied_;
};

// One communicator per rank from ncclCommInitAll; a collective is every rank's call inside one
// group (ncclGroupStart/End), as NCCL requires when one thread drives several ranks. Bytes are
// gathered as ncclUint8, so no reduction can enter.
class NcclGroup final : public DeviceGroup {
 public:
  NcclGroup(const NcclLibrary& nccl, const std::vector<DeviceRank>& ranks) : nccl_(nccl), ranks_(ranks), comms_(ranks.size()) {
    std::vector<int> devices;
    for (const DeviceRank& rank : ranks_) devices.push_back(rank.device);
    check("ncclCommInitAll", nccl_.comm_init_all(comms_.data(), int(devices.size()), devices.data()));
  }
  ~NcclGroup() override {
    for (NcclComm comm : comms_) nccl_.comm_destroy(comm);
  }

  void all_gather(const void* const* mine, size_t bytes, void* const* all) override {
    check("ncclGroupStart", nccl_.group_start());
    for (size_t r = 0; r < ranks_.size(); ++r) {
      const NcclResult result = nccl_.all_gather(mine[r], all[r], bytes, kNcclUint8, comms_[r], ranks_[r].stream);
      if (result != kNcclSuccess) {
        nccl_.group_end();
        check("ncclAllGather", result);
      }
    }
    check("ncclGroupEnd", nccl_.group_end());
  }

  std::string describe() const override {
    const int32_t v = nccl_.version;
    return "nccl " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
  }

 private:
  void check(const char* call, NcclResult result) const {
    if (result != kNcclSuccess) throw Error(CD_ERR_INTERNAL, nccl_failure(nccl_, call, result));
  }

  const NcclLibrary& nccl_;
  std::vector<DeviceRank> ranks_;
  std::vector<NcclComm> comms_;
};

}  // namespace

std::unique_ptr<DeviceGroup> open_device_group(const std::vector<DeviceRank>& ranks, std::string& nccl_why) {
  std::set<int32_t> devices;
  for (const DeviceRank& rank : ranks) devices.insert(rank.device);
  if (devices.size() != ranks.size()) {
    nccl_why = "ranks share a GPU, which NCCL does not allow";
    return std::make_unique<CopyGroup>(ranks);
  }
  static std::string open_why;
  static const NcclLibrary* nccl = open_nccl("libnccl.so.2", open_why);
  if (nccl == nullptr) {
    nccl_why = open_why;
    return std::make_unique<CopyGroup>(ranks);
  }
  nccl_why.clear();
  return std::make_unique<NcclGroup>(*nccl, ranks);
}

double probe_all_gather(int32_t device, int32_t num_ranks, size_t rank_bytes, std::string& describe) {
  CDC_CHECK(cudaSetDevice(device));
  std::vector<DeviceRank> ranks(static_cast<size_t>(num_ranks));
  std::vector<void*> mine(static_cast<size_t>(num_ranks));
  std::vector<void*> all(static_cast<size_t>(num_ranks));
  std::vector<std::vector<uint8_t>> expected(static_cast<size_t>(num_ranks), std::vector<uint8_t>(rank_bytes));
  std::mt19937_64 rng(std::random_device{}());
  std::vector<uint8_t> gathered(rank_bytes * size_t(num_ranks));
  struct Cleanup {
    std::vector<DeviceRank>& ranks;
    std::vector<void*>& mine;
    std::vector<void*>& all;
    ~Cleanup() {
      for (size_t r = 0; r < ranks.size(); ++r) {
        if (ranks[r].stream != nullptr) cudaStreamDestroy(ranks[r].stream);
        cudaFree(mine[r]);
        cudaFree(all[r]);
      }
    }
  } cleanup{ranks, mine, all};
  for (int32_t r = 0; r < num_ranks; ++r) {
    ranks[size_t(r)].device = device;
    CDC_CHECK(cudaStreamCreateWithFlags(&ranks[size_t(r)].stream, cudaStreamNonBlocking));
    CDC_CHECK(cudaMalloc(&mine[size_t(r)], rank_bytes));
    CDC_CHECK(cudaMalloc(&all[size_t(r)], rank_bytes * size_t(num_ranks)));
  }
  std::string nccl_why;
  std::unique_ptr<DeviceGroup> group = open_device_group(ranks, nccl_why);
  describe = group->describe() + (nccl_why.empty() ? "" : " (" + nccl_why + ")");
  const auto verify = [&](const char* mode) {
    for (int32_t r = 0; r < num_ranks; ++r) CDC_CHECK(cudaStreamSynchronize(ranks[size_t(r)].stream));
    for (int32_t r = 0; r < num_ranks; ++r) {
      CDC_CHECK(cudaMemcpy(gathered.data(), all[size_t(r)], gathered.size(), cudaMemcpyDeviceToHost));
      for (int32_t q = 0; q < num_ranks; ++q) {
        const uint8_t* got = gathered.data() + size_t(q) * rank_bytes;
        for (size_t b = 0; b < rank_bytes; ++b) {
          if (got[b] != expected[size_t(q)][b]) {
            throw Error(CD_ERR_INTERNAL, std::string("all-gather ") + mode + " by " + describe + ": rank " + std::to_string(r) +
                                             " holds a wrong byte " + std::to_string(b) + " of rank " + std::to_string(q));
          }
        }
      }
    }
  };
  // Apart: each rank's bytes in their own buffer, the gather buffers poisoned first.
  for (int32_t r = 0; r < num_ranks; ++r) {
    for (uint8_t& b : expected[size_t(r)]) b = uint8_t(rng());
    CDC_CHECK(cudaMemcpy(mine[size_t(r)], expected[size_t(r)].data(), rank_bytes, cudaMemcpyHostToDevice));
    CDC_CHECK(cudaMemset(all[size_t(r)], 0xEE, rank_bytes * size_t(num_ranks)));
  }
  group->all_gather(mine.data(), rank_bytes, all.data());
  verify("apart");
  // In place, as the row-parallel partials gather: each rank's bytes already at its place.
  std::vector<void*> in_place(static_cast<size_t>(num_ranks));
  for (int32_t r = 0; r < num_ranks; ++r) {
    for (uint8_t& b : expected[size_t(r)]) b = uint8_t(rng());
    CDC_CHECK(cudaMemset(all[size_t(r)], 0xEE, rank_bytes * size_t(num_ranks)));
    in_place[size_t(r)] = static_cast<char*>(all[size_t(r)]) + size_t(r) * rank_bytes;
    CDC_CHECK(cudaMemcpy(in_place[size_t(r)], expected[size_t(r)].data(), rank_bytes, cudaMemcpyHostToDevice));
  }
  double best = 1e30;
  for (int32_t repeat = 0; repeat < 5; ++repeat) {
    const auto start = std::chrono::steady_clock::now();
    group->all_gather(in_place.data(), rank_bytes, all.data());
    for (int32_t r = 0; r < num_ranks; ++r) CDC_CHECK(cudaStreamSynchronize(ranks[size_t(r)].stream));
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  verify("in place");
  return best;
}

}  // namespace cuda
}  // namespace conduit
