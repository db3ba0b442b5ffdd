// Collectives through MPI, for ranks on several machines: the library is opened at run time
// (dlopen), so a build or a machine without one still works and only this transport is refused.
// The MPICH ABI (MPICH, Intel MPI, Cray MPICH, MVAPICH: libmpi.so.12) fixes the handle values
// below, so no MPI header is needed to build. The ranks are MPI_COMM_WORLD's, started by the
// library's launcher (mpiexec), which also joins them and ends the job if a process dies. As with
// shared memory, nothing here reduces: an all-reduce stays an all-gather plus our fixed tree.
#include <dlfcn.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "comm.h"
#include "error.h"

namespace conduit {

namespace {

// The MPICH ABI's handles and constants (mpi.h of MPICH 3.1 and later).
using MpiComm = int;
using MpiDatatype = int;
using MpiRequest = int;
constexpr MpiComm kCommWorld = 0x44000000;
constexpr MpiDatatype kByte = 0x4c00010d;
constexpr int kErrorsReturn = 0x54000001;
constexpr int kSuccess = 0;
constexpr int kThreadSerialized = 2;
// The tag of end_job's messages: point-to-point, so apart from every collective's.
constexpr int kEndOfJobTag = 1;
void* const kInPlace = reinterpret_cast<void*>(-1);
void* const kStatusIgnore = reinterpret_cast<void*>(1);
// The most bytes one call moves: MPI counts are int.
constexpr size_t kMaxCallBytes = size_t(1) << 30;

struct MpiLibrary {
  int (*initialized)(int*);
  int (*init_thread)(int*, char***, int, int*);
  int (*comm_rank)(MpiComm, int*);
  int (*comm_size)(MpiComm, int*);
  int (*comm_set_errhandler)(MpiComm, int);
  int (*allgather)(const void*, int, MpiDatatype, void*, int, MpiDatatype, MpiComm);
  int (*ibcast)(void*, int, MpiDatatype, int, MpiComm, MpiRequest*);
  int (*ibarrier)(MpiComm, MpiRequest*);
  int (*isend)(const void*, int, MpiDatatype, int, int, MpiComm, MpiRequest*);
  int (*irecv)(void*, int, MpiDatatype, int, int, MpiComm, MpiRequest*);
  int (*test)(MpiRequest*, int*, void*);
  int (*error_string)(int, char*, int*);
  int (*abort)(MpiComm, int);
};

template <typename F>
void resolve(void* handle, const char* name, F& function) {
  function = reinterpret_cast<F>(dlsym(handle, name));
  if (function == nullptr) throw Error(CD_ERR_RANK_UNAVAILABLE, std::string("the MPI library has no ") + name);
}

const MpiLibrary& mpi_library() {
  static const MpiLibrary library = [] {
    const char* configured = std::getenv("CONDUIT_MPI_LIBRARY");
    const char* names[] = {configured, "libmpi.so.12", "libmpich.so.12"};
    void* handle = nullptr;
    std::string tried;
    for (const char* name : names) {
      if (name == nullptr) continue;
      // RTLD_GLOBAL: the library's own plugins resolve its symbols.
      handle = dlopen(name, RTLD_NOW | RTLD_GLOBAL);
      if (handle != nullptr) break;
      tried += std::string(tried.empty() ? "" : "; ") + dlerror();
    }
    if (handle == nullptr) {
      throw Error(CD_ERR_RANK_UNAVAILABLE, "tensor-parallel transport mpi: no MPI library of the MPICH ABI could be opened (" + tried +
                                               "); install one (Debian: apt-get install mpich) or set CONDUIT_MPI_LIBRARY");
    }
    MpiLibrary mpi{};
    resolve(handle, "MPI_Initialized", mpi.initialized);
    resolve(handle, "MPI_Init_thread", mpi.init_thread);
    resolve(handle, "MPI_Comm_rank", mpi.comm_rank);
    resolve(handle, "MPI_Comm_size", mpi.comm_size);
    resolve(handle, "MPI_Comm_set_errhandler", mpi.comm_set_errhandler);
    resolve(handle, "MPI_Allgather", mpi.allgather);
    resolve(handle, "MPI_Ibcast", mpi.ibcast);
    resolve(handle, "MPI_Ibarrier", mpi.ibarrier);
    resolve(handle, "MPI_Isend", mpi.isend);
    resolve(handle, "MPI_Irecv", mpi.irecv);
    resolve(handle, "MPI_Test", mpi.test);
    resolve(handle, "MPI_Error_string", mpi.error_string);
    resolve(handle, "MPI_Abort", mpi.abort);
    return mpi;
  }();
  return library;
}

void check(const MpiLibrary& mpi, int code, const char* what) {
  if (code == kSuccess) return;
  char text[512] = {};
  int length = 0;
  mpi.error_string(code, text, &length);
  throw Error(CD_ERR_RANK_UNAVAILABLE, std::string("tensor-parallel transport mpi: ") + what + " failed: " + text);
}

// Tells the launcher's process manager that this rank has finished, as MPI_Finalize ends by doing
// (PMI-1 "finalize" on the socket MPICH's hydra hands each rank as PMI_FD; MPICH's own client
// speaks the same). Hydra takes a rank whose PMI socket closes without it for a crashed one and
// SIGKILLs the job's other ranks; whether mpiexec then reports "Killed (signal 9)" is a race in its
// proxy, which is how ~1 loaded job in 10 failed. MPI_Finalize itself is not called: in MPICH
// 4.0.2 it disconnects every endpoint and then waits in a PMI barrier without progress, while over
// UCX tcp a disconnect needs the peer's progress (its flush waits for the peer's ack), so the rank
// that finishes first can leave the other spinning for ever (upstream moved the barrier before
// the disconnects in MPICH 4.2). Loaded, 2 jobs of 8 hung so, and 2 of 6 with a handshake first.
// Without PMI_FD (another launcher) nothing is sent. The library's state is left to the exit.
void finish_with_launcher(std::chrono::steady_clock::time_point deadline) {
  const char* fd_text = std::getenv("PMI_FD");
  if (fd_text == nullptr) return;
  const int fd = std::atoi(fd_text);
  static constexpr char kFinalize[] = "cmd=finalize\n";
  for (size_t written = 0; written < sizeof kFinalize - 1;) {
    const ssize_t count = write(fd, kFinalize + written, sizeof kFinalize - 1 - written);
    if (count < 0 && errno == EINTR) continue;
    if (count <= 0) throw Error(CD_ERR_RANK_UNAVAILABLE, std::string("tensor-parallel transport mpi: telling the launcher this rank finished: ") + std::strerror(errno));
    written += size_t(count);
  }
  std::string reply;
  while (reply.find("finalize_ack") == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    pollfd readable{fd, POLLIN, 0};
    const int ready = poll(&readable, 1, int(std::clamp<int64_t>(left, 0, 1000)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0 && left > 0) continue;
    char buffer[256];
    const ssize_t count = ready > 0 ? read(fd, buffer, sizeof buffer) : 0;
    if (count <= 0) throw Error(CD_ERR_RANK_UNAVAILABLE, "tensor-parallel transport mpi: the launcher did not acknowledge this rank's finish (PMI finalize)");
    reply.append(buffer, size_t(count));
  }
  close(fd);
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(const MpiLibrary& mpi, int32_t rank, int32_t size) : mpi_(mpi), rank_(rank), size_(size) {}

  int32_t rank() const override { return rank_; }
  int32_t size() const override { return size_; }
  uint64_t collective_ns() const override { return collective_ns_; }

  void all_gather(const void* mine, size_t bytes, void* all) override {
    const auto start = std::chrono::steady_clock::now();
    uint8_t* target = static_cast<uint8_t*>(all);
    const bool in_place = mine == target + size_t(rank_) * bytes;
    if (bytes <= kMaxCallBytes) {
      check(mpi_, mpi_.allgather(in_place ? kInPlace : mine, int(bytes), kByte, all, int(bytes), kByte, kCommWorld), "MPI_Allgather");
    } else {
      throw Error(CD_ERR_INVALID_ARGUMENT, "tensor-parallel transport mpi: an all-gather over 1 GiB per rank");
    }
    collective_ns_ += elapsed_ns(start);
  }

  void broadcast(void* data, size_t bytes, int32_t root) override {
    const auto start = std::chrono::steady_clock::now();
    uint8_t* bytes_of = static_cast<uint8_t*>(data);
    for (size_t offset = 0; offset == 0 || offset < bytes; offset += kMaxCallBytes) {
      MpiRequest request = 0;
      check(mpi_, mpi_.ibcast(bytes_of + offset, int(std::min(kMaxCallBytes, bytes - offset)), kByte, root, kCommWorld, &request), "MPI_Ibcast");
      wait(request, "MPI_Ibcast");
      if (bytes == 0) break;
    }
    collective_ns_ += elapsed_ns(start);
  }

  void barrier(int32_t timeout_ms) {
    MpiRequest request = 0;
    check(mpi_, mpi_.ibarrier(kCommWorld, &request), "MPI_Ibarrier");
    wait(request, "MPI_Ibarrier", std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms));
  }

  // This rank's end of the job, once its model has closed (rank 0: after the stop; rank r > 0: after
  // receiving it). Every rank tells every other that it has closed and waits to hear the same,
  // so no rank leaves while another still takes part in a collective; a rank that does not come
  // within timeout_ms is named and the job aborted (MPI_Abort: mpiexec exits non-zero), rather
  // than ending with a rank left waiting. Then the launcher is told this rank has finished
  // (finish_with_launcher), so its exit is not taken for a crash.
  void end_job(int32_t timeout_ms) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    std::vector<MpiRequest> received(size_t(size_), 0), sent(size_t(size_), 0);
    std::vector<uint8_t> inbox(size_t(size_), 0);
    const uint8_t closed = 1;
    for (int32_t peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      check(mpi_, mpi_.irecv(&inbox[size_t(peer)], 1, kByte, peer, kEndOfJobTag, kCommWorld, &received[size_t(peer)]), "MPI_Irecv");
      check(mpi_, mpi_.isend(&closed, 1, kByte, peer, kEndOfJobTag, kCommWorld, &sent[size_t(peer)]), "MPI_Isend");
    }
    std::string missing;
    for (int32_t peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      if (!wait_until(received[size_t(peer)], "MPI_Irecv", deadline) || !wait_until(sent[size_t(peer)], "MPI_Isend", deadline)) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(peer);
      }
    }
    if (!missing.empty()) {
      std::fprintf(stderr,
                   "tensor-parallel transport mpi: rank %d of %d: rank(s) %s did not close within %d ms of this one; ending the MPI job as failed\n",
                   rank_, size_, missing.c_str(), timeout_ms);
      std::fflush(stderr);
      mpi_.abort(kCommWorld, 1);
    }
    // Its own deadline: a rank that came late must not leave the launcher's reply no time.
    finish_with_launcher(std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms));
  }

 private:
  // Polls a request until it completes (true) or the deadline passes (false).
  bool wait_until(MpiRequest& request, const char* what, std::chrono::steady_clock::time_point deadline) {
    for (uint64_t spin = 0;; ++spin) {
      int done = 0;
      check(mpi_, mpi_.test(&request, &done, kStatusIgnore), what);
      if (done != 0) return true;
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(spin < 1000 ? 10 : 200));
    }
  }

  static uint64_t elapsed_ns(std::chrono::steady_clock::time_point start) {
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
  }

  // Polls a nonblocking collective: briefly hot (a step's collectives), then napping, so the ranks
  // of an idle server waiting for rank 0's next batch cost no core.
  void wait(MpiRequest& request, const char* what,
            std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max()) {
    for (uint64_t spin = 0;; ++spin) {
      int done = 0;
      check(mpi_, mpi_.test(&request, &done, kStatusIgnore), what);
      if (done != 0) return;
      if (spin < (1u << 16)) continue;
      if (spin % 1024 == 0 && std::chrono::steady_clock::now() > deadline) {
        throw Error(CD_ERR_RANK_UNAVAILABLE, std::string("tensor-parallel transport mpi: not every rank of MPI_COMM_WORLD came (") + what + ")");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(spin < (1u << 18) ? 50 : 500));
    }
  }

  const MpiLibrary& mpi_;
  int32_t rank_;
  int32_t size_;
  uint64_t collective_ns_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> open_mpi_communicator(int32_t rank, int32_t size) {
  const MpiLibrary& mpi = mpi_library();
  int initialized = 0;
  check(mpi, mpi.initialized(&initialized), "MPI_Initialized");
  if (initialized == 0) {
    int provided = 0;
    check(mpi, mpi.init_thread(nullptr, nullptr, kThreadSerialized, &provided), "MPI_Init_thread");
    if (provided < kThreadSerialized) {
      throw Error(CD_ERR_RANK_UNAVAILABLE, "tensor-parallel transport mpi: the library does not allow calls from more than one thread");
    }
  }
  check(mpi, mpi.comm_set_errhandler(kCommWorld, kErrorsReturn), "MPI_Comm_set_errhandler");
  int world_rank = 0, world_size = 0;
  check(mpi, mpi.comm_rank(kCommWorld, &world_rank), "MPI_Comm_rank");
  check(mpi, mpi.comm_size(kCommWorld, &world_size), "MPI_Comm_size");
  if (world_rank != rank || world_size != size) {
    throw Error(CD_ERR_RANK_UNAVAILABLE, "tensor-parallel transport mpi: this process is rank " + std::to_string(world_rank) + " of " +
                                             std::to_string(world_size) + " in MPI_COMM_WORLD, not rank " + std::to_string(rank) +
                                             " of " + std::to_string(size) + " (start one process per rank with mpiexec)");
  }
  return std::make_unique<MpiCommunicator>(mpi, rank, size);
}

void mpi_barrier(Communicator& comm, int32_t timeout_ms) { static_cast<MpiCommunicator&>(comm).barrier(timeout_ms); }

void end_mpi_job(Communicator& comm, int32_t timeout_ms) { static_cast<MpiCommunicator&>(comm).end_job(timeout_ms); }

}  // namespace conduit
