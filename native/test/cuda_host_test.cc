// The host-side parts of the CUDA backend, tested on any machine (native/test/cuda-host.test.ts
// runs it): the shared sampling arithmetic against the CPU sampler, the batch plan a cd_batch
// becomes on the device, the captured-graph cache, a GPU group's shard plan and all-gather copies,
// and NCCL's run-time loading. Prints one line per failure and exits
// nonzero on any; the seed comes from argv[1].
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <vector>

#include "cuda/batch_plan.h"
#include "cuda/nccl.h"
#include "cuda/tp_plan.h"
#include "error.h"
#include "kernels.h"
#include "moe_parallel.h"
#include "row_parallel.h"
#include "thread_pool.h"
#include "sampler.h"
#include "shared/sampling_math.h"

using namespace conduit;

namespace {

int failures = 0;

#define EXPECT(condition, ...)                 \
  do {                                         \
    if (!(condition)) {                        \
      ++failures;                              \
      std::printf("FAIL %s:%d: ", __FILE__, __LINE__); \
      std::printf(__VA_ARGS__);                \
      std::printf("\n");                       \
    }                                          \
  } while (0)

// The device sampler's algorithm (src/cuda/sample.cu) step for step on one thread, through the
// same shared functions: raw argmax ties to the lowest id; min-p survivors in id order; sorted by
// candidate_key when top-k or top-p needs an order; probabilities in double; cut and draw.
int32_t device_algorithm(const std::vector<float>& x, const SamplingParams& p) {
  const int32_t vocab = int32_t(x.size());
  float max_logit = -std::numeric_limits<float>::infinity();
  int32_t argmax = vocab;
  for (int32_t id = 0; id < vocab; ++id) {
    if (argmax == vocab || sampling::ranks_before(x[size_t(id)], id, max_logit, argmax)) {
      max_logit = x[size_t(id)];
      argmax = id;
    }
  }
  if (p.temperature <= 0.0f || p.top_k == 1 || max_logit == std::numeric_limits<float>::infinity()) return argmax;
  const double threshold = p.min_p > 0.0f ? sampling::min_p_threshold(max_logit, p.temperature, std::log(double(p.min_p)))
                                          : -std::numeric_limits<double>::infinity();
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < vocab; ++id) {
    if (double(x[size_t(id)]) >= threshold) ids.push_back(id);
  }
  int32_t n = int32_t(ids.size());
  const bool top_k_active = p.top_k > 0 && p.top_k < n;
  if (top_k_active || p.top_p < 1.0f) {
    std::vector<uint64_t> keys;
    for (int32_t id : ids) keys.push_back(sampling::candidate_key(x[size_t(id)], id));
    std::sort(keys.begin(), keys.end());
    if (top_k_active) n = p.top_k;
    for (int32_t i = 0; i < n; ++i) ids[size_t(i)] = int32_t(uint32_t(keys[size_t(i)]));
  }
  std::vector<double> probs(static_cast<size_t>(n));
  double total = 0;
  for (int32_t i = 0; i < n; ++i) {
    probs[size_t(i)] = std::exp((double(x[size_t(ids[size_t(i)])]) - max_logit) * (1.0 / double(p.temperature)));
  }
  for (int32_t i = 0; i < n; ++i) total += probs[size_t(i)];
  const double u = sampling::uniform_from_counter(p.seed, uint64_t(uint32_t(p.output_index)));
  return ids[size_t(sampling::cut_and_draw(probs.data(), n, total, p.top_p, u))];
}

void test_sampler_agreement(std::mt19937_64& rng) {
  const KernelTable& kernels = kernels_scalar();
  SamplerScratch scratch;
  const LogitAdjustments none{nullptr, nullptr, 0, 1.0f, 0.0f, 0.0f, nullptr, nullptr, nullptr, 0, nullptr, 0};
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  int32_t draws = 0;
  for (int32_t trial = 0; trial < 3000; ++trial) {
    const int32_t vocab = 1 + int32_t(rng() % 300);
    std::vector<float> logits(static_cast<size_t>(vocab));
    // Coarse values make ties common; some rows carry -inf bans, -0 and +0 side by side.
    const bool coarse = trial % 3 == 0;
    for (float& logit : logits) {
      logit = coarse ? float(int32_t(rng() % 7) - 3) : 8.0f * uniform(rng) - 4.0f;
      if (rng() % 29 == 0) logit = -std::numeric_limits<float>::infinity();
      if (coarse && logit == 0.0f && rng() % 2 == 0) logit = -0.0f;
    }
    SamplingParams params{};
    params.temperature = trial % 11 == 0 ? 0.0f : 0.2f + 1.8f * uniform(rng);
    params.top_p = trial % 2 == 0 ? 1.0f : 0.05f + 0.9f * uniform(rng);
    params.top_k = trial % 3 == 1 ? 1 + int32_t(rng() % 20) : 0;
    params.min_p = trial % 4 == 2 ? 0.3f * uniform(rng) : 0.0f;
    params.seed = rng();
    params.output_index = int32_t(rng() % 1000);
    const ArgMax raw = kernels.argmax(logits.data(), vocab);
    const int32_t cpu = sample_token(kernels, logits.data(), vocab, raw, params, none, nullptr, scratch);
    const int32_t device = device_algorithm(logits, params);
    EXPECT(cpu == device, "trial %d (vocab %d, T %g, top_p %g, top_k %d, min_p %g): cpu %d, device algorithm %d", trial,
           vocab, double(params.temperature), double(params.top_p), params.top_k, double(params.min_p), cpu, device);
    ++draws;
  }
  std::printf("sampler agreement: %d draws\n", draws);
}

void test_candidate_key(std::mt19937_64& rng) {
  const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min(),
                            -std::numeric_limits<float>::denorm_min(), 3.0e38f, -3.0e38f};
  std::uniform_int_distribution<int32_t> pick(0, 9);
  for (int32_t i = 0; i < 20000; ++i) {
    const float a = i % 2 == 0 ? specials[pick(rng)] : std::ldexp(float(int32_t(rng() % 2001) - 1000), int32_t(rng() % 40) - 20);
    const float b = i % 3 == 0 ? specials[pick(rng)] : std::ldexp(float(int32_t(rng() % 2001) - 1000), int32_t(rng() % 40) - 20);
    const int32_t ia = int32_t(rng() % 50);
    const int32_t ib = int32_t(rng() % 50);
    if (ia == ib) continue;
    const bool by_rule = sampling::ranks_before(a, ia, b, ib);
    const bool by_key = sampling::candidate_key(a, ia) < sampling::candidate_key(b, ib);
    EXPECT(by_rule == by_key, "(%g, %d) vs (%g, %d): ranks_before %d, keys %d", double(a), ia, double(b), ib, by_rule, by_key);
  }
}

