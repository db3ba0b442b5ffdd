// The GPU check: one program over conduit_runtime's C API (no Node), run on a lent GPU machine
// (native/README.md, "CUDA backend", has the command). It prints a table and writes JSON:
//   1. the GPU and its ceilings: streaming-read bandwidth, bf16 mma.sync peak;
//   2. GPU logits against the CPU runtime's on models/conduit-tiny and a random model of each
//      family (spec files from tools/gpu-check-prepare.ts), bf16 tolerance 2e-2 of max |logit|;
//   3. bitwise batch invariance on the GPU: a target's logits alone, chunked by 7, and among
//      companions (decode steps in different CUDA-graph buckets, prefill chunks);
//   4. the device sampler against the host's CPU sampler on the same logits;
//   5. speculative verification's rows against plain decoding's (tokens and logprobs, bitwise);
//      the MoE families' batch invariance;
//   6. tensor parallelism: the in-process group's all-gather (2 and 8 ranks sharing the GPU, each
//      on its own stream; NCCL where ranks have GPUs of their own), bitwise, and its time for one
//      decode step's o_proj partials; then sharded models (TP = 2 and 4, every rank on this GPU)
//      against the whole one: logits and sampled tokens bitwise;
//   7. decode tokens/s at batch 1, 64 and 256 (512-token contexts) and prefill tokens/s of a
//      2048-token prompt on a Llama-3-8B-shaped model with random weights drawn on the device, as
//      fractions of the measured ceilings (MBU, MFU) and of the datasheet's.
// Usage: gpu_check SPEC_DIR [OUT_JSON] [--skip-perf]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "conduit.h"
#include "spec_file.h"

using conduit::check::SpecFile;

namespace {

int g_failures = 0;
std::string g_json = "{";

void json_field(const std::string& key, const std::string& value_json) {
  if (g_json.size() > 1) g_json += ",";
  g_json += "\"" + key + "\":" + value_json;
}
std::string num(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.6g", value);
  return std::isfinite(value) ? buffer : "null";
}
std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) out += c == '"' || c == '\\' ? std::string("\\") + c : std::string(1, c);
  return out + "\"";
}

