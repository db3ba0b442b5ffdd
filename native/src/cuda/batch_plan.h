// The host side of a CUDA forward pass, free of CUDA so the CPU tests cover it
// (test/cuda_host_test.cc): what a cd_batch becomes on the device (each token's sequence,
// position and cache slot per KV-cache group, padded to a CUDA-graph bucket), which rows need
// logits, which of those sample on the device and which go back to the host, and the cache of
// captured decode graphs keyed by bucket.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <utility>
#include <vector>

#include "conduit.h"
#include "output_rows.h"

namespace conduit {
namespace cuda {

struct BatchPlan {
  int32_t num_tokens = 0;     // the batch's tokens
  int32_t padded_tokens = 0;  // num_tokens, or the graph bucket a decode step is padded to
  // [padded_tokens] each; padding tokens have id 0, sequence 0 and position -1.
  std::vector<int32_t> token_ids, positions, token_seqs;
  // [num_kv_groups][padded_tokens]: block * block_size + offset, or -1 (padding).
  std::vector<int32_t> slots;
  // [num_kv_groups][table_rows][block_table_stride]: the batch's block tables, rows widened to
  // the stride, table_rows = num_seqs or the graph bucket (unused entries 0), so a captured
  // graph finds each group's table at the same place every step.
  std::vector<int32_t> block_tables;
  int32_t table_rows = 0;
  int32_t block_table_stride = 0;
  // Attention chunks of kv_chunk_tokens positions the longest context spans (at least 1).
  int32_t num_chunks = 1;
  // The LM head's rows (the CPU pass's bookkeeping, shared: output_rows.h).
  OutputRows outputs;
  // Output rows sampled on the device (plain settings), and rows whose logits go to the host
  // (returned logits, or sampling that needs the host sampler). A sequence with proposals has
  // all of its 1 + k rows on one side.
  std::vector<int32_t> device_sampled_rows, host_rows;
  bool decode_only = false;   // every sequence contributes one token
};

// Whether a sequence's sampling runs on the device: no bitmask row, no bias or penalty that
// changes anything (penalties count a sequence's proposals too), no top logprobs. The rest uses
// the CPU sampler on the host.
bool samples_on_device(const cd_batch& batch, int32_t seq);

// Speculative verification after every row of a sequence with proposals was sampled on its own
// (each row's draw depends only on its logits, settings and output index, so sampling them all
// at once gives the tokens sequential sampling would): the sequence accepts proposals while its
// samples equal them, its rows after the first that differs (or after the last proposal) are
// cleared as the CPU pass leaves them (-1, 0, no top logprobs), and num_accepted_tokens is set.
void settle_proposals(const cd_batch& batch, int32_t sample_stride, cd_forward_output& output);

// A decode step of num_tokens pads to this many (a graph per bucket), or 0 past the largest.
int32_t graph_bucket(int32_t num_tokens);
constexpr int32_t kLargestGraphBucket = 256;

// num_chunks rounded up to a power of two: graphs are captured per (bucket, chunk bucket).
int32_t chunk_bucket(int32_t num_chunks);

BatchPlan plan_batch(const cd_batch& batch, int32_t num_kv_groups, int32_t block_size_tokens, int32_t kv_chunk_tokens,
                     bool pad_to_graph_bucket);

// Captured graphs by key, at most `capacity`, the least recently used destroyed first.
template <typename Handle>
class GraphCache {
 public:
  using Key = std::pair<int32_t, int32_t>;  // (token bucket, chunk bucket)
  GraphCache(size_t capacity, std::function<void(Handle)> destroy) : capacity_(capacity), destroy_(std::move(destroy)) {}
  ~GraphCache() { clear(); }
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  // The handle for key, now the most recently used; nullptr-like Handle{} when absent.
  Handle find(Key key) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->first == key) {
        entries_.splice(entries_.begin(), entries_, it);
        return entries_.front().second;
      }
    }
    return Handle{};
  }
  void insert(Key key, Handle handle) {
    entries_.emplace_front(key, handle);
    while (entries_.size() > capacity_) {
      destroy_(entries_.back().second);
      entries_.pop_back();
    }
  }
  // Every graph goes (the buffers they captured moved).
  void clear() {
    for (auto& entry : entries_) destroy_(entry.second);
    entries_.clear();
  }
  size_t size() const { return entries_.size(); }

 private:
  size_t capacity_;
  std::function<void(Handle)> destroy_;
  std::list<std::pair<Key, Handle>> entries_;
};

}  // namespace cuda
}  // namespace conduit