// A random batch over a random block pool: prefills, chunks and decode tokens.
struct RandomBatch {
  std::vector<int32_t> token_ids, positions, query_starts, block_tables;
  std::vector<uint8_t> flags;
  std::vector<float> temperatures, top_ps, min_ps, presence, frequency, repetition, bias_values;
  std::vector<int32_t> top_ks, output_indices, penalty_starts, bias_starts, bias_ids, penalty_ids, penalty_counts,
      num_top, num_prompt_top, next_ids, bitmask_rows, num_drafts;
  std::vector<uint8_t> in_prompt;
  std::vector<uint64_t> seeds;
  int32_t max_blocks = 0;
  cd_batch batch{};
};

RandomBatch random_batch(std::mt19937_64& rng, int32_t num_groups, int32_t block_size, bool decode_only) {
  RandomBatch r;
  const int32_t num_seqs = 1 + int32_t(rng() % 40);
  r.max_blocks = 1 + int32_t(rng() % 70);
  r.query_starts.push_back(0);
  for (int32_t s = 0; s < num_seqs; ++s) {
    const int32_t context = 1 + int32_t(rng() % (r.max_blocks * block_size));
    const int32_t count = decode_only ? 1 : 1 + int32_t(rng() % std::min(context, 40));
    for (int32_t i = 0; i < count; ++i) {
      r.token_ids.push_back(int32_t(rng() % 1000));
      r.positions.push_back(context - count + i);
    }
    r.query_starts.push_back(int32_t(r.token_ids.size()));
    r.flags.push_back(uint8_t(rng() % 8));
    r.temperatures.push_back(float(rng() % 3) * 0.5f);
    r.top_ps.push_back(1.0f);
    r.top_ks.push_back(0);
    r.min_ps.push_back(0.0f);
    r.seeds.push_back(rng());
    r.output_indices.push_back(int32_t(rng() % 10));
    r.presence.push_back(0.0f);
    r.frequency.push_back(0.0f);
    r.repetition.push_back(rng() % 5 == 0 ? 1.2f : 1.0f);
    r.num_top.push_back(rng() % 6 == 0 ? 3 : 0);
    r.num_prompt_top.push_back(0);
    r.next_ids.push_back(rng() % 2 == 0 ? -1 : 7);
    r.bitmask_rows.push_back(rng() % 7 == 0 ? 0 : -1);
    // Speculative verification: a sampled sequence's last tokens may be proposals.
    const bool verifies = r.flags.back() == CD_SEQ_SAMPLE && count > 1 && rng() % 2 == 0;
    r.num_drafts.push_back(verifies ? 1 + int32_t(rng() % std::min(count - 1, 4)) : 0);
  }
  r.penalty_starts.push_back(0);
  r.bias_starts.push_back(0);
  for (int32_t s = 0; s < num_seqs; ++s) {
    if (rng() % 4 == 0) {
      r.penalty_ids.push_back(5);
      r.penalty_counts.push_back(1);
      r.in_prompt.push_back(1);
    }
    r.penalty_starts.push_back(int32_t(r.penalty_ids.size()));
    if (rng() % 6 == 0) {
      r.bias_ids.push_back(3);
      r.bias_values.push_back(1.5f);
    }
    r.bias_starts.push_back(int32_t(r.bias_ids.size()));
  }
  for (int32_t g = 0; g < num_groups; ++g) {
    for (int32_t s = 0; s < num_seqs; ++s) {
      for (int32_t b = 0; b < r.max_blocks; ++b) r.block_tables.push_back(int32_t(rng() % 100000));
    }
  }
  cd_batch& b = r.batch;
  b.num_seqs = num_seqs;
  b.num_tokens = int32_t(r.token_ids.size());
  b.token_ids = r.token_ids.data();
  b.positions = r.positions.data();
  b.query_starts = r.query_starts.data();
  b.max_blocks_per_seq = r.max_blocks;
  b.block_tables = r.block_tables.data();
  b.seq_flags = r.flags.data();
  b.temperatures = r.temperatures.data();
  b.top_ps = r.top_ps.data();
  b.top_ks = r.top_ks.data();
  b.seeds = r.seeds.data();
  b.output_indices = r.output_indices.data();
  b.min_ps = r.min_ps.data();
  b.presence_penalties = r.presence.data();
  b.frequency_penalties = r.frequency.data();
  b.repetition_penalties = r.repetition.data();
  b.penalty_starts = r.penalty_starts.data();
  b.penalty_token_ids = r.penalty_ids.data();
  b.penalty_output_counts = r.penalty_counts.data();
  b.penalty_in_prompt = r.in_prompt.data();
  b.bias_starts = r.bias_starts.data();
  b.bias_token_ids = r.bias_ids.data();
  b.bias_values = r.bias_values.data();
  b.num_top_logprobs = r.num_top.data();
  b.num_prompt_top_logprobs = r.num_prompt_top.data();
  b.prompt_next_token_ids = r.next_ids.data();
  b.bitmask_rows = rng() % 2 == 0 ? r.bitmask_rows.data() : nullptr;
  const bool any_drafts = std::any_of(r.num_drafts.begin(), r.num_drafts.end(), [](int32_t n) { return n > 0; });
  b.num_draft_tokens = any_drafts ? r.num_drafts.data() : nullptr;
  return r;
}