void check(bool ok, const std::string& what) {
  std::printf("  %-4s %s\n", ok ? "ok" : "FAIL", what.c_str());
  if (!ok) ++g_failures;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// One sequence's part of a step.
struct Chunk {
  std::vector<int32_t> tokens;
  int32_t first_position;
  std::vector<int32_t> blocks;  // [groups * max_blocks]: group g's table at g * max_blocks
  uint8_t flags = CD_SEQ_SAMPLE | CD_SEQ_RETURN_LOGITS;
  float temperature = 0.0f, top_p = 1.0f, min_p = 0.0f;
  int32_t top_k = 0, top_logprobs = 0, output_index = 0;
  uint64_t seed = 0;
  int32_t num_drafts = 0;  // the last num_drafts tokens are proposals to verify
};

// A cd_batch and its outputs, built from chunks.
struct Step {
  std::vector<int32_t> token_ids, positions, query_starts, block_tables, top_ks, output_indices, penalty_starts, bias_starts,
      num_top, num_prompt_top, next_ids, top_ids, sampled, num_drafts, num_accepted;
  std::vector<uint8_t> flags;
  std::vector<float> temperatures, top_ps, min_ps, zeros, ones, logits, sampled_logprobs, top_logprobs;
  std::vector<uint64_t> seeds;
  cd_batch batch{};
  cd_forward_output output{};
  int32_t num_logit_rows = 0;
  int32_t sample_stride = 1;  // sampled rows per sequence: 1 + the most proposals

  Step(const std::vector<Chunk>& chunks, int32_t groups, int32_t max_blocks, int32_t vocab) {
    query_starts.push_back(0);
    for (const Chunk& c : chunks) {
      for (size_t i = 0; i < c.tokens.size(); ++i) {
        token_ids.push_back(c.tokens[i]);
        positions.push_back(c.first_position + int32_t(i));
      }
      query_starts.push_back(int32_t(token_ids.size()));
      flags.push_back(c.flags);
      temperatures.push_back(c.temperature);
      top_ps.push_back(c.top_p);
      min_ps.push_back(c.min_p);
      top_ks.push_back(c.top_k);
      seeds.push_back(c.seed);
      output_indices.push_back(c.output_index);
      num_top.push_back(c.top_logprobs);
      num_prompt_top.push_back(0);
      next_ids.push_back(-1);
      if (c.flags & CD_SEQ_RETURN_LOGITS) ++num_logit_rows;
      num_drafts.push_back(c.num_drafts);
      sample_stride = std::max(sample_stride, c.num_drafts + 1);
    }
    const size_t n = chunks.size();
    block_tables.assign(size_t(groups) * n * size_t(max_blocks), 0);
    for (int32_t g = 0; g < groups; ++g) {
      for (size_t s = 0; s < n; ++s) {
        std::copy_n(chunks[s].blocks.begin() + size_t(g) * max_blocks, max_blocks,
                    block_tables.begin() + (size_t(g) * n + s) * max_blocks);
      }
    }
    zeros.assign(n, 0.0f);
    ones.assign(n, 1.0f);
    penalty_starts.assign(n + 1, 0);
    bias_starts.assign(n + 1, 0);
    logits.assign(size_t(num_logit_rows) * vocab, 0.0f);
    const size_t rows = n * size_t(sample_stride);
    sampled.assign(rows, -1);
    sampled_logprobs.assign(rows, 0.0f);
    top_ids.assign(rows * CD_MAX_TOP_LOGPROBS, -1);
    top_logprobs.assign(rows * CD_MAX_TOP_LOGPROBS, 0.0f);
    num_accepted.assign(n, -1);
    batch.num_seqs = int32_t(n);
    batch.num_tokens = int32_t(token_ids.size());
    batch.token_ids = token_ids.data();
    batch.positions = positions.data();
    batch.query_starts = query_starts.data();
    batch.max_blocks_per_seq = max_blocks;
    batch.block_tables = block_tables.data();
    batch.seq_flags = flags.data();
    batch.temperatures = temperatures.data();
    batch.top_ps = top_ps.data();
    batch.top_ks = top_ks.data();
    batch.seeds = seeds.data();
    batch.output_indices = output_indices.data();
    batch.min_ps = min_ps.data();
    batch.presence_penalties = zeros.data();
    batch.frequency_penalties = zeros.data();
    batch.repetition_penalties = ones.data();
    batch.penalty_starts = penalty_starts.data();
    batch.bias_starts = bias_starts.data();
    batch.num_top_logprobs = num_top.data();
    batch.num_prompt_top_logprobs = num_prompt_top.data();
    batch.prompt_next_token_ids = next_ids.data();
    output.sampled_token_ids = sampled.data();
    output.sampled_logprobs = sampled_logprobs.data();
    output.logits = logits.data();
    output.top_token_ids = top_ids.data();
    output.top_logprobs = top_logprobs.data();
    if (sample_stride > 1) {
      batch.num_draft_tokens = num_drafts.data();
      output.num_accepted_tokens = num_accepted.data();
    }
  }
};

struct Waiter {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  cd_status status = CD_OK;
  std::string error;
};

void on_done(void* user, cd_status status, const char* error) {
  Waiter* w = static_cast<Waiter*>(user);
  std::lock_guard<std::mutex> lock(w->mutex);
  w->status = status;
  w->error = error != nullptr ? error : "";
  w->done = true;
  w->done_cv.notify_all();
}

void run(cd_model* model, Step& step) {
  Waiter waiter;
  cd_model_forward(model, &step.batch, &step.output, on_done, &waiter);
  std::unique_lock<std::mutex> lock(waiter.mutex);
  waiter.done_cv.wait(lock, [&] { return waiter.done; });
  if (waiter.status != CD_OK) throw std::runtime_error("forward failed: " + waiter.error);
}

cd_model* load(const cd_model_spec& spec, cd_device device, int32_t blocks, bool quantized, uint64_t synthetic_seed = 0,
               int32_t tp_size = 1) {
  cd_load_options options{};
  options.weight_dtype = CD_DTYPE_BF16;
  options.quantization = quantized ? CD_QUANTIZATION_INT8 : CD_QUANTIZATION_NONE;
  options.kv_cache_dtype = CD_DTYPE_BF16;
  options.num_kv_blocks = blocks;
  options.block_size_tokens = 16;
  options.num_threads = 8;
  options.kernel = CD_KERNEL_AUTO;
  options.device = device;
  options.tp_size = tp_size;
  cd_model* model = nullptr;
  char error[1024] = {};
  const cd_status status = synthetic_seed != 0 ? cd_model_load_synthetic(&spec, &options, synthetic_seed, &model, error, sizeof error)
                                               : cd_model_load(&spec, &options, &model, error, sizeof error);
  if (status != CD_OK) throw std::runtime_error(error);
  return model;
}

// Blocks [first, first + count) in each group's own range.
std::vector<int32_t> blocks_for(int32_t groups, int32_t max_blocks, int32_t first, int32_t blocks_per_group) {
  std::vector<int32_t> table(size_t(groups) * max_blocks);
  for (int32_t g = 0; g < groups; ++g) {
    for (int32_t b = 0; b < max_blocks; ++b) table[size_t(g) * max_blocks + b] = g * blocks_per_group + first + b;
  }
  return table;
}

double relative_error(const float* got, const float* want, size_t n) {
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < n; ++i) {
    max_diff = std::max(max_diff, std::fabs(double(got[i]) - double(want[i])));
    max_ref = std::max(max_ref, std::fabs(double(want[i])));
  }
  return max_ref == 0 ? max_diff : max_diff / max_ref;
}

std::vector<int32_t> random_tokens(std::mt19937& rng, int32_t count, int32_t vocab) {
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  for (int32_t& t : tokens) t = int32_t(rng() % uint32_t(vocab));
  return tokens;
}

