// The shared-memory communicator under stress (comm-stress.test.ts runs it): for each group size
// 2, 4 and 8, that many processes (forked before any thread starts) join one segment, ranks > 0
// arriving late by random delays, and run 1000 / size random collectives: all-gathers of 0 bytes to
// two slots' worth (crossing the slot size), many of them tiny, in place and not, and
// broadcasts from random roots. Every byte is checked against what its rank must have sent.
// Prints one line per group size; a lost update hangs, and the test's timeout fails it.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../src/comm.h"
#include "../src/error.h"

namespace {


uint8_t expected_byte(uint64_t op, int rank, size_t i) { return uint8_t((op * 131 + uint64_t(rank) * 29 + i * 7) & 0xff); }

// Every rank draws the same sequence of collectives from the shared seed.
// Fewer for larger groups: eight processes share this machine's cores.
int collectives_of(int size) { return 1000 / size; }

int run_rank(const std::string& name, int rank, int size, uint64_t seed) {
  std::mt19937_64 delays(seed ^ uint64_t(rank));
  if (rank > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delays() % 200));
  auto comm = conduit::open_shm_communicator(name, rank, size, 10000);
  if (rank == 0) {
    conduit::wait_for_ranks(*comm, 10000, nullptr);
  } else {
    conduit::mark_ready(*comm);
  }
  std::mt19937_64 ops(seed);
  std::vector<uint8_t> mine, all;
  for (uint64_t op = 0; op < uint64_t(collectives_of(size)); ++op) {
    const uint64_t kind = ops() % 4;
    // Mostly tiny (a decode step's partials), sometimes past the 4 MiB slot.
    const size_t bytes = ops() % 64 == 0 ? size_t(ops() % (9u << 20)) : size_t(ops() % 4096);
    if (kind == 3) {
      const int root = int(ops() % uint64_t(size));
      mine.assign(bytes, 0);
      if (rank == root) for (size_t i = 0; i < bytes; ++i) mine[i] = expected_byte(op, root, i);
      comm->broadcast(mine.data(), bytes, root);
      for (size_t i = 0; i < bytes; ++i) {
        if (mine[i] != expected_byte(op, root, i)) {
          std::fprintf(stderr, "rank %d: broadcast %llu byte %zu wrong\n", rank, (unsigned long long)op, i);
          return 1;
        }
      }
      continue;
    }
    all.assign(bytes * size_t(size), 0xee);
    const bool in_place = kind == 2;
    uint8_t* source = in_place ? all.data() + bytes * size_t(rank) : (mine.resize(bytes), mine.data());
    for (size_t i = 0; i < bytes; ++i) source[i] = expected_byte(op, rank, i);
    comm->all_gather(source, bytes, all.data());
    for (int r = 0; r < size; ++r) {
      for (size_t i = 0; i < bytes; ++i) {
        if (all[size_t(r) * bytes + i] != expected_byte(op, r, i)) {
          std::fprintf(stderr, "rank %d: all-gather %llu from rank %d byte %zu wrong\n", rank, (unsigned long long)op, r, i);
          return 1;
        }
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1;
  for (int size : {2, 4, 8}) {
    const std::string name = "conduit-comm-stress-" + std::to_string(getpid()) + "-" + std::to_string(size);
    std::vector<pid_t> children;
    for (int rank = 1; rank < size; ++rank) {
      const pid_t pid = fork();
      if (pid == 0) {
        try {
          _exit(run_rank(name, rank, size, seed + uint64_t(size)));
        } catch (const std::exception& e) {
          std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
          _exit(1);
        }
      }
      children.push_back(pid);
    }
    int failed = 0;
    try {
      failed = run_rank(name, 0, size, seed + uint64_t(size));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank 0: %s\n", e.what());
      failed = 1;
    }
    for (pid_t pid : children) {
      int status = 0;
      waitpid(pid, &status, 0);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
    }
    if (failed) return 1;
    std::printf("%d ranks: %d collectives, every byte as sent\n", size, collectives_of(size));
  }
  return 0;
}