void test_batch_plan(std::mt19937_64& rng) {
  for (int32_t trial = 0; trial < 400; ++trial) {
    const int32_t num_groups = 1 + int32_t(rng() % 3);
    const int32_t block_size = trial % 2 == 0 ? 16 : 32;
    const bool decode_only = trial % 3 == 0;
    const bool pad = trial % 4 != 1;
    const RandomBatch r = random_batch(rng, num_groups, block_size, decode_only);
    const cd_batch& b = r.batch;
    const cuda::BatchPlan plan = cuda::plan_batch(b, num_groups, block_size, 256, pad);
    // A mixed batch whose chunks all happen to be one token long is a decode step too.
    const bool one_token_each = b.num_tokens == b.num_seqs;
    EXPECT(one_token_each || !decode_only, "trial %d: a decode batch with longer chunks", trial);
    EXPECT(plan.decode_only == one_token_each, "trial %d: decode_only %d", trial, plan.decode_only);
    const int32_t bucket = cuda::graph_bucket(b.num_tokens);
    const int32_t expected_padded = pad && one_token_each && bucket > 0 ? bucket : b.num_tokens;
    EXPECT(plan.padded_tokens == expected_padded, "trial %d: padded %d, expected %d", trial, plan.padded_tokens,
           expected_padded);
    EXPECT(plan.padded_tokens >= b.num_tokens, "trial %d: padding dropped tokens", trial);
    int32_t max_position = 0;
    for (int32_t s = 0; s < b.num_seqs; ++s) {
      for (int32_t t = b.query_starts[s]; t < b.query_starts[s + 1]; ++t) {
        EXPECT(plan.token_seqs[size_t(t)] == s && plan.positions[size_t(t)] == b.positions[t] &&
                   plan.token_ids[size_t(t)] == b.token_ids[t],
               "trial %d token %d: seq/position/id", trial, t);
        max_position = std::max(max_position, b.positions[t]);
        for (int32_t g = 0; g < num_groups; ++g) {
          const int32_t* table = b.block_tables + (size_t(g) * b.num_seqs + s) * b.max_blocks_per_seq;
          const int32_t position = b.positions[t];
          const int32_t slot = table[position / block_size] * block_size + position % block_size;
          EXPECT(plan.slots[size_t(g) * plan.padded_tokens + t] == slot, "trial %d token %d group %d: slot", trial, t, g);
          // The widened table holds the same entries where the attention kernel reads them.
          const int32_t* widened = plan.block_tables.data() + (size_t(g) * plan.table_rows + s) * plan.block_table_stride;
          EXPECT(widened[position / block_size] == table[position / block_size], "trial %d: widened table", trial);
        }
      }
    }
    for (int32_t t = b.num_tokens; t < plan.padded_tokens; ++t) {
      EXPECT(plan.positions[size_t(t)] == -1, "trial %d: padding token %d has a position", trial, t);
      for (int32_t g = 0; g < num_groups; ++g) {
        EXPECT(plan.slots[size_t(g) * plan.padded_tokens + t] == -1, "trial %d: padding token %d writes the cache", trial, t);
      }
    }
    const int32_t chunks = (max_position + 256) / 256;
    const bool graphed = pad && one_token_each && bucket > 0;
    EXPECT(plan.num_chunks == (graphed ? cuda::chunk_bucket(chunks) : chunks), "trial %d: chunks %d for max position %d",
           trial, plan.num_chunks, max_position);
    EXPECT(plan.block_table_stride * block_size >= std::min(plan.num_chunks * 256, r.max_blocks * block_size) ||
               !graphed,
           "trial %d: stride %d too narrow for %d chunks", trial, plan.block_table_stride, plan.num_chunks);
    // Outputs: flagged sequences in batch order, 1 + k rows with k proposals; device rows plus host
    // rows cover every sampled row, a sequence's rows all on one side.
    const OutputRows& outputs = plan.outputs;
    size_t row = 0;
    int32_t stride = 1;
    for (int32_t s = 0; s < b.num_seqs; ++s) {
      EXPECT(outputs.first_rows[size_t(s)] == int32_t(row), "trial %d seq %d: first row", trial, s);
      if (!(b.seq_flags[s] & (CD_SEQ_SAMPLE | CD_SEQ_RETURN_LOGITS))) continue;
      const int32_t drafts = b.num_draft_tokens == nullptr ? 0 : b.num_draft_tokens[s];
      stride = std::max(stride, drafts + 1);
      const bool penalized = b.repetition_penalties[s] != 1.0f;
      const bool plain = (b.bitmask_rows == nullptr || b.bitmask_rows[s] < 0) && b.num_top_logprobs[s] == 0 &&
                         b.bias_starts[s + 1] == b.bias_starts[s] &&
                         !(penalized && (b.penalty_starts[s + 1] > b.penalty_starts[s] || drafts > 0));
      const bool sampled = (b.seq_flags[s] & CD_SEQ_SAMPLE) != 0;
      const bool returned = (b.seq_flags[s] & CD_SEQ_RETURN_LOGITS) != 0;
      EXPECT(returned == std::binary_search(outputs.returned_rows.begin(), outputs.returned_rows.end(), int32_t(row)),
             "trial %d seq %d: returned row", trial, s);
      for (int32_t j = 0; j <= drafts; ++j, ++row) {
        EXPECT(row < outputs.seqs.size() && outputs.seqs[row] == s &&
                   outputs.tokens[row] == b.query_starts[s + 1] - 1 - drafts + j,
               "trial %d: output row %zu", trial, row);
        const bool on_device = std::find(plan.device_sampled_rows.begin(), plan.device_sampled_rows.end(),
                                         int32_t(row)) != plan.device_sampled_rows.end();
        const bool on_host = std::find(plan.host_rows.begin(), plan.host_rows.end(), int32_t(row)) != plan.host_rows.end();
        EXPECT(on_device == (sampled && plain), "trial %d seq %d: device sampling %d", trial, s, on_device);
        EXPECT(on_host == (returned || (sampled && !plain)), "trial %d seq %d: host row %d", trial, s, on_host);
      }
    }
    EXPECT(row == outputs.seqs.size(), "trial %d: %zu output rows, expected %zu", trial, outputs.seqs.size(), row);
    EXPECT(outputs.sample_stride == stride, "trial %d: sample stride %d, expected %d", trial, outputs.sample_stride, stride);
  }
}