// 2. GPU vs CPU: a 40-token prefill, then 6 greedy decode steps fed the GPU's tokens.
void compare_with_cpu(const SpecFile& file, const std::string& name, std::mt19937& rng, std::string& rows_json) {
  const cd_model_spec& spec = file.spec;
  const int32_t groups = spec.num_kv_groups, max_blocks = 8, per_group = 16;
  cd_model* gpu = nullptr;
  try {
    gpu = load(spec, CD_DEVICE_CUDA, groups * per_group, false);
  } catch (const std::exception& e) {
    std::printf("  --   %s: not on the GPU: %s\n", name.c_str(), e.what());
    rows_json += (rows_json.empty() ? "" : ",") + std::string("{\"model\":") + quoted(name) + ",\"refused\":" + quoted(e.what()) + "}";
    return;
  }
  cd_model* cpu = load(spec, CD_DEVICE_CPU, groups * per_group, false);
  const int32_t vocab = spec.vocab_size;
  Chunk chunk{random_tokens(rng, 40, vocab), 0, blocks_for(groups, max_blocks, 0, per_group)};
  double worst = 0;
  int32_t same_tokens = 0;
  for (int32_t step = 0; step < 7; ++step) {
    Step on_gpu({chunk}, groups, max_blocks, vocab);
    Step on_cpu({chunk}, groups, max_blocks, vocab);
    run(gpu, on_gpu);
    run(cpu, on_cpu);
    worst = std::max(worst, relative_error(on_gpu.logits.data(), on_cpu.logits.data(), size_t(vocab)));
    same_tokens += on_gpu.sampled[0] == on_cpu.sampled[0] ? 1 : 0;
    chunk.first_position += int32_t(chunk.tokens.size());
    chunk.tokens = {on_gpu.sampled[0]};
  }
  check(worst <= 2e-2, name + ": GPU logits vs CPU, max |diff| / max |logit| = " + num(worst) + " (bf16 bound 2e-2); greedy tokens equal " +
                           std::to_string(same_tokens) + "/7");
  rows_json += (rows_json.empty() ? "" : ",") + std::string("{\"model\":") + quoted(name) + ",\"relative_error\":" + num(worst) +
               ",\"same_greedy_tokens\":" + std::to_string(same_tokens) + "}";
  cd_model_free(gpu);
  cd_model_free(cpu);
}

// 3. A target's logits on the GPU, bitwise: alone, prompt chunked by 7, and among companions
// whose number moves the decode steps across CUDA-graph buckets (and out of them).
void batch_invariance(const SpecFile& file, const std::string& label, std::mt19937& rng) {
  const cd_model_spec& spec = file.spec;
  const int32_t groups = spec.num_kv_groups, vocab = spec.vocab_size;
  const int32_t max_blocks = 8, per_group = 8 * 300;
  cd_model* gpu = load(spec, CD_DEVICE_CUDA, groups * per_group, false);
  const std::vector<int32_t> prompt = random_tokens(rng, 50, vocab);
  const int32_t decode_steps = 8;
  // Returns the target's logits at the prompt's end and after each decode step.
  const auto target_run = [&](int32_t chunk_size, const std::vector<int32_t>& companions_per_step) {
    std::vector<std::vector<float>> rows;
    std::vector<int32_t> tokens = prompt;
    int32_t position = 0;
    const std::vector<int32_t> table = blocks_for(groups, max_blocks, 0, per_group);
    int32_t step = 0;
    const auto companions = [&](int32_t count) {
      std::vector<Chunk> list;
      for (int32_t c = 0; c < count; ++c) {
        const int32_t context = 1 + int32_t(rng() % 100);
        const bool prefill = c % 5 == 0;
        const int32_t length = prefill ? std::min(context, 1 + int32_t(rng() % 20)) : 1;
        list.push_back(Chunk{random_tokens(rng, length, vocab), context - length,
                             blocks_for(groups, max_blocks, (c + 1) * max_blocks, per_group)});
      }
      return list;
    };
    while (position < int32_t(prompt.size())) {
      const int32_t length = std::min(chunk_size, int32_t(prompt.size()) - position);
      Chunk target{std::vector<int32_t>(tokens.begin() + position, tokens.begin() + position + length), position, table};
      std::vector<Chunk> chunks = companions(companions_per_step[size_t(step++ % companions_per_step.size())]);
      chunks.insert(chunks.begin() + chunks.size() / 2, target);
      Step s(chunks, groups, max_blocks, vocab);
      run(gpu, s);
      position += length;
      if (position == int32_t(prompt.size())) {
        const size_t row = chunks.size() / 2;  // every chunk returns logits
        rows.emplace_back(s.logits.begin() + row * vocab, s.logits.begin() + (row + 1) * vocab);
        tokens.push_back(s.sampled[row]);
      }
    }
    for (int32_t d = 0; d < decode_steps; ++d) {
      Chunk target{{tokens.back()}, position, table};
      std::vector<Chunk> chunks = companions(companions_per_step[size_t(step++ % companions_per_step.size())]);
      // Decode-only companions here, so the step is graph-captured.
      for (Chunk& c : chunks) {
        c.first_position += int32_t(c.tokens.size()) - 1;
        c.tokens.resize(1);
      }
      chunks.insert(chunks.begin(), target);
      Step s(chunks, groups, max_blocks, vocab);
      run(gpu, s);
      rows.emplace_back(s.logits.begin(), s.logits.begin() + vocab);
      tokens.push_back(s.sampled[0]);
      ++position;
    }
    return rows;
  };
  const auto alone = target_run(1000, {0});
  const auto chunked = target_run(7, {0});
  const auto crowded = target_run(1000, {63, 5, 200, 17, 0, 255, 90});
  const auto same = [&](const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0) return false;
    }
    return true;
  };
  check(same(alone, chunked), label + ": GPU batch invariance: prompt in one chunk == chunks of 7 (bitwise, 9 rows of logits)");
  check(same(alone, crowded), label + ": GPU batch invariance: alone == among 0..255 companions, graph buckets 1..256 (bitwise)");
  json_field("batch_invariance_" + label, std::string("{\"chunked\":") + (same(alone, chunked) ? "true" : "false") +
                                              ",\"crowded\":" + (same(alone, crowded) ? "true" : "false") + "}");
  cd_model_free(gpu);
}

