// The communicator of a tensor-parallel group: the collectives a forward pass needs, behind one
// interface. ShmCommunicator (comm_shm.cc) joins ranks on one machine through a shared-memory
// segment. No collective here reduces: an all-reduce is an all-gather of segment partials and the
// same fixed-order sum on every rank (row_parallel.h), so no library's reduction order enters a
// result.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace conduit {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int32_t rank() const = 0;
  virtual int32_t size() const = 0;
  // all[r * bytes, (r + 1) * bytes) = rank r's mine, on every rank; mine may lie inside all at
  // this rank's place (it is then not copied).
  virtual void all_gather(const void* mine, size_t bytes, void* all) = 0;
  // root's data[0, bytes) to every rank's data; every rank passes the same bytes.
  virtual void broadcast(void* data, size_t bytes, int32_t root) = 0;
  // Cumulative nanoseconds spent inside collectives (waiting included), for bench:tp.
  virtual uint64_t collective_ns() const = 0;
};

// Rank 0 creates the segment /dev/shm/<name> (removing a stale one of that name, and those of
// groups whose rank 0 has died) and unlinks it once every rank is ready, so no process's end,
// however abrupt, leaves it behind; rank r > 0 attaches to it,
// waiting up to connect_timeout_ms for rank 0 to have made it. Either throws
// Error(CD_ERR_RANK_UNAVAILABLE) naming the rank it could not reach. A collective waiting on a
// rank whose process has died, or longer than a rank may take, throws the same, naming it.
std::unique_ptr<Communicator> open_shm_communicator(const std::string& name, int32_t rank, int32_t size,
                                                    int32_t connect_timeout_ms);

// The group a tp_group of "mpi:" names: MPI_COMM_WORLD of a job the library's launcher (mpiexec)
// started, on one machine or several (comm_mpi.cc). The library is opened at run time; a machine
// without one fails here, naming what to install. Throws Error(CD_ERR_RANK_UNAVAILABLE).
std::unique_ptr<Communicator> open_mpi_communicator(int32_t rank, int32_t size);
// Every rank of an MPI group, once its shard is loaded: returns when all have come, or throws after
// timeout_ms.
void mpi_barrier(Communicator& comm, int32_t timeout_ms);
// An MPI rank's end of the job, after its model has closed in order (rank 0 sent the stop, rank
// r > 0 received it): waits up to timeout_ms for every rank to have closed, or names those that
// did not and aborts the job; then tells the launcher this rank finished, so that its exit does
// not make the launcher kill the others (comm_mpi.cc). Throws Error(CD_ERR_RANK_UNAVAILABLE).
void end_mpi_job(Communicator& comm, int32_t timeout_ms);
inline bool is_mpi_group(const char* group) { return std::string(group) == "mpi:"; }

// Rank 0: waits until every rank has called mark_ready() (its shard loaded), up to timeout_ms, or
// throws naming the ranks missing. rank_pids (or null): the processes started as ranks 1.., whose
// death before they connect fails the wait at once.
void wait_for_ranks(Communicator& comm, int32_t timeout_ms, const int32_t* rank_pids);
void mark_ready(Communicator& comm);

}  // namespace conduit