// settle_proposals against the sequential rule: accept while each sample equals its proposal,
// keep the first sample that differs (or the one after the last proposal), clear the rest.
void test_settle_proposals(std::mt19937_64& rng) {
  for (int32_t trial = 0; trial < 300; ++trial) {
    RandomBatch r = random_batch(rng, 1, 16, false);
    const cd_batch& b = r.batch;
    if (b.num_draft_tokens == nullptr) continue;
    const cuda::BatchPlan plan = cuda::plan_batch(b, 1, 16, 256, false);
    const int32_t stride = plan.outputs.sample_stride;
    const size_t rows = size_t(b.num_seqs) * size_t(stride);
    std::vector<int32_t> tokens(rows, -1), accepted(size_t(b.num_seqs), -7), top_ids(rows * CD_MAX_TOP_LOGPROBS, 9);
    std::vector<float> logprobs(rows, 0.0f), top_logprobs(rows * CD_MAX_TOP_LOGPROBS, -1.0f);
    // Every row sampled independently: each either its proposal or some other token.
    for (int32_t s = 0; s < b.num_seqs; ++s) {
      if (!(b.seq_flags[s] & CD_SEQ_SAMPLE)) continue;
      const int32_t drafts = b.num_draft_tokens[s];
      const int32_t* proposals = b.token_ids + b.query_starts[s + 1] - drafts;
      for (int32_t j = 0; j <= drafts; ++j) {
        const bool agrees = j < drafts && rng() % 3 != 0;
        tokens[size_t(s) * stride + j] = agrees ? proposals[j] : 1000 + int32_t(rng() % 5);
        logprobs[size_t(s) * stride + j] = -0.5f;
      }
    }
    const std::vector<int32_t> sampled = tokens;
    cd_forward_output output{};
    output.sampled_token_ids = tokens.data();
    output.sampled_logprobs = logprobs.data();
    output.top_token_ids = top_ids.data();
    output.top_logprobs = top_logprobs.data();
    output.num_accepted_tokens = accepted.data();
    cuda::settle_proposals(b, stride, output);
    for (int32_t s = 0; s < b.num_seqs; ++s) {
      const int32_t drafts = b.num_draft_tokens[s];
      const int32_t* proposals = b.token_ids + b.query_starts[s + 1] - drafts;
      int32_t expected = 0;
      const bool sampling = (b.seq_flags[s] & CD_SEQ_SAMPLE) != 0;
      if (sampling) {
        for (int32_t j = 0; j < drafts && sampled[size_t(s) * stride + j] == proposals[j]; ++j) expected = j + 1;
      }
      EXPECT(accepted[size_t(s)] == expected, "trial %d seq %d: accepted %d, expected %d", trial, s, accepted[size_t(s)],
             expected);
      for (int32_t j = 0; j < stride; ++j) {
        const size_t row = size_t(s) * stride + j;
        const bool kept = sampling && j <= expected;
        EXPECT(tokens[row] == (kept ? sampled[row] : -1), "trial %d seq %d row %d: token %d", trial, s, j, tokens[row]);
        if (!kept && sampling) {
          EXPECT(logprobs[row] == 0.0f && top_ids[row * CD_MAX_TOP_LOGPROBS] == -1 &&
                     std::isnan(top_logprobs[row * CD_MAX_TOP_LOGPROBS]),
                 "trial %d seq %d row %d: not cleared", trial, s, j);
        }
      }
    }
  }
}

void test_graph_buckets_and_cache() {
  int32_t previous = 0;
  for (int32_t n = 1; n <= cuda::kLargestGraphBucket; ++n) {
    const int32_t bucket = cuda::graph_bucket(n);
    EXPECT(bucket >= n && bucket >= previous, "bucket of %d is %d", n, bucket);
    previous = bucket;
  }
  EXPECT(cuda::graph_bucket(cuda::kLargestGraphBucket + 1) == 0, "past the largest bucket");
  std::vector<int> destroyed;
  {
    cuda::GraphCache<int*> cache(2, [&destroyed](int* handle) { destroyed.push_back(*handle); });
    int a = 1, b = 2, c = 3;
    cache.insert({1, 1}, &a);
    cache.insert({2, 1}, &b);
    EXPECT(cache.find({1, 1}) == &a, "find a");  // a is now the most recent
    cache.insert({4, 2}, &c);                    // evicts b, the least recent
    EXPECT(destroyed.size() == 1 && destroyed[0] == 2, "evicted the least recently used");
    EXPECT(cache.find({2, 1}) == nullptr, "b gone");
    EXPECT(cache.find({4, 2}) == &c && cache.find({1, 1}) == &a, "a and c kept");
    cache.clear();
    EXPECT(destroyed.size() == 3 && cache.size() == 0, "clear destroys every graph");
  }
  EXPECT(destroyed.size() == 3, "nothing destroyed twice");
}

// The GPU group's shard plan: ranks tile the heads, KV heads (or share copies of one), MLP
// columns, segments and vocabulary exactly as the CPU runtime's TensorParallel does, a rank's
// heads and MLP columns are its segments' inputs, and shapes that do not split are refused by name.
cd_model_spec tp_spec(std::vector<cd_layer_spec>& layers, int32_t heads, int32_t kv_heads, int32_t head_dim,
                      int32_t intermediate, int32_t vocab) {
  cd_model_spec spec{};
  spec.num_heads = heads;
  spec.num_kv_heads = kv_heads;
  spec.head_dim = head_dim;
  spec.intermediate_size = intermediate;
  spec.vocab_size = vocab;
  spec.num_layers = int32_t(layers.size());
  spec.layers = layers.data();
  return spec;
}

std::string refusal(const cd_model_spec& spec, int32_t rank, int32_t size) {
  try {
    cuda::plan_rank(spec, rank, size);
  } catch (const Error& e) {
    return e.status() == CD_ERR_INVALID_ARGUMENT ? e.what() : std::string("wrong status: ") + e.what();
  }
  return "";
}