// 4. The device sampler and the host's CPU sampler on the same logits (a top logprob sends a
// sequence to the host sampler): the same tokens for 64 seeds.
void sampler_agreement(const SpecFile& file, std::mt19937& rng) {
  const cd_model_spec& spec = file.spec;
  const int32_t groups = spec.num_kv_groups, vocab = spec.vocab_size, max_blocks = 4, per_group = 4 * 64;
  cd_model* gpu = load(spec, CD_DEVICE_CUDA, groups * per_group, false);
  std::vector<Chunk> chunks;
  for (int32_t s = 0; s < 64; ++s) {
    Chunk c{random_tokens(rng, 12, vocab), 0, blocks_for(groups, max_blocks, s * max_blocks, per_group)};
    c.temperature = 0.5f + 0.02f * float(s);
    c.top_p = s % 2 == 0 ? 0.9f : 1.0f;
    c.top_k = s % 3 == 0 ? 20 : 0;
    c.min_p = s % 4 == 1 ? 0.05f : 0.0f;
    c.seed = rng();
    c.output_index = s;
    chunks.push_back(c);
  }
  Step on_device(chunks, groups, max_blocks, vocab);
  run(gpu, on_device);
  for (Chunk& c : chunks) c.top_logprobs = 1;
  Step on_host(chunks, groups, max_blocks, vocab);
  run(gpu, on_host);
  int32_t same = 0;
  for (size_t s = 0; s < chunks.size(); ++s) same += on_device.sampled[s] == on_host.sampled[s] ? 1 : 0;
  check(same == 64, "device sampler == CPU sampler on the same logits: " + std::to_string(same) + "/64 draws");
  json_field("sampler_agreement", std::to_string(same) + "/64");
  cd_model_free(gpu);
}

// 5. Speculative verification equals plain decoding: a prompt decoded plainly for 6 outputs, then
// verified from the prompt with proposals (all right; right then wrong), seeded draws on the
// device sampler and on the host's (a top logprob sends it there): the verified rows are plain
// decoding's tokens and logprobs bitwise, and the accepted counts are the agreeing prefix.
void speculative_verification(const SpecFile& file, std::mt19937& rng) {
  const cd_model_spec& spec = file.spec;
  const int32_t groups = spec.num_kv_groups, vocab = spec.vocab_size, max_blocks = 4, per_group = 4 * 4;
  cd_model* gpu = load(spec, CD_DEVICE_CUDA, groups * per_group, false);
  const std::vector<int32_t> prompt = random_tokens(rng, 20, vocab);
  int32_t cases = 0, agreeing = 0;
  for (int32_t settings = 0; settings < 3; ++settings) {
    Chunk base{prompt, 0, blocks_for(groups, max_blocks, 0, per_group)};
    base.flags = CD_SEQ_SAMPLE;
    base.temperature = settings == 0 ? 0.0f : 0.9f;
    base.top_logprobs = settings == 2 ? 1 : 0;
    base.seed = rng();
    // Plain decoding: six outputs, output indices 0..5.
    std::vector<int32_t> plain;
    std::vector<float> plain_logprobs;
    Chunk chunk = base;
    for (int32_t i = 0; i < 6; ++i) {
      Step step({chunk}, groups, max_blocks, vocab);
      run(gpu, step);
      plain.push_back(step.sampled[0]);
      plain_logprobs.push_back(step.sampled_logprobs[0]);
      chunk.first_position += int32_t(chunk.tokens.size());
      chunk.tokens = {step.sampled[0]};
      chunk.output_index = i + 1;
    }
    // Verification from the prompt in other blocks: 4 proposals, all right or the third wrong.
    for (int32_t wrong_at : {-1, 2}) {
      Chunk verify = base;
      verify.blocks = blocks_for(groups, max_blocks, max_blocks, per_group);
      std::vector<int32_t> proposals(plain.begin(), plain.begin() + 4);
      if (wrong_at >= 0) proposals[size_t(wrong_at)] = (plain[size_t(wrong_at)] + 1) % vocab;
      verify.tokens.insert(verify.tokens.end(), proposals.begin(), proposals.end());
      verify.num_drafts = 4;
      Step step({verify}, groups, max_blocks, vocab);
      run(gpu, step);
      const int32_t expected_accepted = wrong_at >= 0 ? wrong_at : 4;
      bool ok = step.num_accepted[0] == expected_accepted;
      for (int32_t j = 0; j <= 4; ++j) {
        const bool kept = j <= expected_accepted;
        ok = ok && step.sampled[size_t(j)] == (kept ? plain[size_t(j)] : -1);
        if (kept) ok = ok && std::memcmp(&step.sampled_logprobs[size_t(j)], &plain_logprobs[size_t(j)], sizeof(float)) == 0;
      }
      ++cases;
      agreeing += ok ? 1 : 0;
      check(ok, std::string("speculative verification == plain decoding (") +
                    (settings == 0 ? "greedy" : settings == 1 ? "seeded draw, device sampler" : "seeded draw, host sampler") +
                    (wrong_at >= 0 ? ", third proposal wrong" : ", every proposal right") + "): accepted " +
                    std::to_string(step.num_accepted[0]) + ", expected " + std::to_string(expected_accepted));
    }
  }
  json_field("speculative_equals_plain", std::to_string(agreeing) + "/" + std::to_string(cases));
  cd_model_free(gpu);
}

