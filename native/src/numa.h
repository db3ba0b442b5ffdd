// NUMA placement of a tensor-parallel rank: on a machine with several nodes, rank r's threads run
// on node r % nodes (read from /sys/devices/system/node), so each rank streams its shard from its
// own node's memory (pages go where the packing threads first touch them).
#pragma once

#include <cstdint>
#include <sched.h>

namespace conduit {

// The node rank r of a group would use; -1 on a machine with one node (or none reported).
int32_t numa_node_for_rank(int32_t rank);

// Pins the calling thread (and the threads it then starts) to a node's CPUs until destroyed,
// when the thread's own mask comes back. Does nothing for node -1.
class NodeAffinity {
 public:
  explicit NodeAffinity(int32_t node);
  ~NodeAffinity();
  NodeAffinity(const NodeAffinity&) = delete;
  NodeAffinity& operator=(const NodeAffinity&) = delete;

 private:
  bool pinned_ = false;
  cpu_set_t saved_{};
};

}  // namespace conduit