void test_tp_plan(std::mt19937_64& rng) {
  std::vector<cd_layer_spec> layers(2);
  for (int32_t trial = 0; trial < 200; ++trial) {
    const int32_t size = 1 << int32_t(rng() % 4);
    const int32_t kv_heads = int32_t(1 + rng() % 8);
    const int32_t heads = kv_heads * int32_t(1 + rng() % 4) * size;
    const int32_t head_dim = int32_t(8 * (1 + rng() % 16));
    const int32_t intermediate = size * int32_t(1 + rng() % 300);
    const int32_t vocab = int32_t(1 + rng() % 5000);
    const cd_model_spec spec = tp_spec(layers, heads, kv_heads, head_dim, intermediate, vocab);
    if (kv_heads % size != 0 && size % kv_heads != 0) {
      EXPECT(refusal(spec, 0, size).find("num_key_value_heads (" + std::to_string(kv_heads) + ")") != std::string::npos,
             "kv heads %d size %d: %s", kv_heads, size, refusal(spec, 0, size).c_str());
      continue;
    }
    const cuda::SegmentBounds o_bounds = cuda::segment_bounds(heads * head_dim);
    const cuda::SegmentBounds down_bounds = cuda::segment_bounds(intermediate);
    int32_t next_head = 0, next_column = 0, next_segment = 0, next_vocab = 0;
    std::vector<int32_t> kv_readers(size_t(kv_heads), 0);
    for (int32_t rank = 0; rank < size; ++rank) {
      const cuda::RankShard shard = cuda::plan_rank(spec, rank, size);
      EXPECT(shard.head_begin == next_head && shard.num_heads == heads / size, "heads of rank %d/%d", rank, size);
      EXPECT(shard.intermediate_begin == next_column && shard.intermediate_size == intermediate / size, "columns of %d/%d", rank, size);
      EXPECT(shard.first_segment == next_segment && shard.end_segment > shard.first_segment, "segments of %d/%d", rank, size);
      EXPECT(shard.first_segment == rank * kReductionSegments / size, "segments as the CPU's TensorParallel, %d/%d", rank, size);
      EXPECT(shard.vocab_begin == next_vocab && shard.vocab_end == int32_t(int64_t(vocab) * (rank + 1) / size), "vocab of %d/%d", rank, size);
      EXPECT(o_bounds[size_t(shard.first_segment)] == shard.head_begin * head_dim &&
                 o_bounds[size_t(shard.end_segment)] == (shard.head_begin + shard.num_heads) * head_dim,
             "rank %d/%d: o_proj segments [%d, %d) are not its heads", rank, size, shard.first_segment, shard.end_segment);
      EXPECT(down_bounds[size_t(shard.first_segment)] == shard.intermediate_begin &&
                 down_bounds[size_t(shard.end_segment)] == shard.intermediate_begin + shard.intermediate_size,
             "rank %d/%d: down_proj segments are not its columns", rank, size);
      // Every query head of the rank reads a KV head the rank holds.
      const int32_t group = heads / kv_heads;
      for (int32_t h = shard.head_begin; h < shard.head_begin + shard.num_heads; ++h) {
        EXPECT(h / group >= shard.kv_head_begin && h / group < shard.kv_head_begin + shard.num_kv_heads,
               "rank %d/%d: head %d reads kv head %d, not held", rank, size, h, h / group);
      }
      for (int32_t kv = shard.kv_head_begin; kv < shard.kv_head_begin + shard.num_kv_heads; ++kv) ++kv_readers[size_t(kv)];
      next_head += shard.num_heads;
      next_column += shard.intermediate_size;
      next_segment = shard.end_segment;
      next_vocab = shard.vocab_end;
    }
    EXPECT(next_head == heads && next_column == intermediate && next_segment == kReductionSegments && next_vocab == vocab,
           "size %d: the ranks do not tile the model", size);
    for (int32_t kv = 0; kv < kv_heads; ++kv) {
      const int32_t expected = kv_heads >= size ? 1 : size / kv_heads;
      EXPECT(kv_readers[size_t(kv)] == expected, "size %d: kv head %d held by %d ranks", size, kv, kv_readers[size_t(kv)]);
    }
  }
  const cd_model_spec odd = tp_spec(layers, 6, 2, 16, 64, 100);
  EXPECT(refusal(odd, 0, 4).find("does not divide num_attention_heads (6)") != std::string::npos, "%s", refusal(odd, 0, 4).c_str());
  EXPECT(refusal(odd, 0, 3).find("size 3 is not 1, 2, 4 or 8") != std::string::npos, "%s", refusal(odd, 0, 3).c_str());
  EXPECT(refusal(odd, 2, 2).find("rank 2 is outside a group of 2") != std::string::npos, "%s", refusal(odd, 2, 2).c_str());
  const cd_model_spec narrow = tp_spec(layers, 8, 2, 16, 60, 100);
  EXPECT(refusal(narrow, 0, 8).find("does not divide intermediate_size (60)") != std::string::npos, "%s", refusal(narrow, 0, 8).c_str());
  layers[1].num_experts = 4;
  const cd_model_spec moe = tp_spec(layers, 8, 2, 16, 64, 100);
  for (int32_t size : {1, 2, 4, 8}) EXPECT(refusal(moe, 0, size).empty(), "size %d refuses a MoE model: %s", size, refusal(moe, 0, size).c_str());
  // Whole experts per rank, the CPU's split (moe_parallel.h), tiled in rank order, owners agreeing.
  for (int32_t num_experts : {1, 3, 4, 8, 60, 128}) {
    for (int32_t size : {1, 2, 4, 8}) {
      const std::vector<int32_t> owners = cuda::expert_owners(size, num_experts);
      int32_t next = 0;
      for (int32_t rank = 0; rank < size; ++rank) {
        const cuda::ExpertRange held = cuda::held_experts(rank, size, num_experts);
        EXPECT(held.begin == next && held.begin == first_expert_of(rank, size, num_experts) && held.end >= held.begin,
               "experts %d size %d: rank %d holds [%d, %d)", num_experts, size, rank, held.begin, held.end);
        for (int32_t e = held.begin; e < held.end; ++e) EXPECT(owners[size_t(e)] == rank, "expert %d owned by %d", e, owners[size_t(e)]);
        next = held.end;
      }
      EXPECT(next == num_experts, "experts %d size %d: the ranks hold %d", num_experts, size, next);
    }
  }
}