// 6. A Llama-3-8B-shaped model (random weights drawn on the device).
struct PerfSpec {
  std::vector<cd_layer_spec> layers;
  std::vector<double> inv_freq;
  cd_rope_spec rope{};
  cd_model_spec spec{};
  double weight_bytes = 0, params = 0;

  PerfSpec() {
    const int32_t hidden = 4096, layers_count = 32, heads = 32, kv_heads = 8, head_dim = 128, inter = 14336, vocab = 128256;
    inv_freq.resize(head_dim / 2);
    for (int32_t i = 0; i < head_dim / 2; ++i) inv_freq[size_t(i)] = std::pow(500000.0, -2.0 * i / head_dim);
    rope = cd_rope_spec{head_dim, inv_freq.data(), 1.0};
    cd_tensor_ref present{};
    present.size_bytes = 1;
    layers.resize(layers_count);
    for (cd_layer_spec& layer : layers) {
      layer = cd_layer_spec{};
      layer.input_norm = layer.ffn_norm = present;
    }
    spec.num_layers = layers_count;
    spec.hidden_size = hidden;
    spec.intermediate_size = inter;
    spec.num_heads = heads;
    spec.num_kv_heads = kv_heads;
    spec.head_dim = head_dim;
    spec.vocab_size = vocab;
    spec.rms_norm_eps = 1e-5;
    spec.embedding_scale = 1.0;
    spec.attention_scale = 1.0 / std::sqrt(double(head_dim));
    spec.ropes = &rope;
    spec.num_ropes = 1;
    spec.num_kv_groups = 1;
    spec.layers_per_kv_block = layers_count;
    spec.final_norm = present;
    spec.layers = layers.data();
    const double per_layer = double(hidden) * (heads * head_dim) * 2 + double(hidden) * (kv_heads * head_dim) * 2 + 3.0 * hidden * inter;
    params = per_layer * layers_count + 2.0 * vocab * hidden;
    weight_bytes = (per_layer * layers_count + double(vocab) * hidden) * 2;  // the embedding is read a row at a time
  }
};

// The all-gather that row-parallel partials take: 8 fp32 segments of [rows, 4096] over the group,
// at a decode step's 64 rows and a prefill chunk's 2048.
void tp_communicator() {
  std::string rows_json;
  for (int32_t num_ranks : {2, 8}) {
    for (int32_t num_rows : {64, 2048}) {
      const size_t rank_bytes = size_t(8 / num_ranks) * size_t(num_rows) * 4096 * sizeof(float);
      double seconds = 0;
      char describe[512] = {0};
      char error[1024] = {0};
      const bool ok = cd_cuda_probe_all_gather(0, num_ranks, rank_bytes, &seconds, describe, sizeof describe, error,
                                               sizeof error) == CD_OK;
      check(ok, "all-gather of " + std::to_string(num_ranks) + " ranks on one GPU, bitwise: " + (ok ? describe : error));
      if (!ok) continue;
      std::printf("  %d ranks, %4d rows: %.1f MB per rank in %.3f ms (%s)\n", num_ranks, num_rows, rank_bytes / 1e6, seconds * 1e3,
                  describe);
      if (!rows_json.empty()) rows_json += ",";
      rows_json += "{\"ranks\":" + std::to_string(num_ranks) + ",\"rows\":" + std::to_string(num_rows) +
                   ",\"rank_bytes\":" + std::to_string(rank_bytes) + ",\"ms\":" + num(seconds * 1e3) + "}";
    }
  }
  json_field("tp_all_gather", "[" + rows_json + "]");
}

