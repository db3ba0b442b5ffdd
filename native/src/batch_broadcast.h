// The step's batch, from rank 0 to the other ranks of a tensor-parallel group: what they compute
// from (tokens, positions, block tables, which rows reach the LM head), not what only rank 0's
// sampler reads.
#pragma once

#include <cstdint>
#include <vector>

#include "comm.h"
#include "conduit.h"

namespace conduit {

struct ReceivedBatch {
  std::vector<int32_t> values;
  std::vector<uint8_t> seq_flags;
  cd_batch batch{};
};

// values: the message's storage, kept by the caller from step to step.
void send_batch(Communicator& comm, const cd_batch& batch, int32_t num_kv_groups, std::vector<int32_t>& values);
// Tells the ranks to stop serving.
void send_stop(Communicator& comm);
// The next batch into received (its pointers into received's storage); false when rank 0 stops.
bool receive_batch(Communicator& comm, int32_t num_kv_groups, ReceivedBatch& received);

}  // namespace conduit