// A MoE layer across a GPU group, composed on the host as the group runs it: every rank groups the
// slots alike (group_kernel), writes only its experts' rows at their grouped places in its slot of
// the gathered outputs (the rest poisoned), the in-place all-gather, then every rank selects each
// row from its expert's owner and combines a token's experts in slot order. Bitwise TP = 1's.
void test_expert_parallel_group(std::mt19937_64& rng) {
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  for (int32_t trial = 0; trial < 60; ++trial) {
    const int32_t num_experts = int32_t(1 + rng() % 20);
    const int32_t top_k = int32_t(1 + rng() % std::min(num_experts, 4));
    const int32_t tokens = int32_t(1 + rng() % 9);
    const int32_t hidden = int32_t(1 + rng() % 12);
    const int32_t slots = tokens * top_k;
    std::vector<int32_t> slot_experts(static_cast<size_t>(slots));
    std::vector<float> slot_weights(static_cast<size_t>(slots));
    for (int32_t t = 0; t < tokens; ++t) {
      std::vector<int32_t> all(static_cast<size_t>(num_experts));
      for (int32_t e = 0; e < num_experts; ++e) all[size_t(e)] = e;
      std::shuffle(all.begin(), all.end(), rng);
      for (int32_t k = 0; k < top_k; ++k) {
        slot_experts[size_t(t * top_k + k)] = all[size_t(k)];
        slot_weights[size_t(t * top_k + k)] = value(rng);
      }
    }
    // group_kernel's grouping: rows by expert, then slot order.
    std::vector<int32_t> starts(static_cast<size_t>(num_experts) + 1, 0), slot_rows(static_cast<size_t>(slots)), row_experts(static_cast<size_t>(slots));
    for (int32_t e : slot_experts) ++starts[size_t(e) + 1];
    for (int32_t e = 0; e < num_experts; ++e) starts[size_t(e) + 1] += starts[size_t(e)];
    std::vector<int32_t> next_row(starts.begin(), starts.end() - 1);
    for (int32_t slot = 0; slot < slots; ++slot) {
      const int32_t row = next_row[size_t(slot_experts[size_t(slot)])]++;
      slot_rows[size_t(slot)] = row;
      row_experts[size_t(row)] = slot_experts[size_t(slot)];
    }
    // An expert's output row: any function of (expert, row), Inf and -0 among them.
    std::vector<float> outputs(size_t(slots) * hidden);
    for (float& v : outputs) v = rng() % 40 == 0 ? -0.0f : rng() % 40 == 0 ? std::numeric_limits<float>::infinity() : value(rng);
    const auto combine = [&](const std::vector<float>& rows) {
      std::vector<float> hidden_out(size_t(tokens) * hidden);
      for (int32_t t = 0; t < tokens; ++t) {
        for (int32_t i = 0; i < hidden; ++i) {
          float acc = 0.0f;
          for (int32_t k = 0; k < top_k; ++k) {
            const int32_t slot = t * top_k + k;
            const float weighted = slot_weights[size_t(slot)] * rows[size_t(slot_rows[size_t(slot)]) * hidden + i];
            acc = k == 0 ? weighted : acc + weighted;
          }
          hidden_out[size_t(t) * hidden + i] = acc;
        }
      }
      return hidden_out;
    };
    const std::vector<float> at_1 = combine(outputs);
    for (int32_t size : {2, 4, 8}) {
      const size_t slot_floats = size_t(slots) * hidden;
      const std::vector<int32_t> owners = cuda::expert_owners(size, num_experts);
      std::vector<std::vector<float>> gathered(size_t(size), std::vector<float>(size_t(size) * slot_floats, std::nanf("")));
      for (int32_t rank = 0; rank < size; ++rank) {
        const cuda::ExpertRange held = cuda::held_experts(rank, size, num_experts);
        // The grouped GEMM over groups [held.begin, held.end) of starts: exactly those rows.
        for (int32_t row = starts[size_t(held.begin)]; row < starts[size_t(held.end)]; ++row) {
          std::memcpy(gathered[size_t(rank)].data() + size_t(rank) * slot_floats + size_t(row) * hidden,
                      outputs.data() + size_t(row) * hidden, size_t(hidden) * sizeof(float));
        }
      }
      const size_t bytes = slot_floats * sizeof(float);
      for (const cuda::GatherCopy& copy : cuda::gather_copies(size, bytes, true)) {
        std::memcpy(reinterpret_cast<uint8_t*>(gathered[size_t(copy.dst_rank)].data()) + copy.dst_offset_bytes,
                    gathered[size_t(copy.src_rank)].data() + size_t(copy.src_rank) * slot_floats, bytes);
      }
      for (int32_t rank = 0; rank < size; ++rank) {
        std::vector<float> selected(slot_floats);
        for (int32_t row = 0; row < slots; ++row) {
          const float* source = gathered[size_t(rank)].data() + size_t(owners[size_t(row_experts[size_t(row)])]) * slot_floats;
          std::memcpy(selected.data() + size_t(row) * hidden, source + size_t(row) * hidden, size_t(hidden) * sizeof(float));
        }
        const std::vector<float> got = combine(selected);
        EXPECT(std::memcmp(got.data(), at_1.data(), got.size() * sizeof(float)) == 0,
               "experts %d top_k %d tokens %d: rank %d of %d combines other bits than TP = 1", num_experts, top_k, tokens,
               rank, size);
      }
    }
  }
}

// The in-process group's copies, executed on host memory: every rank ends with every rank's bytes
// at their place, in place or not, and partials_layout's offsets are that all-gather's places.
void test_gather_copies(std::mt19937_64& rng) {
  for (int32_t size : {1, 2, 4, 8}) {
    for (bool in_place : {false, true}) {
      const cuda::PartialsLayout layout = cuda::partials_layout(size, int32_t(1 + rng() % 5), int32_t(1 + rng() % 40));
      const size_t bytes = layout.rank_bytes();
      EXPECT(layout.rank_offset_floats(size) == layout.total_floats(), "size %d: layout does not cover the segments", size);
      std::vector<std::vector<uint8_t>> mine(static_cast<size_t>(size), std::vector<uint8_t>(bytes));
      std::vector<std::vector<uint8_t>> all(static_cast<size_t>(size), std::vector<uint8_t>(bytes * size_t(size), 0xEE));
      for (int32_t r = 0; r < size; ++r) {
        for (uint8_t& b : mine[size_t(r)]) b = uint8_t(rng());
        if (in_place) std::memcpy(all[size_t(r)].data() + layout.rank_offset_floats(r) * sizeof(float), mine[size_t(r)].data(), bytes);
      }
      const std::vector<cuda::GatherCopy> copies = cuda::gather_copies(size, bytes, in_place);
      EXPECT(copies.size() == size_t(size) * size_t(in_place ? size - 1 : size), "size %d: %zu copies", size, copies.size());
      for (const cuda::GatherCopy& copy : copies) {
        std::memcpy(all[size_t(copy.dst_rank)].data() + copy.dst_offset_bytes, mine[size_t(copy.src_rank)].data(), bytes);
      }
      for (int32_t r = 0; r < size; ++r) {
        for (int32_t q = 0; q < size; ++q) {
          EXPECT(std::memcmp(all[size_t(r)].data() + layout.rank_offset_floats(q) * sizeof(float), mine[size_t(q)].data(), bytes) == 0,
                 "size %d in_place %d: rank %d lacks rank %d's partials", size, int(in_place), r, q);
        }
      }
    }
  }
}