// A sharded model against the whole one, every rank sharing GPU 0 (CONDUIT_CUDA_TP_ONE_DEVICE):
// the same logits and sampled tokens, bitwise, over a 300-token prefill (two slabs of the
// row-parallel partials) beside a short one, then 6 decode steps of both (one greedy, one at
// temperature 0.8), each fed its own sampled tokens.
bool tp_equals_tp1(const SpecFile& file, const std::string& label, int32_t tp_size, std::mt19937& rng) {
  const cd_model_spec& spec = file.spec;
  const int32_t groups = spec.num_kv_groups, vocab = spec.vocab_size, max_blocks = 24, per_group = 2 * 24;
  cd_model* whole = load(spec, CD_DEVICE_CUDA, groups * per_group, false);
  cd_model* sharded = nullptr;
  try {
    sharded = load(spec, CD_DEVICE_CUDA, groups * per_group, false, 0, tp_size);
  } catch (const std::exception& e) {
    cd_model_free(whole);
    std::printf("  --   %s TP = %d: not run: %s\n", label.c_str(), tp_size, e.what());
    return true;
  }
  std::vector<Chunk> chunks{Chunk{random_tokens(rng, 300, vocab), 0, blocks_for(groups, max_blocks, 0, per_group)},
                            Chunk{random_tokens(rng, 17, vocab), 0, blocks_for(groups, max_blocks, max_blocks, per_group)}};
  chunks[1].temperature = 0.8f;
  chunks[1].seed = rng();
  bool logits_same = true, tokens_same = true;
  for (int32_t step = 0; step < 7; ++step) {
    Step a(chunks, groups, max_blocks, vocab);
    Step b(chunks, groups, max_blocks, vocab);
    run(whole, a);
    run(sharded, b);
    logits_same &= std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)) == 0;
    tokens_same &= a.sampled == b.sampled;
    for (size_t c = 0; c < chunks.size(); ++c) {
      chunks[c].first_position += int32_t(chunks[c].tokens.size());
      chunks[c].tokens = {a.sampled[c]};
      chunks[c].output_index = step + 1;
    }
  }
  check(logits_same && tokens_same, label + ": TP = " + std::to_string(tp_size) + " on one GPU vs TP = 1: logits " +
                                        (logits_same ? "bitwise equal" : "DIFFER") + ", sampled tokens " +
                                        (tokens_same ? "equal" : "DIFFER") + " (prefill 300 + 17, 6 decode steps)");
  cd_model_free(sharded);
  cd_model_free(whole);
  return logits_same && tokens_same;
}

