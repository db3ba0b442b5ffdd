#include "numa.h"

#include <dirent.h>

#include <algorithm>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace conduit {

namespace {

std::vector<int32_t> online_nodes() {
  std::vector<int32_t> nodes;
  DIR* dir = opendir("/sys/devices/system/node");
  if (dir == nullptr) return nodes;
  while (const dirent* entry = readdir(dir)) {
    if (std::strncmp(entry->d_name, "node", 4) == 0 && entry->d_name[4] >= '0' && entry->d_name[4] <= '9') {
      nodes.push_back(int32_t(std::atoi(entry->d_name + 4)));
    }
  }
  closedir(dir);
  return nodes;
}

// "0-3,8-11" -> the set.
bool node_cpus(int32_t node, cpu_set_t& cpus) {
  const std::string path = "/sys/devices/system/node/node" + std::to_string(node) + "/cpulist";
  FILE* file = std::fopen(path.c_str(), "r");
  if (file == nullptr) return false;
  char list[4096] = {};
  const bool read = std::fgets(list, sizeof list, file) != nullptr;
  std::fclose(file);
  if (!read) return false;
  CPU_ZERO(&cpus);
  int count = 0;
  for (char* part = std::strtok(list, ",\n"); part != nullptr; part = std::strtok(nullptr, ",\n")) {
    int first = 0, last = 0;
    const int fields = std::sscanf(part, "%d-%d", &first, &last);
    if (fields < 1) continue;
    if (fields == 1) last = first;
    for (int cpu = first; cpu <= last && cpu < CPU_SETSIZE; ++cpu, ++count) CPU_SET(cpu, &cpus);
  }
  return count > 0;
}

}  // namespace

int32_t numa_node_for_rank(int32_t rank) {
  std::vector<int32_t> nodes = online_nodes();
  if (nodes.size() < 2) return -1;
  std::sort(nodes.begin(), nodes.end());
  return nodes[size_t(rank) % nodes.size()];
}

NodeAffinity::NodeAffinity(int32_t node) {
  if (node < 0) return;
  cpu_set_t cpus;
  if (!node_cpus(node, cpus) || sched_getaffinity(0, sizeof saved_, &saved_) != 0) return;
  pinned_ = sched_setaffinity(0, sizeof cpus, &cpus) == 0;
}

NodeAffinity::~NodeAffinity() {
  if (pinned_) sched_setaffinity(0, sizeof saved_, &saved_);
}

}  // namespace conduit