// The GPU's fold is the CPU's combine_segments, bit for bit, specials included.
void test_segment_fold(std::mt19937_64& rng) {
  ThreadPool pool(1);
  const float specials[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min(), 3.0e38f,
                            -3.0e38f, 1.0f, -1.0f};
  for (int32_t trial = 0; trial < 50; ++trial) {
    const int32_t rows = int32_t(1 + rng() % 6);
    const int32_t n = int32_t(1 + rng() % 70);
    const size_t partial_size = size_t(rows) * n;
    std::vector<float> partials(kReductionSegments * partial_size);
    std::uniform_real_distribution<float> value(-1000.0f, 1000.0f);
    for (float& p : partials) p = rng() % 8 == 0 ? specials[rng() % 10] : value(rng) * std::ldexp(1.0f, int(rng() % 40) - 20);
    for (bool accumulate : {false, true}) {
      std::vector<float> y_cpu(partial_size), y_gpu(partial_size);
      for (size_t i = 0; i < partial_size; ++i) y_cpu[i] = y_gpu[i] = value(rng);
      combine_segments(pool, partials.data(), rows, n, y_cpu.data(), size_t(n), accumulate);
      for (size_t i = 0; i < partial_size; ++i) {
        const float sum = cuda::fold_segments(partials.data() + i, partial_size);
        y_gpu[i] = accumulate ? y_gpu[i] + sum : sum;
      }
      // Bitwise, but any NaN equals any NaN (x86 and the GPU give NaNs different payloads).
      for (size_t i = 0; i < partial_size; ++i) {
        const bool same = std::memcmp(&y_cpu[i], &y_gpu[i], sizeof(float)) == 0 || (std::isnan(y_cpu[i]) && std::isnan(y_gpu[i]));
        EXPECT(same, "trial %d (accumulate %d) element %zu: fold_segments %a, combine_segments %a", trial,
               int(accumulate), i, double(y_gpu[i]), double(y_cpu[i]));
      }
    }
  }
}

// A row-parallel matmul as the GPU group runs it, on the host: each rank's segments read their
// inputs unpacked or from packed slots (whole k steps, as the GEMM reads them, zero weights past
// the segment), the partials meet by gather_copies at partials_layout's places, and every rank's
// fold gives TP = 1's bits at every size.
void test_row_parallel_group(std::mt19937_64& rng) {
  constexpr int32_t kStep = 32;
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (int32_t trial = 0; trial < 40; ++trial) {
    const int32_t k = trial % 4 == 0 ? 256 * int32_t(1 + rng() % 3) : int32_t(8 * (1 + rng() % 60));
    const int32_t n = int32_t(1 + rng() % 24);
    const int32_t rows = int32_t(1 + rng() % 4);
    const cuda::SegmentBounds bounds = cuda::segment_bounds(k);
    const cuda::SegmentInputs inputs = cuda::segment_inputs(bounds, kStep);
    EXPECT(inputs.packed == (k % (kStep * kReductionSegments) != 0), "k %d: packed %d", k, int(inputs.packed));
    std::vector<float> w(size_t(n) * k), x(size_t(rows) * k);
    for (float& v : w) v = value(rng);
    for (float& v : x) v = rng() % 50 == 0 ? std::numeric_limits<float>::infinity() : value(rng);
    std::vector<float> folded_at_1;
    for (int32_t size : {1, 2, 4, 8}) {
      const cuda::PartialsLayout layout = cuda::partials_layout(size, rows, n);
      std::vector<std::vector<float>> gathered(size_t(size), std::vector<float>(layout.total_floats(), -7.0f));
      for (int32_t rank = 0; rank < size; ++rank) {
        const int32_t first = rank * kReductionSegments / size;
        const int32_t end = (rank + 1) * kReductionSegments / size;
        const int32_t local_k = bounds[size_t(end)] - bounds[size_t(first)];
        // The rank's inputs as its buffers hold them: local columns, then the row's zeroed padding.
        const int32_t stride = (local_k + kStep - 1) / kStep * kStep + kStep;
        std::vector<float> local(size_t(rows) * stride, 0.0f);
        for (int32_t t = 0; t < rows; ++t) {
          std::copy_n(x.data() + size_t(t) * k + bounds[size_t(first)], local_k, local.data() + size_t(t) * stride);
        }
        std::vector<float> packed;
        int32_t x_stride = stride;
        if (inputs.packed) {
          x_stride = (end - first) * inputs.slot_columns;
          packed.assign(size_t(rows) * x_stride, -5.0f);
          for (int32_t t = 0; t < rows; ++t) {
            for (int32_t j = 0; j < x_stride; ++j) {
              const int32_t column = cuda::packed_source_column(bounds.data(), first, inputs.slot_columns, j);
              packed[size_t(t) * x_stride + j] = column >= 0 ? local[size_t(t) * stride + column] : 0.0f;
            }
          }
        }
        for (int32_t s = first; s < end; ++s) {
          const int32_t segment_k = bounds[size_t(s) + 1] - bounds[size_t(s)];
          const int32_t k_padded = (segment_k + kStep - 1) / kStep * kStep;
          const int32_t column = inputs.packed ? (s - first) * inputs.slot_columns : bounds[size_t(s)] - bounds[size_t(first)];
          if (!inputs.packed) {
            EXPECT(k_padded == segment_k && column % 8 == 0, "k %d segment %d: unpacked reads past it or misaligned", k, s);
          }
          const std::vector<float>& source = inputs.packed ? packed : local;
          float* partial = gathered[size_t(rank)].data() + size_t(s) * rows * n;
          for (int32_t t = 0; t < rows; ++t) {
            for (int32_t o = 0; o < n; ++o) {
              float sum = 0.0f;  // one chain over the segment's whole k steps, zero weights past it
              for (int32_t i = 0; i < k_padded; ++i) {
                const float weight = i < segment_k ? w[size_t(o) * k + bounds[size_t(s)] + i] : 0.0f;
                sum += source[size_t(t) * x_stride + column + i] * weight;
              }
              partial[size_t(t) * n + o] = segment_k == 0 ? 0.0f : sum;
            }
          }
        }
      }
      const size_t bytes = layout.rank_bytes();
      for (const cuda::GatherCopy& copy : cuda::gather_copies(size, bytes, true)) {
        std::memcpy(reinterpret_cast<uint8_t*>(gathered[size_t(copy.dst_rank)].data()) + copy.dst_offset_bytes,
                    gathered[size_t(copy.src_rank)].data() + layout.rank_offset_floats(copy.src_rank), bytes);
      }
      for (int32_t rank = 0; rank < size; ++rank) {
        std::vector<float> folded(size_t(rows) * n);
        for (size_t i = 0; i < folded.size(); ++i) folded[i] = cuda::fold_segments(gathered[size_t(rank)].data() + i, folded.size());
        if (size == 1) folded_at_1 = folded;
        EXPECT(std::memcmp(folded.data(), folded_at_1.data(), folded.size() * sizeof(float)) == 0,
               "k %d n %d: rank %d of %d folds other bits than TP = 1", k, n, rank, size);
      }
    }
  }
}