void performance(double read_bandwidth, double mma_peak, double datasheet_bandwidth, double datasheet_peak) {
  PerfSpec perf;
  const cd_model_spec& spec = perf.spec;
  const int32_t context = 512, max_batch = 256, block = 16, decode_steps = 20;
  const int32_t max_blocks = (context + decode_steps + 8 + 2048) / block + 2;
  const int32_t blocks = max_batch * ((context + decode_steps + 8) / block + 2) + 2 * (2048 / block + 2);
  const double kv_bytes_per_token = 2.0 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 2;
  auto start = std::chrono::steady_clock::now();
  cd_model* model = load(spec, CD_DEVICE_CUDA, blocks, false, 0x5eedull);
  std::printf("  8B-shaped model: %.1f GB of bf16 weights drawn on the device in %.1f s\n", perf.weight_bytes / 1e9, seconds_since(start));
  std::mt19937 rng(7);
  const int32_t per_seq = (context + decode_steps + 8) / block + 2;
  const auto table_of = [&](int32_t seq) {
    std::vector<int32_t> table(size_t(max_blocks), 0);
    for (int32_t b = 0; b < per_seq; ++b) table[size_t(b)] = seq * per_seq + b;
    return table;
  };
  // Contexts of 512 for 256 sequences, 16 at a time.
  start = std::chrono::steady_clock::now();
  for (int32_t first = 0; first < max_batch; first += 16) {
    std::vector<Chunk> chunks;
    for (int32_t s = first; s < first + 16; ++s) {
      Chunk c{random_tokens(rng, context, spec.vocab_size), 0, table_of(s)};
      c.flags = CD_SEQ_SAMPLE;
      chunks.push_back(c);
    }
    Step step(chunks, 1, max_blocks, spec.vocab_size);
    run(model, step);
  }
  const double fill_seconds = seconds_since(start);
  std::printf("  prefilled 256 x 512 tokens in %.2f s (%.0f tok/s, 16 sequences a step)\n", fill_seconds, 256.0 * context / fill_seconds);
  std::string decode_json;
  for (int32_t batch : {1, 64, 256}) {
    double best = 1e30;
    for (int32_t step_index = 0; step_index < decode_steps + 3; ++step_index) {
      std::vector<Chunk> chunks;
      for (int32_t s = 0; s < batch; ++s) {
        // Positions repeat across batches: each rewrites its own slot, the context stays 512.
        Chunk c{{int32_t(rng() % uint32_t(spec.vocab_size))}, context + step_index % 4, table_of(s)};
        c.flags = CD_SEQ_SAMPLE;
        chunks.push_back(c);
      }
      Step step(chunks, 1, max_blocks, spec.vocab_size);
      start = std::chrono::steady_clock::now();
      run(model, step);
      const double t = seconds_since(start);
      if (step_index >= 3) best = std::min(best, t);  // after warm-up and graph capture
    }
    const double bytes = perf.weight_bytes + batch * (context + 1) * kv_bytes_per_token;
    const double tokens_per_second = batch / best;
    std::printf("  decode batch %3d: %8.1f tok/s, step %.2f ms, %.0f GB/s = %.2f of measured read bw, %.2f of datasheet\n", batch,
                tokens_per_second, best * 1e3, bytes / best / 1e9, bytes / best / read_bandwidth, bytes / best / datasheet_bandwidth);
    decode_json += (decode_json.empty() ? "" : ",") + std::string("{\"batch\":") + std::to_string(batch) + ",\"tokens_per_second\":" +
                   num(tokens_per_second) + ",\"step_ms\":" + num(best * 1e3) + ",\"mbu_measured\":" + num(bytes / best / read_bandwidth) +
                   ",\"mbu_datasheet\":" + num(bytes / best / datasheet_bandwidth) + "}";
    if (batch == 1) check(bytes / best / read_bandwidth >= 0.80, "batch-1 decode >= 0.80 of the measured HBM read bandwidth");
  }
  json_field("decode", "[" + decode_json + "]");
  // A 2048-token prefill (a second, timed, after one warm-up), its own blocks.
  double prefill_seconds = 1e30;
  for (int32_t round = 0; round < 2; ++round) {
    std::vector<int32_t> table(static_cast<size_t>(max_blocks));
    for (int32_t b = 0; b < max_blocks; ++b) table[size_t(b)] = max_batch * per_seq + b;
    Chunk c{random_tokens(rng, 2048, spec.vocab_size), 0, table};
    c.flags = CD_SEQ_SAMPLE;
    Step step({c}, 1, max_blocks, spec.vocab_size);
    start = std::chrono::steady_clock::now();
    run(model, step);
    prefill_seconds = seconds_since(start);
  }
  const double flops = 2.0 * perf.params * 2048;
  std::printf("  prefill 2048 tokens: %.1f ms, %.0f tok/s, %.0f TFLOP/s = %.2f of measured mma peak, %.2f of datasheet\n",
              prefill_seconds * 1e3, 2048 / prefill_seconds, flops / prefill_seconds / 1e12, flops / prefill_seconds / mma_peak,
              flops / prefill_seconds / datasheet_peak);
  check(flops / prefill_seconds / datasheet_peak >= 0.5, "prefill >= 0.5 of the bf16 tensor peak (datasheet)");
  json_field("prefill", std::string("{\"tokens\":2048,\"ms\":") + num(prefill_seconds * 1e3) + ",\"tokens_per_second\":" +
                            num(2048 / prefill_seconds) + ",\"mfu_measured\":" + num(flops / prefill_seconds / mma_peak) +
                            ",\"mfu_datasheet\":" + num(flops / prefill_seconds / datasheet_peak) + "}");
  cd_model_free(model);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: gpu_check SPEC_DIR [OUT_JSON] [--skip-perf]\n");
    return 2;
  }
  const std::string spec_dir = argv[1];
  const std::string out_json = argc > 2 && argv[2][0] != '-' ? argv[2] : "";
  bool skip_perf = false;
  for (int i = 2; i < argc; ++i) skip_perf |= std::strcmp(argv[i], "--skip-perf") == 0;
  char why[512] = {};
  const int32_t count = cd_cuda_device_count(why, sizeof why);
  if (count <= 0) {
    std::printf("no CUDA device: %s\n", why);
    return 1;
  }
  cd_device_info info{};
  char error[512] = {};
  if (cd_cuda_device_info(0, &info, error, sizeof error) != CD_OK) {
    std::printf("device 0: %s\n", error);
    return 1;
  }
  std::printf("GPU: %s, compute %d.%d, %d SMs, %.1f GiB, driver %d, runtime %d\n", info.name, info.compute_capability_major,
              info.compute_capability_minor, info.num_sms, double(info.memory_bytes) / (1u << 30), info.driver_version, info.runtime_version);
  json_field("gpu", quoted(info.name));
  // Datasheet ceilings by name (SXM parts); others use the measured ones.
  const std::string name = info.name;
  const double datasheet_bandwidth = name.find("H200") != std::string::npos ? 4.8e12 : name.find("H100") != std::string::npos ? 3.35e12 : 0;
  const double datasheet_peak = name.find("H100") != std::string::npos || name.find("H200") != std::string::npos ? 989e12 : 0;
  std::printf("\n1. ceilings\n");
  double read_bandwidth = 0, mma_peak = 0;
  if (cd_cuda_probe_read_bandwidth(0, size_t(4) << 30, 5, &read_bandwidth, error, sizeof error) != CD_OK ||
      cd_cuda_probe_mma_peak(0, &mma_peak, error, sizeof error) != CD_OK) {
    std::printf("probe failed: %s\n", error);
    return 1;
  }
  std::printf("  HBM streaming read %.0f GB/s (datasheet %.0f); bf16 mma.sync peak %.0f TFLOP/s (datasheet dense %.0f)\n", read_bandwidth / 1e9,
              datasheet_bandwidth / 1e9, mma_peak / 1e12, datasheet_peak / 1e12);
  json_field("read_bandwidth", num(read_bandwidth));
  json_field("mma_peak", num(mma_peak));
  std::mt19937 rng(uint32_t(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::printf("\n2. GPU vs CPU logits\n");
  std::vector<std::string> names;
  if (DIR* dir = opendir(spec_dir.c_str())) {
    while (dirent* entry = readdir(dir)) {
      const std::string file = entry->d_name;
      if (file.size() > 5 && file.substr(file.size() - 5) == ".spec") names.push_back(file.substr(0, file.size() - 5));
    }
    closedir(dir);
  }
  std::sort(names.begin(), names.end());
  std::string rows_json;
  SpecFile tiny;
  for (const std::string& model_name : names) {
    SpecFile file;
    try {
      conduit::check::read_spec_file(spec_dir + "/" + model_name + ".spec", file);
      compare_with_cpu(file, model_name + " (" + file.architecture + ")", rng, rows_json);
    } catch (const std::exception& e) {
      check(false, model_name + ": " + e.what());
    }
  }
  json_field("logits", "[" + rows_json + "]");
  try {
    conduit::check::read_spec_file(spec_dir + "/conduit-tiny.spec", tiny);
    std::printf("\n3. batch invariance\n");
    batch_invariance(tiny, "conduit-tiny", rng);
    std::printf("\n4. device sampler\n");
    sampler_agreement(tiny, rng);
    std::printf("\n5. speculative verification (conduit-tiny)\n");
    speculative_verification(tiny, rng);
  } catch (const std::exception& e) {
    check(false, std::string("conduit-tiny: ") + e.what());
  }
  // MoE: the grouped expert matmuls and the combine, bitwise whatever shares the batch.
  for (const std::string& moe_name : std::vector<std::string>{"mixtral", "qwen3_moe", "gpt_oss"}) {
    try {
      SpecFile moe;
      conduit::check::read_spec_file(spec_dir + "/" + moe_name + ".spec", moe);
      batch_invariance(moe, moe_name, rng);
    } catch (const std::exception& e) {
      check(false, moe_name + ": " + e.what());
    }
  }
  std::printf("\n6. tensor parallelism\n");
  tp_communicator();
  setenv("CONDUIT_CUDA_TP_ONE_DEVICE", "1", 1);
  std::string tp_json;
  // MoE across the group: whole experts per rank, the gather of expert outputs, TP = 1's combine
  // (qwen3_moe: 16 experts, top 4; gpt_oss: expert biases, sinks, 8 experts, so TP = 4 holds 2 each).
  for (const std::string& tp_name :
       std::vector<std::string>{"conduit-tiny", "qwen3", "gemma3", "llama_uneven", "qwen3_moe", "gpt_oss"}) {
    for (int32_t tp_size : {2, 4}) {
      try {
        SpecFile file;
        conduit::check::read_spec_file(spec_dir + "/" + tp_name + ".spec", file);
        const bool same = tp_equals_tp1(file, tp_name, tp_size, rng);
        tp_json += (tp_json.empty() ? "" : ",") + std::string("{\"model\":") + quoted(tp_name) + ",\"tp\":" +
                   std::to_string(tp_size) + ",\"equal\":" + (same ? "true" : "false") + "}";
      } catch (const std::exception& e) {
        check(false, tp_name + " TP = " + std::to_string(tp_size) + ": " + e.what());
      }
    }
  }
  unsetenv("CONDUIT_CUDA_TP_ONE_DEVICE");
  json_field("tp_equals_tp1", "[" + tp_json + "]");
  if (!skip_perf) {
    std::printf("\n7. performance (Llama-3-8B shape, bf16)\n");
    try {
      performance(read_bandwidth, mma_peak, datasheet_bandwidth > 0 ? datasheet_bandwidth : read_bandwidth,
                  datasheet_peak > 0 ? datasheet_peak : mma_peak);
    } catch (const std::exception& e) {
      check(false, std::string("performance: ") + e.what());
    }
  }
  json_field("failures", std::to_string(g_failures));
  g_json += "}";
  if (!out_json.empty()) {
    if (FILE* f = std::fopen(out_json.c_str(), "w")) {
      std::fputs(g_json.c_str(), f);
      std::fputs("\n", f);
      std::fclose(f);
    }
  }
  std::printf("\n%s: %d failure(s)\n", g_failures == 0 ? "PASS" : "FAIL", g_failures);
  return g_failures == 0 ? 0 : 1;
}
