// Shared-memory collectives for the ranks of one machine. The segment holds a header (per-rank
// sequence counters on their own cache lines, each rank's pid) and one slot per rank. A
// collective moves data through the slots in rounds of at most kSlotBytes: a rank waits until
// every rank has finished reading the previous round, writes its slot, raises its "written"
// counter, waits for everyone's, copies what it needs, and raises its "read" counter.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "comm.h"
#include "error.h"

namespace conduit {

namespace {

constexpr uint64_t kMagic = 0x636f6e647569742dULL;  // "conduit-"
constexpr int32_t kMaxRanks = 8;
constexpr size_t kSlotBytes = size_t(4) << 20;
// A rank that has not moved for this long inside a collective is taken for lost even if its
// process lives (stopped, or looping): a forward pass never waits this long on a peer.
constexpr int64_t kCollectiveTimeoutMs = 120000;
constexpr int64_t kNoTimeoutMs = int64_t(1) << 50;

struct alignas(64) Counter {
  std::atomic<uint64_t> value;
};

struct Header {
  std::atomic<uint64_t> magic;  // written last by rank 0: the segment is ready
  int32_t size;
  std::atomic<int32_t> pids[kMaxRanks];
  std::atomic<int32_t> ready[kMaxRanks];
  Counter written[kMaxRanks];
  Counter read[kMaxRanks];
};

size_t segment_bytes(int32_t size) { return sizeof(Header) + size_t(size) * kSlotBytes; }

std::string segment_path(const std::string& name) { return "/dev/shm/" + name; }

bool process_alive(int32_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

class ShmCommunicator final : public Communicator {
 public:
  ShmCommunicator(std::string name, int32_t rank, int32_t size, void* base)
      : name_(std::move(name)), rank_(rank), size_(size), header_(static_cast<Header*>(base)),
        slots_(static_cast<uint8_t*>(base) + sizeof(Header)) {}

  ~ShmCommunicator() override {
    munmap(header_, segment_bytes(size_));
    unlink_segment();
  }

  // Rank 0, once every rank has mapped the segment: the name is no longer needed, and a segment
  // without one goes with its last mapping, however its processes end (SIGKILL included).
  void unlink_segment() {
    if (rank_ != 0 || unlinked_) return;
    shm_unlink(("/" + name_).c_str());
    unlinked_ = true;
  }

  int32_t rank() const override { return rank_; }
  int32_t size() const override { return size_; }
  uint64_t collective_ns() const override { return collective_ns_; }

  void all_gather(const void* mine, size_t bytes, void* all) override {
    const auto start = std::chrono::steady_clock::now();
    const uint8_t* source = static_cast<const uint8_t*>(mine);
    uint8_t* target = static_cast<uint8_t*>(all);
    for (size_t offset = 0; offset == 0 || offset < bytes; offset += kSlotBytes) {
      const size_t piece = std::min(kSlotBytes, bytes - offset);
      round(-1, [&] { std::memcpy(slot(rank_), source + offset, piece); },
            [&] {
              for (int32_t r = 0; r < size_; ++r) {
                uint8_t* destination = target + size_t(r) * bytes + offset;
                if (r == rank_ && destination == source + offset) continue;
                std::memcpy(destination, slot(r), piece);
              }
            });
      if (bytes == 0) break;
    }
    collective_ns_ += uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
  }

  void broadcast(void* data, size_t bytes, int32_t root) override {
    const auto start = std::chrono::steady_clock::now();
    uint8_t* bytes_of = static_cast<uint8_t*>(data);
    for (size_t offset = 0; offset == 0 || offset < bytes; offset += kSlotBytes) {
      const size_t piece = std::min(kSlotBytes, bytes - offset);
      round(root, [&] { if (rank_ == root) std::memcpy(slot(root), bytes_of + offset, piece); },
            [&] { if (rank_ != root) std::memcpy(bytes_of + offset, slot(root), piece); });
      if (bytes == 0) break;
    }
    collective_ns_ += uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
  }

  Header& header() { return *header_; }

  // Waits until condition(r) holds for every rank, checking that the ranks it waits on live.
  template <typename Condition>
  void wait_all(const Condition& condition, int64_t timeout_ms, const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (int32_t r = 0; r < size_; ++r) {
      for (uint64_t spin = 0; !condition(r); ++spin) {
        // Poll briefly, then yield (ranks may outnumber cores: TP = 4 on 2 cores), then nap: long
        // waits (an idle server's ranks) cost no core.
        if (spin < 256) continue;
        if (spin < (1u << 16)) {
          sched_yield();
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(spin < (1u << 18) ? 50 : 500));
        }
        if (spin % 1024 != 0) continue;
        const int32_t pid = header_->pids[r].load(std::memory_order_acquire);
        if (pid != 0 && !process_alive(pid)) {  // 0: not connected yet
          throw Error(CD_ERR_RANK_UNAVAILABLE, "tensor-parallel rank " + std::to_string(r) + " of group " + name_ +
                                                   " has exited (" + what + ")");
        }
        if (std::chrono::steady_clock::now() > deadline) {
          throw Error(CD_ERR_RANK_UNAVAILABLE, "tensor-parallel rank " + std::to_string(r) + " of group " + name_ +
                                                   " did not respond within " + std::to_string(timeout_ms) + " ms (" + what + ")");
        }
      }
    }
  }

 private:
  uint8_t* slot(int32_t r) const { return slots_ + size_t(r) * kSlotBytes; }

  // One round: root -1 when every rank writes (an all-gather), else the one writer (a broadcast).
  // Ranks waiting for a broadcast wait as long as its root lives: between steps rank 0 may idle
  // for hours.
  template <typename Write, typename Read>
  void round(int32_t root, const Write& write, const Read& read) {
    // A group that lost a rank stays lost: the counters no longer line up.
    if (!failure_.empty()) throw Error(CD_ERR_RANK_UNAVAILABLE, failure_);
    try {
      exchange(root, write, read);
    } catch (const Error& error) {
      failure_ = error.what();
      throw;
    }
  }

  template <typename Write, typename Read>
  void exchange(int32_t root, const Write& write, const Read& read) {
    const uint64_t sequence = ++sequence_;
    // Every rank has read the previous round's slots.
    wait_all([&](int32_t r) { return header_->read[r].value.load(std::memory_order_acquire) >= sequence - 1; },
             kCollectiveTimeoutMs, "collective");
    write();
    header_->written[rank_].value.store(sequence, std::memory_order_release);
    wait_all([&](int32_t r) { return (root >= 0 && r != root) || header_->written[r].value.load(std::memory_order_acquire) >= sequence; },
             root >= 0 ? kNoTimeoutMs : kCollectiveTimeoutMs, root >= 0 ? "waiting for the next step" : "collective");
    read();
    header_->read[rank_].value.store(sequence, std::memory_order_release);
  }

  std::string name_;
  int32_t rank_;
  int32_t size_;
  Header* header_;
  uint8_t* slots_;
  uint64_t sequence_ = 0;
  uint64_t collective_ns_ = 0;
  std::string failure_;
  bool unlinked_ = false;
};

void* map_segment(int fd, int32_t size) {
  void* base = mmap(nullptr, segment_bytes(size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) throw Error(CD_ERR_RANK_UNAVAILABLE, std::string("cannot map the tensor-parallel segment: ") + std::strerror(errno));
  return base;
}

// Segments of groups whose rank 0 died before every rank had mapped (and so before rank 0 could
// unlink) their segment: named conduit-*, made by us (the magic), rank 0's process gone.
void reclaim_stale_segments() {
  DIR* directory = opendir("/dev/shm");
  if (directory == nullptr) return;
  while (const dirent* entry = readdir(directory)) {
    const std::string name = entry->d_name;
    if (name.rfind("conduit-", 0) != 0) continue;
    const int fd = shm_open(("/" + name).c_str(), O_RDONLY, 0);
    if (fd < 0) continue;
    struct stat info {};
    void* base = MAP_FAILED;
    if (fstat(fd, &info) == 0 && size_t(info.st_size) >= sizeof(Header)) {
      base = mmap(nullptr, sizeof(Header), PROT_READ, MAP_SHARED, fd, 0);
    }
    close(fd);
    if (base == MAP_FAILED) continue;
    const Header* header = static_cast<const Header*>(base);
    const bool stale = header->magic.load(std::memory_order_acquire) == kMagic &&
                       !process_alive(header->pids[0].load(std::memory_order_acquire));
    munmap(base, sizeof(Header));
    if (stale) shm_unlink(("/" + name).c_str());
  }
  closedir(directory);
}

}  // namespace

std::unique_ptr<Communicator> open_shm_communicator(const std::string& name, int32_t rank, int32_t size,
                                                    int32_t connect_timeout_ms) {
  if (size < 1 || size > kMaxRanks || rank < 0 || rank >= size) {
    throw Error(CD_ERR_INVALID_ARGUMENT, "tensor-parallel rank " + std::to_string(rank) + " of " + std::to_string(size));
  }
  const std::string shm_name = "/" + name;
  if (rank == 0) {
    reclaim_stale_segments();
    shm_unlink(shm_name.c_str());
    const int fd = shm_open(shm_name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, off_t(segment_bytes(size))) != 0) {
      const std::string reason = std::strerror(errno);
      if (fd >= 0) close(fd);
      throw Error(CD_ERR_RANK_UNAVAILABLE, "tensor-parallel rank 0 cannot create " + segment_path(name) + ": " + reason);
    }
    auto comm = std::make_unique<ShmCommunicator>(name, rank, size, map_segment(fd, size));
    Header& header = comm->header();
    header.size = size;
    header.pids[0].store(int32_t(getpid()), std::memory_order_relaxed);
    header.magic.store(kMagic, std::memory_order_release);
    return comm;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(connect_timeout_ms);
  for (;;) {
    const int fd = shm_open(shm_name.c_str(), O_RDWR, 0600);
    struct stat info {};
    if (fd >= 0 && fstat(fd, &info) == 0 && size_t(info.st_size) == segment_bytes(size)) {
      auto comm = std::make_unique<ShmCommunicator>(name, rank, size, map_segment(fd, size));
      Header& header = comm->header();
      while (header.magic.load(std::memory_order_acquire) != kMagic && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (header.magic.load(std::memory_order_acquire) == kMagic && header.size == size) {
        if (header.pids[rank].load() != 0 && process_alive(header.pids[rank].load())) {
          throw Error(CD_ERR_RANK_UNAVAILABLE, "tensor-parallel rank " + std::to_string(rank) + " of group " + name +
                                                   " is taken by process " + std::to_string(header.pids[rank].load()));
        }
        header.pids[rank].store(int32_t(getpid()), std::memory_order_release);
        return comm;
      }
    } else if (fd >= 0) {
      close(fd);
    }
    if (std::chrono::steady_clock::now() > deadline) {
      throw Error(CD_ERR_RANK_UNAVAILABLE, "tensor-parallel rank " + std::to_string(rank) + " could not reach rank 0 of group " +
                                               name + " (" + segment_path(name) + ") within " + std::to_string(connect_timeout_ms) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void mark_ready(Communicator& comm) {
  static_cast<ShmCommunicator&>(comm).header().ready[comm.rank()].store(1, std::memory_order_release);
}

void wait_for_ranks(Communicator& comm, int32_t timeout_ms, const int32_t* rank_pids) {
  ShmCommunicator& shm = static_cast<ShmCommunicator&>(comm);
  Header& header = shm.header();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    std::string missing;
    for (int32_t r = 1; r < comm.size(); ++r) {
      int32_t pid = header.pids[r].load(std::memory_order_acquire);
      if (pid == 0 && rank_pids != nullptr && !process_alive(rank_pids[r - 1])) pid = rank_pids[r - 1];
      const bool ready = header.ready[r].load(std::memory_order_acquire) != 0;
      if (ready && process_alive(pid)) continue;
      if (pid != 0 && !process_alive(pid)) {
        throw Error(CD_ERR_RANK_UNAVAILABLE, "tensor-parallel rank " + std::to_string(r) + " (process " + std::to_string(pid) +
                                                 ") exited before it was ready");
      }
      missing += (missing.empty() ? "" : ", ") + std::to_string(r) + (pid == 0 ? " (never connected)" : " (still loading)");
    }
    if (missing.empty()) {
      shm.unlink_segment();
      return;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      throw Error(CD_ERR_RANK_UNAVAILABLE, "tensor-parallel group: rank(s) " + missing + " did not join within " +
                                               std::to_string(timeout_ms) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace conduit