// The group driver's queue (tp_schedule): per rank, TP = 1's order of phases; each all-gather
// after every rank's segments of its slab and before any rank's fold of them.
void test_tp_schedule(std::mt19937_64& rng) {
  using cuda::TpOpKind;
  for (int32_t size : {1, 2, 4, 8}) {
    const int32_t layers = int32_t(1 + rng() % 4);
    const int32_t slabs = int32_t(1 + rng() % 3);
    std::vector<int32_t> layer_experts(static_cast<size_t>(layers));
    int32_t moe_layers = 0;
    for (int32_t& experts : layer_experts) {
      experts = rng() % 2 == 0 ? 0 : int32_t(1 + rng() % 16);
      moe_layers += experts > 0 ? 1 : 0;
    }
    const std::vector<cuda::TpOp> ops = cuda::tp_schedule(layer_experts, size, slabs);
    std::vector<cuda::TpOp> single;  // run_layers' order for one model
    single.push_back({TpOpKind::kEmbed, 0, -1, -1});
    for (int32_t layer = 0; layer < layers; ++layer) {
      single.push_back({TpOpKind::kAttention, 0, layer, -1});
      for (int32_t slab = 0; slab < slabs; ++slab) {
        single.push_back({TpOpKind::kAttentionSegments, 0, layer, slab});
        single.push_back({TpOpKind::kFoldAttention, 0, layer, slab});
      }
      single.push_back({TpOpKind::kMlp, 0, layer, -1});
      if (layer_experts[size_t(layer)] > 0) {
        single.push_back({TpOpKind::kCombineExperts, 0, layer, -1});
        continue;
      }
      for (int32_t slab = 0; slab < slabs; ++slab) {
        single.push_back({TpOpKind::kMlpSegments, 0, layer, slab});
        single.push_back({TpOpKind::kFoldMlp, 0, layer, slab});
      }
    }
    single.push_back({TpOpKind::kLogitsSlice, 0, -1, -1});
    for (int32_t rank = 0; rank < size; ++rank) {
      size_t next = 0;
      for (const cuda::TpOp& op : ops) {
        if (op.rank != rank) continue;
        const bool same = next < single.size() && single[next].kind == op.kind && single[next].layer == op.layer &&
                          single[next].slab == op.slab;
        EXPECT(same, "size %d rank %d: op %zu out of run_layers' order", size, rank, next);
        ++next;
      }
      EXPECT(next == single.size(), "size %d rank %d: %zu ops, run_layers has %zu", size, rank, next, single.size());
    }
    int32_t gathers = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].rank >= 0) continue;
      ++gathers;
      const bool logits = ops[i].kind == TpOpKind::kGatherLogits;
      const bool attention = ops[i].kind == TpOpKind::kGatherAttentionPartials;
      if (ops[i].kind == TpOpKind::kGatherExpertOutputs) {
        EXPECT(layer_experts[size_t(ops[i].layer)] > 0, "size %d: an expert gather in dense layer %d", size, ops[i].layer);
        for (size_t j = 0; j < ops.size(); ++j) {
          if (ops[j].layer != ops[i].layer) continue;
          if (ops[j].kind == TpOpKind::kMlp) EXPECT(j < i, "size %d: rank %d's experts enqueued after their gather", size, ops[j].rank);
          if (ops[j].kind == TpOpKind::kCombineExperts) EXPECT(j > i, "size %d: rank %d combines before the gather", size, ops[j].rank);
        }
        continue;
      }
      EXPECT(logits == (i + 1 == ops.size()), "size %d: the logits' gather is not last", size);
      for (size_t j = 0; j < ops.size(); ++j) {
        const cuda::TpOp& op = ops[j];
        const bool same_slab = op.layer == ops[i].layer && op.slab == ops[i].slab;
        const bool produces = logits ? op.kind == TpOpKind::kLogitsSlice
                                     : op.kind == (attention ? TpOpKind::kAttentionSegments : TpOpKind::kMlpSegments) &&
                                           same_slab;
        const bool reads = !logits && op.kind == (attention ? TpOpKind::kFoldAttention : TpOpKind::kFoldMlp) && same_slab;
        if (produces) EXPECT(j < i, "size %d: rank %d's partials enqueued after their gather", size, op.rank);
        if (reads) EXPECT(j > i, "size %d: rank %d folds before the gather", size, op.rank);
        // The partials of one slab are the next's buffer: no rank's next segments before this fold.
        if (!logits && j > i && reads) {
          for (size_t m = i + 1; m < j; ++m) {
            EXPECT(ops[m].kind != TpOpKind::kAttentionSegments && ops[m].kind != TpOpKind::kMlpSegments,
                   "size %d: segments enqueued between a gather and its folds", size);
          }
        }
      }
    }
    EXPECT(gathers == layers * slabs + (layers - moe_layers) * slabs + moe_layers + 1, "size %d: %d gathers", size, gathers);
  }
}

// NCCL opens at run time or says why not, naming the file; a library without NCCL's entry points
// is refused by the first one missing.
void test_nccl_loader() {
  std::string why;
  EXPECT(cuda::open_nccl("libnccl-absent.so.2", why) == nullptr, "an absent library opened");
  EXPECT(why.find("NCCL is not available: dlopen libnccl-absent.so.2: ") == 0, "%s", why.c_str());
  why.clear();
  EXPECT(cuda::open_nccl("libc.so.6", why) == nullptr, "libc passed for NCCL");
  EXPECT(why == "NCCL is not available: libc.so.6 opened, but it has no ncclGetVersion", "%s", why.c_str());
  why.clear();
  const cuda::NcclLibrary* nccl = cuda::open_nccl("libnccl.so.2", why);
  if (nccl != nullptr) {
    EXPECT(nccl->version >= 20000, "libnccl.so.2 reports version %d", nccl->version);
    std::printf("nccl: libnccl.so.2 %d\n", nccl->version);
  } else {
    EXPECT(why.find("NCCL is not available: dlopen libnccl.so.2: ") == 0, "%s", why.c_str());
    std::printf("nccl: %s\n", why.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1;
  std::mt19937_64 rng(seed);
  test_candidate_key(rng);
  test_sampler_agreement(rng);
  test_batch_plan(rng);
  test_settle_proposals(rng);
  test_graph_buckets_and_cache();
  test_tp_plan(rng);
  test_gather_copies(rng);
  test_segment_fold(rng);
  test_row_parallel_group(rng);
  test_tp_schedule(rng);
  test_expert_parallel_group(rng);
  test_nccl_loader();
  std::printf("%s (%d failures, seed %llu)\n", failures == 0 ? "ok" : "FAILED", failures, (unsigned long long)seed);
  return failures == 0 ? 0 : 1;
}
