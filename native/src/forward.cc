// The forward pass. Every parallel split is over rows, output columns or (token, head) pairs,
// never over a reduction, so a token's values do not depend on the batch around it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <sched.h>
#include <thread>

#include "batch_broadcast.h"
#include "dtype.h"
#include "error.h"
#include "logprobs.h"
#include "matmul.h"
#include "model.h"
#include "moe.h"
#include "sampler.h"

namespace conduit {

namespace {

// Prompt logprobs run the LM head over slabs of rows whose logits fit this many floats (16 MiB),
// so a long prompt chunk never needs a [tokens, vocab] buffer.
constexpr size_t kPromptLogitsBudget = size_t(1) << 22;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

template <typename T>
void grow(std::vector<T>& buffer, size_t size) {
  if (buffer.size() < size) buffer.resize(size);
}

void rms_norm(const KernelTable& kernels, const float* x, const float* weight, int32_t n, double eps,
              float* y) {
  const float sum_squares = kernels.dot(x, x, CD_DTYPE_F32, n);
  const float inv_rms = float(1.0 / std::sqrt(double(sum_squares) / n + eps));
  for (int32_t i = 0; i < n; ++i) y[i] = weight[i] * (x[i] * inv_rms);
}

// Rotates the two halves of each head's first rotary_dim dims (the Hugging Face rotate_half
// convention; the rest of a partially rotary head passes).
void apply_rope(float* heads, int32_t num_heads, int32_t head_dim, int32_t rotary_dim, const float* cos_row,
                const float* sin_row) {
  const int32_t half = rotary_dim / 2;
  for (int32_t h = 0; h < num_heads; ++h) {
    float* head = heads + size_t(h) * head_dim;
    for (int32_t i = 0; i < half; ++i) {
      const float a = head[i];
      const float b = head[i + half];
      head[i] = a * cos_row[i] - b * sin_row[i];
      head[i + half] = b * cos_row[i] + a * sin_row[i];
    }
  }
}

void add_bias(float* row, const float* bias, int32_t n) {
  if (bias == nullptr) return;
  for (int32_t i = 0; i < n; ++i) row[i] += bias[i];
}

// Waits until the threads writing a batch's token bitmasks have counted every row written. They
// usually have: they fill the rows while the layers run. Yields first, then naps, so a late
// writer gets the core it may be waiting for.
void wait_for_bitmasks(const cd_batch& batch) {
  if (batch.bitmask_rows == nullptr || batch.bitmask_ready == nullptr) return;
  const auto ready = [&batch] { return __atomic_load_n(batch.bitmask_ready, __ATOMIC_ACQUIRE) >= batch.bitmask_ready_target; };
  for (int32_t spin = 0; spin < 256; ++spin) {
    if (ready()) return;
    sched_yield();
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(CD_BITMASK_WAIT_MS);
  while (!ready()) {
    if (std::chrono::steady_clock::now() > deadline) {
      throw Error(CD_ERR_INTERNAL, "the token bitmasks of a structured output were not written within " +
                                       std::to_string(CD_BITMASK_WAIT_MS) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

// Each head's RMS norm over its head_dim (Qwen3's and Gemma's q_norm and k_norm), in place.
void norm_heads(const KernelTable& kernels, float* heads, int32_t num_heads, int32_t head_dim, const float* weight,
                double eps) {
  if (weight == nullptr) return;
  for (int32_t h = 0; h < num_heads; ++h) {
    float* head = heads + size_t(h) * head_dim;
    rms_norm(kernels, head, weight, head_dim, eps, head);
  }
}

constexpr float kNoSink = -std::numeric_limits<float>::infinity();

}  // namespace

class ForwardPass {
 public:
  ForwardPass(Model& model, const cd_batch& batch)
      : model_(model), dims_(model.dims), batch_(batch), ws_(model.workspace) {}

  void run(cd_forward_output& output) {
    prepare();
    embed_and_rope_tables();
    for (int32_t layer = 0; layer < dims_.num_layers; ++layer) run_layer(layer);
    produce_outputs(output);
  }

 private:
  // Group g's block table of a sequence (cd_batch.block_tables holds one table per KV-cache group).
  const int32_t* block_table(int32_t group, int32_t seq) const {
    return batch_.block_tables + (size_t(group) * batch_.num_seqs + size_t(seq)) * batch_.max_blocks_per_seq;
  }

  int32_t slot_of(int32_t group, int32_t seq, int32_t position) const {
    const int32_t block_size = model_.kv_cache.block_size_tokens();
    return block_table(group, seq)[position / block_size] * block_size + position % block_size;
  }

  static int32_t first_visible_position(int32_t position, int32_t window) {
    if (window == 0) return 0;
    return std::max(0, position - window + 1);
  }

  // Tasks go to whichever thread claims them first: no value depends on the thread, and a
  // thread late from its wake-up or slowed by its core's neighbours takes fewer (a prompt's later
  // tokens also see more keys, which would leave a static first half idle during attention).
  template <typename Body>
  void parallel_tasks(int32_t num_tasks, const Body& body) {
    model_.pool.parallel_for(num_tasks, 1, body);
  }

  void prepare() {
    const size_t num_tokens = size_t(batch_.num_tokens);
    grow(ws_.hidden, num_tokens * dims_.hidden_size);
    grow(ws_.normed, num_tokens * dims_.hidden_size);
    grow(ws_.q, num_tokens * dims_.q_size());
    grow(ws_.k, num_tokens * dims_.kv_size());
    grow(ws_.v, num_tokens * dims_.kv_size());
    grow(ws_.attention, num_tokens * dims_.q_size());
    grow(ws_.layer_out, num_tokens * dims_.hidden_size);
    grow(ws_.gate, num_tokens * dims_.intermediate_size);
    grow(ws_.up, num_tokens * dims_.intermediate_size);
    ws_.rope_cos.resize(model_.ropes.size());
    ws_.rope_sin.resize(model_.ropes.size());
    for (size_t r = 0; r < model_.ropes.size(); ++r) {
      grow(ws_.rope_cos[r], num_tokens * size_t(model_.ropes[r].rotary_dim / 2));
      grow(ws_.rope_sin[r], num_tokens * size_t(model_.ropes[r].rotary_dim / 2));
    }
    ws_.token_seqs.resize(num_tokens);
    list_output_rows(batch_, ws_.outputs);
    sample_stride_ = ws_.outputs.sample_stride;
    // The longest span a query reads: unlimited when some layer is, else the widest window.
    int32_t widest_window = 0;
    for (const Layer& layer : model_.layers) {
      if (layer.sliding_window_tokens == 0) {
        widest_window = 0;
        break;
      }
      widest_window = std::max(widest_window, layer.sliding_window_tokens);
    }
    int32_t max_context = 1;
    for (int32_t seq = 0; seq < batch_.num_seqs; ++seq) {
      const int32_t begin = batch_.query_starts[seq];
      const int32_t end = batch_.query_starts[seq + 1];
      for (int32_t t = begin; t < end; ++t) {
        ws_.token_seqs[size_t(t)] = seq;
        const int32_t position = batch_.positions[t];
        max_context = std::max(max_context, position - first_visible_position(position, widest_window) + 1);
      }
    }
    // kBf16Pairs attention works in whole groups of 16 keys from the one holding the first.
    const size_t num_threads = size_t(model_.pool.num_threads());
    const size_t context_capacity = size_t(max_context) + 32;
    // Room for every query head of a kv head (the paired layout scores them together).
    const size_t heads_per_kv_head = size_t(dims_.num_heads / dims_.num_kv_heads);
    ws_.scores_stride = context_capacity;
    ws_.scores.resize(num_threads);
    for (std::vector<float>& scores : ws_.scores) grow(scores, heads_per_kv_head * context_capacity);
    ws_.softmax_sums.resize(num_threads);
    for (std::vector<float>& sums : ws_.softmax_sums) grow(sums, heads_per_kv_head);
    if (model_.kv_cache.layout() == KvLayout::kBf16Pairs) {
      for (auto* buffers : {&ws_.key_groups, &ws_.value_groups}) {
        buffers->resize(num_threads);
        for (std::vector<const uint16_t*>& groups : *buffers) grow(groups, context_capacity / 16);
      }
      ws_.query_bf16.resize(num_threads);
      for (std::vector<uint16_t>& query : ws_.query_bf16) grow(query, 4 * size_t(dims_.head_dim));  // two heads' halves
      ws_.prefetched_history.resize(num_threads);
      ws_.probs_bf16.resize(num_threads);
      for (std::vector<uint16_t>& probs : ws_.probs_bf16) grow(probs, 4 * context_capacity);  // two heads' halves
    }
  }

  void embed_and_rope_tables() {
    const float scale = model_.numerics.embedding_scale;
    model_.pool.parallel_for(batch_.num_tokens, rows_per_chunk(dims_.hidden_size), [&](int32_t, int32_t begin, int32_t end) {
      for (int32_t t = begin; t < end; ++t) {
        const size_t row = size_t(batch_.token_ids[t]) * dims_.hidden_size;
        const Embedding& embed = model_.embed_tokens;
        float* hidden = &ws_.hidden[size_t(t) * dims_.hidden_size];
        for (int32_t i = 0; i < dims_.hidden_size; ++i) hidden[i] = load_as_f32(embed.data, embed.dtype, row + i);
        if (scale != 1.0f) {
          for (int32_t i = 0; i < dims_.hidden_size; ++i) hidden[i] *= scale;
        }
        for (size_t r = 0; r < model_.ropes.size(); ++r) {
          const RopeTable& rope = model_.ropes[r];
          const int32_t half = rope.rotary_dim / 2;
          for (int32_t i = 0; i < half; ++i) {
            const double angle = double(batch_.positions[t]) * rope.inv_freq[size_t(i)];
            ws_.rope_cos[r][size_t(t) * half + i] = float(std::cos(angle) * rope.attention_scaling);
            ws_.rope_sin[r][size_t(t) * half + i] = float(std::sin(angle) * rope.attention_scaling);
          }
        }
      }
    });
  }

  void matmuls(float* x, int32_t num_rows, int32_t k, std::initializer_list<MatmulJob> jobs) {
    parallel_matmuls(model_.pool, model_.kernels, MatmulInput{x}, num_rows, k, jobs, ws_.packed);
  }

  // The matmuls' input is the RMS norm of rows of x (the residual stream), written to ws_.normed.
  void normed_matmuls(const float* x, const float* norm_weight, int32_t num_rows,
                      std::initializer_list<MatmulJob> jobs) {
    struct Norm {
      const ForwardPass* pass;
      const float* x;
      const float* weight;
    } norm{this, x, norm_weight};
    const auto prepare = [](const void* context, int32_t row, float* out) {
      const Norm& n = *static_cast<const Norm*>(context);
      const Dimensions& dims = n.pass->dims_;
      rms_norm(n.pass->model_.kernels, n.x + size_t(row) * dims.hidden_size, n.weight, dims.hidden_size,
               dims.rms_norm_eps, out);
    };
    parallel_matmuls(model_.pool, model_.kernels, MatmulInput{ws_.normed.data(), prepare, &norm}, num_rows,
                     dims_.hidden_size, jobs, ws_.packed);
  }

  // y (+)= input · W^T, the segments' partials summed in the fixed tree (row_parallel.h).
  void row_parallel_matmul(const MatmulInput& input, int32_t k, const SegmentedMatrix& w, float* y, bool accumulate) {
    const int32_t num_rows = batch_.num_tokens;
    const int32_t n = dims_.hidden_size;
    const TensorParallel& tp = model_.tp;
    if (tp.comm == nullptr && sums_segments_in_tiles(model_.kernels, w, num_rows)) {
      summed_segment_matmuls(model_.pool, model_.kernels, input, num_rows, k, w, n, y, accumulate, ws_.segments);
      return;
    }
    const size_t partial_size = size_t(num_rows) * size_t(n);
    grow(ws_.partials, size_t(kReductionSegments) * partial_size);
    segment_matmuls(model_.pool, model_.kernels, input, num_rows, tp.rank * k, k, w, tp.first_segment(), tp.end_segment(), n,
                    ws_.partials.data(), ws_.segments);
    // Every rank gets every segment's partial and sums them in the same tree: an all-reduce whose
    // order no library decides.
    if (tp.comm != nullptr) {
      const size_t segments_per_rank = size_t(kReductionSegments / tp.size);
      tp.comm->all_gather(ws_.partials.data() + size_t(tp.first_segment()) * partial_size,
                          segments_per_rank * partial_size * sizeof(float), ws_.partials.data());
    }
    combine_segments(model_.pool, ws_.partials.data(), num_rows, n, y, size_t(n), accumulate);
  }

  // Biases, per-head norms, rotary embedding, then K and V into the paged cache at each token's slot.
  void position_and_cache(int32_t layer_index) {
    const Layer& layer = model_.layers[size_t(layer_index)];
    const RopeTable& rope = model_.ropes[size_t(layer.rope)];
    const int32_t half = rope.rotary_dim / 2;
    KvCache& cache = model_.kv_cache;
    model_.pool.parallel_for(batch_.num_tokens, rows_per_chunk(dims_.q_size() + 2 * dims_.kv_size()), [&](int32_t, int32_t begin, int32_t end) {
      for (int32_t t = begin; t < end; ++t) {
        float* q = &ws_.q[size_t(t) * dims_.q_size()];
        float* k = &ws_.k[size_t(t) * dims_.kv_size()];
        float* v = &ws_.v[size_t(t) * dims_.kv_size()];
        add_bias(q, layer.q_bias, dims_.q_size());
        add_bias(k, layer.k_bias, dims_.kv_size());
        add_bias(v, layer.v_bias, dims_.kv_size());
        norm_heads(model_.kernels, q, dims_.num_heads, dims_.head_dim, layer.q_norm, dims_.rms_norm_eps);
        norm_heads(model_.kernels, k, dims_.num_kv_heads, dims_.head_dim, layer.k_norm, dims_.rms_norm_eps);
        const float* cos_row = &ws_.rope_cos[size_t(layer.rope)][size_t(t) * half];
        const float* sin_row = &ws_.rope_sin[size_t(layer.rope)][size_t(t) * half];
        apply_rope(q, dims_.num_heads, dims_.head_dim, rope.rotary_dim, cos_row, sin_row);
        apply_rope(k, dims_.num_kv_heads, dims_.head_dim, rope.rotary_dim, cos_row, sin_row);
        const int32_t slot = slot_of(layer.kv_group, ws_.token_seqs[size_t(t)], batch_.positions[t]);
        for (int32_t h = 0; h < dims_.num_kv_heads; ++h) {
          const size_t offset = size_t(h) * dims_.head_dim;
          cache.store(layer.kv_slot, 0, slot, h, k + offset);
          cache.store(layer.kv_slot, 1, slot, h, v + offset);
        }
      }
    });
  }

  // A head's scaled scores, soft-capped where the model caps them, become softmax numerators;
  // returns their sum, the head's sink included.
  float softmax_numerators(const Layer& layer, int32_t head, float* scores, int32_t num_visible, float scale) const {
    const KernelTable& kernels = model_.kernels;
    const float sink = layer.sinks == nullptr ? kNoSink : layer.sinks[head];
    const float cap = model_.numerics.attention_softcap;
    if (cap == 0.0f) return kernels.softmax_numerators(scores, num_visible, scale, sink);
    kernels.softcap(scores, num_visible, scale, cap);
    return kernels.softmax_numerators(scores, num_visible, 1.0f, sink);
  }

  // Every query reads its keys and values back from the cache in position order, so prefill,
  // chunked prefill and decode all compute the same sums.
  void attend(int32_t layer_index) {
    if (model_.kv_cache.layout() == KvLayout::kBf16Pairs) {
      attend_bf16_pairs(layer_index);
      return;
    }
    const Layer& layer = model_.layers[size_t(layer_index)];
    const KvCache& cache = model_.kv_cache;
    const KernelTable& kernels = model_.kernels;
    const int32_t heads_per_kv_head = dims_.num_heads / dims_.num_kv_heads;
    const float scale = model_.numerics.attention_scale;
    const int32_t num_pairs = batch_.num_tokens * dims_.num_heads;
    parallel_tasks(num_pairs, [&](int32_t thread_index, int32_t begin, int32_t end) {
      float* scores = ws_.scores[size_t(thread_index)].data();
      for (int32_t pair = begin; pair < end; ++pair) {
        const int32_t t = pair / dims_.num_heads;
        const int32_t head = pair % dims_.num_heads;
        const int32_t kv_head = head / heads_per_kv_head;
        const int32_t seq = ws_.token_seqs[size_t(t)];
        const int32_t position = batch_.positions[t];
        const int32_t first = first_visible_position(position, layer.sliding_window_tokens);
        const int32_t num_visible = position - first + 1;
        const float* q = &ws_.q[size_t(t) * dims_.q_size() + size_t(head) * dims_.head_dim];
        // Keys and values of one cache block are contiguous: one kernel call per block.
        const int32_t block_size = cache.block_size_tokens();
        for (int32_t j = 0; j < num_visible;) {
          const int32_t run = std::min(num_visible - j, block_size - (first + j) % block_size);
          kernels.dot_rows(q, cache.at(layer.kv_slot, 0, slot_of(layer.kv_group, seq, first + j), kv_head), cache.dtype(), run,
                           dims_.head_dim, scores + j);
          j += run;
        }
        const float sum = softmax_numerators(layer, head, scores, num_visible, scale);
        float* out = &ws_.attention[size_t(t) * dims_.q_size() + size_t(head) * dims_.head_dim];
        std::fill(out, out + dims_.head_dim, 0.0f);
        for (int32_t j = 0; j < num_visible;) {
          const int32_t run = std::min(num_visible - j, block_size - (first + j) % block_size);
          kernels.axpy_rows(scores + j, cache.at(layer.kv_slot, 1, slot_of(layer.kv_group, seq, first + j), kv_head), cache.dtype(),
                            run, dims_.head_dim, out);
          j += run;
        }
        const float inv_sum = 1.0f / sum;
        for (int32_t i = 0; i < dims_.head_dim; ++i) out[i] *= inv_sum;
      }
    });
  }

  // The query and the softmax numerators (as bf16 halves on avx512) meet the cache in dot
  // products. Scores and numerators are indexed from `base`, the first visible position rounded
  // down to a group of 16 keys (groups and value pairs start at even slots of a block).
  void attend_bf16_pairs(int32_t layer_index) {
    const Layer& layer = model_.layers[size_t(layer_index)];
    const KvCache& cache = model_.kv_cache;
    const KernelTable& kernels = model_.kernels;
    const int32_t head_dim = dims_.head_dim;
    const int32_t heads_per_kv_head = dims_.num_heads / dims_.num_kv_heads;
    const float scale = model_.numerics.attention_scale;
    const int32_t block_size = cache.block_size_tokens();
    const size_t key_pair_stride = size_t(block_size) * 2;
    // One task per (token, kv head): its query heads read the same keys and values, the first
    // from memory and the rest from cache. A decode's rows (a token and its proposals) go kv head
    // by kv head, so the rows after the first find that kv head's history in cache; a prompt's
    // go token by token (kv head by kv head measured 2-5 % slower there).
    const int32_t num_tasks = batch_.num_tokens * dims_.num_kv_heads;
    std::fill(ws_.prefetched_history.begin(), ws_.prefetched_history.end(), int64_t(-1));
    parallel_tasks(num_tasks, [&](int32_t thread_index, int32_t begin, int32_t end) {
      float* scores = ws_.scores[size_t(thread_index)].data();
      const size_t scores_stride = ws_.scores_stride;
      float* sums = ws_.softmax_sums[size_t(thread_index)].data();
      uint16_t* query = ws_.query_bf16[size_t(thread_index)].data();
      uint16_t* probs = ws_.probs_bf16[size_t(thread_index)].data();
      const uint16_t** key_groups = ws_.key_groups[size_t(thread_index)].data();
      const uint16_t** value_groups = ws_.value_groups[size_t(thread_index)].data();
      for (int32_t task = begin; task < end; ++task) {
        // A sequence's tokens [start, end) own the tasks [start, end) x num_kv_heads.
        const int32_t seq = ws_.token_seqs[size_t(task / dims_.num_kv_heads)];
        const int32_t seq_start = batch_.query_starts[seq];
        const int32_t seq_tokens = batch_.query_starts[seq + 1] - seq_start;
        const bool decodes = seq_tokens == 1 + num_draft_tokens(seq);
        const int32_t task_in_seq = task - seq_start * dims_.num_kv_heads;
        const int32_t kv_head = decodes ? task_in_seq / seq_tokens : task_in_seq % dims_.num_kv_heads;
        const int32_t t = seq_start + (decodes ? task_in_seq % seq_tokens : task_in_seq / dims_.num_kv_heads);
        const int32_t position = batch_.positions[t];
        const int32_t first = first_visible_position(position, layer.sliding_window_tokens);
        const int32_t base = first - first % 16;
        const int32_t num_groups = (position - base) / 16 + 1;
        const int32_t* table = block_table(layer.kv_group, seq);
        for (int32_t g = 0; g < num_groups; ++g) {
          const int32_t group_position = base + 16 * g;
          const int32_t block = table[group_position / block_size];
          const int32_t offset = group_position % block_size;
          key_groups[g] = static_cast<const uint16_t*>(cache.region(layer.kv_slot, 0, block, kv_head)) + offset * 2;
          value_groups[g] = static_cast<const uint16_t*>(cache.region(layer.kv_slot, 1, block, kv_head)) + offset * head_dim;
        }
        // A decode token's keys and values were written steps ago and the weights streamed since
        // have evicted them: fetch them all at once rather than a cache miss at a time. (A
        // prompt's were written just now, in this pass.) A decode with proposals reads its
        // history the same way, once per thread and kv head: its later rows find it in cache.
        const int64_t history = int64_t(seq) * dims_.num_kv_heads + kv_head;
        if (decodes && ws_.prefetched_history[size_t(thread_index)] != history) {
          prefetch_groups(key_groups, value_groups, num_groups, key_pair_stride, head_dim);
          ws_.prefetched_history[size_t(thread_index)] = history;
        }
        const int32_t skip = first - base;
        const int32_t num_visible = position - first + 1;
        // The group's query heads together: the kernels widen each key and value once for all.
        const size_t first_head = size_t(kv_head) * heads_per_kv_head;
        const float* q = &ws_.q[size_t(t) * dims_.q_size() + first_head * head_dim];
        float* out = &ws_.attention[size_t(t) * dims_.q_size() + first_head * head_dim];
        kernels.score_key_groups(q, heads_per_kv_head, query, key_groups, num_groups, key_pair_stride, head_dim, scores,
                                 scores_stride);
        for (int32_t h = 0; h < heads_per_kv_head; ++h) {
          sums[h] = softmax_numerators(layer, int32_t(first_head) + h, scores + size_t(h) * scores_stride + skip, num_visible, scale);
        }
        kernels.sum_value_groups(scores, scores_stride, heads_per_kv_head, skip, num_visible, probs, value_groups,
                                 head_dim, out);
        for (int32_t h = 0; h < heads_per_kv_head; ++h) {
          const float inv_sum = 1.0f / sums[h];
          for (int32_t i = 0; i < head_dim; ++i) out[size_t(h) * head_dim + i] *= inv_sum;
        }
      }
    });
  }

  // Every cache line of 16-key groups: a key group's dims come in pairs key_pair_stride elements
  // apart (64 bytes each), a value group is 16 x head_dim contiguous elements.
  static void prefetch_groups(const uint16_t* const* key_groups, const uint16_t* const* value_groups,
                              int32_t num_groups, size_t key_pair_stride, int32_t head_dim) {
    constexpr int32_t kLineElements = 32;
    for (int32_t g = 0; g < num_groups; ++g) {
      for (int32_t pair = 0; pair < head_dim / 2; ++pair) __builtin_prefetch(key_groups[g] + size_t(pair) * key_pair_stride);
      for (int32_t i = 0; i < 16 * head_dim; i += kLineElements) __builtin_prefetch(value_groups[g] + i);
    }
  }

  void run_layer(int32_t layer_index) {
    const Layer& layer = model_.layers[size_t(layer_index)];
    const int32_t num_tokens = batch_.num_tokens;
    normed_matmuls(ws_.hidden.data(), layer.input_norm, num_tokens,
            {{layer.q_proj, dims_.q_size(), ws_.q.data()},
             {layer.k_proj, dims_.kv_size(), ws_.k.data()},
             {layer.v_proj, dims_.kv_size(), ws_.v.data()}});
    position_and_cache(layer_index);
    attend(layer_index);
    if (layer.attn_out_norm == nullptr && layer.o_bias == nullptr) {
      row_parallel_matmul(MatmulInput{ws_.attention.data()}, dims_.q_size(), layer.o_proj, ws_.hidden.data(), true);
    } else {
      row_parallel_matmul(MatmulInput{ws_.attention.data()}, dims_.q_size(), layer.o_proj, ws_.layer_out.data(), false);
      add_to_residual(layer.o_bias, layer.attn_out_norm);
    }
    if (layer.is_moe()) {
      norm_rows(ws_.hidden.data(), layer.ffn_norm, ws_.normed.data());
      run_moe(model_.pool, model_.kernels, layer, dims_, model_.numerics, ws_.normed.data(), num_tokens, ws_.hidden.data(),
              ws_.moe, model_.tp.comm != nullptr ? &model_.tp.experts : nullptr);
      return;
    }
    normed_matmuls(ws_.hidden.data(), layer.ffn_norm, num_tokens,
            {{layer.gate_proj, dims_.intermediate_size, ws_.gate.data()},
             {layer.up_proj, dims_.intermediate_size, ws_.up.data()}});
    // down_proj's input is the gated activation of gate and up, row by row (in place into gate
    // when shared).
    const auto activate = [](const void* context, int32_t row, float* out) {
      const ForwardPass& pass = *static_cast<const ForwardPass*>(context);
      const size_t width = size_t(pass.dims_.intermediate_size);
      const float* gate = &pass.ws_.gate[size_t(row) * width];
      const float* up = &pass.ws_.up[size_t(row) * width];
      const Numerics& numerics = pass.model_.numerics;
      switch (numerics.activation) {
        case CD_ACTIVATION_GELU_TANH: pass.model_.kernels.gelu_tanh_gate(gate, up, int32_t(width), out); break;
        case CD_ACTIVATION_CLAMPED_SWIGLU:
          pass.model_.kernels.clamped_swiglu(gate, up, int32_t(width), numerics.swiglu_alpha, numerics.swiglu_limit, out);
          break;
        default: pass.model_.kernels.swiglu(gate, up, int32_t(width), out); break;
      }
    };
    const bool adds_directly = layer.ffn_out_norm == nullptr;
    row_parallel_matmul(MatmulInput{ws_.gate.data(), activate, this}, dims_.intermediate_size, layer.down_proj,
                        adds_directly ? ws_.hidden.data() : ws_.layer_out.data(), adds_directly);
    if (!adds_directly) add_to_residual(nullptr, layer.ffn_out_norm);
  }

  // Every row's RMS norm into out.
  void norm_rows(const float* x, const float* weight, float* out) {
    const size_t width = size_t(dims_.hidden_size);
    model_.pool.parallel_for(batch_.num_tokens, rows_per_chunk(dims_.hidden_size), [&](int32_t, int32_t begin, int32_t end) {
      for (int32_t t = begin; t < end; ++t) {
        rms_norm(model_.kernels, x + size_t(t) * width, weight, dims_.hidden_size, dims_.rms_norm_eps, out + size_t(t) * width);
      }
    });
  }

  // hidden += norm(layer_out + bias), row by row (a bias or a norm may be absent): an attention or
  // MLP output that does not add straight into the residual stream.
  void add_to_residual(const float* bias, const float* norm_weight) {
    const size_t width = size_t(dims_.hidden_size);
    model_.pool.parallel_for(batch_.num_tokens, rows_per_chunk(dims_.hidden_size), [&](int32_t, int32_t begin, int32_t end) {
      for (int32_t t = begin; t < end; ++t) {
        float* out = &ws_.layer_out[size_t(t) * width];
        add_bias(out, bias, dims_.hidden_size);
        if (norm_weight != nullptr) rms_norm(model_.kernels, out, norm_weight, dims_.hidden_size, dims_.rms_norm_eps, out);
        float* hidden = &ws_.hidden[size_t(t) * width];
        for (size_t i = 0; i < width; ++i) hidden[i] += out[i];
      }
    });
  }

  void produce_outputs(cd_forward_output& output) {
    if (model_.tp.rank != 0) {
      produce_rank_logits();
      return;
    }
    clear_sequence_outputs(output);
    const int32_t num_outputs = int32_t(ws_.outputs.tokens.size());
    if (num_outputs > 0) {
      final_logits(ws_.outputs.tokens.data(), num_outputs);
      copy_returned_logits(output);
      wait_for_bitmasks(batch_);
      sample_sequences(output);
    }
    produce_prompt_logprobs(output);
  }

  // A rank > 0 takes its part in every LM head rank 0 runs (the sampled rows, then the prompt
  // logprobs' slabs) and reports nothing itself.
  void produce_rank_logits() {
    if (!ws_.outputs.tokens.empty()) final_logits(ws_.outputs.tokens.data(), int32_t(ws_.outputs.tokens.size()));
    const int32_t num_rows = int32_t(ws_.outputs.prompt_tokens.size());
    const int32_t rows_per_slab = int32_t(std::max<size_t>(1, kPromptLogitsBudget / size_t(dims_.vocab_size)));
    for (int32_t first = 0; first < num_rows; first += rows_per_slab) {
      final_logits(&ws_.outputs.prompt_tokens[size_t(first)], std::min(rows_per_slab, num_rows - first));
    }
  }

  // What a sequence reports where it does not sample.
  void clear_sequence_outputs(cd_forward_output& output) const {
    const size_t num_rows = size_t(batch_.num_seqs) * size_t(sample_stride_);
    std::fill_n(output.sampled_token_ids, num_rows, -1);
    std::fill_n(output.sampled_logprobs, num_rows, 0.0f);
    std::fill_n(output.top_token_ids, num_rows * CD_MAX_TOP_LOGPROBS, -1);
    std::fill_n(output.top_logprobs, num_rows * CD_MAX_TOP_LOGPROBS, kNaN);
    if (output.num_accepted_tokens != nullptr) std::fill_n(output.num_accepted_tokens, batch_.num_seqs, 0);
  }

  int32_t num_draft_tokens(int32_t seq) const { return conduit::num_draft_tokens(batch_, seq); }

  // Final norm and LM head for num_rows tokens, into the first num_rows rows of ws_.output_logits.
  void final_logits(const int32_t* tokens, int32_t num_rows) {
    const size_t hidden_size = size_t(dims_.hidden_size);
    grow(ws_.output_hidden, size_t(num_rows) * hidden_size);
    grow(ws_.output_logits, size_t(num_rows) * size_t(dims_.vocab_size));
    model_.pool.parallel_for(num_rows, rows_per_chunk(dims_.hidden_size), [&](int32_t, int32_t begin, int32_t end) {
      for (int32_t i = begin; i < end; ++i) {
        rms_norm(model_.kernels, &ws_.hidden[size_t(tokens[i]) * hidden_size], model_.final_norm, dims_.hidden_size,
                 dims_.rms_norm_eps, &ws_.output_hidden[size_t(i) * hidden_size]);
      }
    });
    const TensorParallel& tp = model_.tp;
    if (tp.comm == nullptr) {
      matmuls(ws_.output_hidden.data(), num_rows, dims_.hidden_size,
              {{model_.lm_head, dims_.vocab_size, ws_.output_logits.data()}});
    } else {
      gather_vocabulary_logits(num_rows);
    }
    const float cap = model_.numerics.final_softcap;
    if (cap == 0.0f || tp.rank != 0) return;
    model_.pool.parallel_for(num_rows, rows_per_chunk(dims_.vocab_size), [&](int32_t, int32_t begin, int32_t end) {
      for (int32_t i = begin; i < end; ++i) {
        model_.kernels.softcap(&ws_.output_logits[size_t(i) * size_t(dims_.vocab_size)], dims_.vocab_size, 1.0f, cap);
      }
    });
  }

  // The vocabulary-parallel LM head: this rank's slice of every row, then every rank's slices
  // gathered into whole rows (exact: no sum crosses ranks).
  void gather_vocabulary_logits(int32_t num_rows) {
    const TensorParallel& tp = model_.tp;
    const int32_t vocab_size = dims_.vocab_size;
    const int32_t widest = (vocab_size + tp.size - 1) / tp.size;
    const size_t rank_floats = size_t(num_rows) * size_t(widest);
    grow(ws_.rank_logits, rank_floats * size_t(tp.size + 1));
    float* mine = ws_.rank_logits.data() + rank_floats * size_t(tp.size);
    matmuls(ws_.output_hidden.data(), num_rows, dims_.hidden_size, {{model_.lm_head, tp.vocab_end - tp.vocab_begin, mine}});
    tp.comm->all_gather(mine, rank_floats * sizeof(float), ws_.rank_logits.data());
    if (tp.rank != 0) return;  // only rank 0 samples and reports
    for (int32_t r = 0; r < tp.size; ++r) {
      const int32_t begin = tp.vocab_of(r, vocab_size);
      const int32_t width = tp.vocab_of(r + 1, vocab_size) - begin;
      const float* slices = ws_.rank_logits.data() + rank_floats * size_t(r);
      for (int32_t i = 0; i < num_rows; ++i) {
        std::copy_n(slices + size_t(i) * size_t(width), width, &ws_.output_logits[size_t(i) * size_t(vocab_size) + size_t(begin)]);
      }
    }
  }

  void copy_returned_logits(cd_forward_output& output) const {
    const size_t vocab_size = size_t(dims_.vocab_size);
    const std::vector<int32_t>& rows = ws_.outputs.returned_rows;
    for (size_t i = 0; i < rows.size(); ++i) {
      std::copy_n(&ws_.output_logits[size_t(rows[i]) * vocab_size], vocab_size, output.logits + i * vocab_size);
    }
  }

  // Each sampled sequence on one thread, with that thread's scratch. A sequence with proposals
  // samples its rows in order and stops at the first sample that is not the next proposal: its
  // rows after that would sample an output that will never be.
  void sample_sequences(cd_forward_output& output) {
    const size_t vocab_size = size_t(dims_.vocab_size);
    parallel_tasks(int32_t(ws_.outputs.sampling_seqs.size()), [&](int32_t thread_index, int32_t begin, int32_t end) {
      for (int32_t i = begin; i < end; ++i) {
        const int32_t seq = ws_.outputs.sampling_seqs[size_t(i)];
        const int32_t num_drafts = num_draft_tokens(seq);
        const int32_t* drafts = batch_.token_ids + batch_.query_starts[seq + 1] - num_drafts;
        for (int32_t j = 0; j <= num_drafts; ++j) {
          const size_t logits_row = size_t(ws_.outputs.first_rows[size_t(seq)] + j);
          const float* logits = &ws_.output_logits[logits_row * vocab_size];
          const LogSoftmax raw = log_softmax_of(model_.kernels, logits, dims_.vocab_size);
          const int32_t token_id = sample_token(model_.kernels, logits, dims_.vocab_size, raw.best, sampling_params_of(batch_, seq, j),
                                                logit_adjustments_of(batch_, seq, j), allowed_bits_of(batch_, seq),
                                                ws_.samplers[size_t(thread_index)]);
          const size_t row = size_t(seq) * size_t(sample_stride_) + size_t(j);
          output.sampled_token_ids[row] = token_id;
          output.sampled_logprobs[row] = raw.at(logits, token_id);
          top_logprobs(logits, dims_.vocab_size, raw, batch_.num_top_logprobs[seq], output.top_token_ids + row * CD_MAX_TOP_LOGPROBS,
                       output.top_logprobs + row * CD_MAX_TOP_LOGPROBS);
          if (j == num_drafts || token_id != drafts[j]) break;
          output.num_accepted_tokens[seq] = j + 1;
        }
      }
    });
  }

  // At each token of a SEQ_PROMPT_LOGPROBS sequence whose next token is known: the raw log-softmax
  // of that next token and the top alternatives. Runs after sampling, reusing its buffers.
  void produce_prompt_logprobs(cd_forward_output& output) {
    if (output.prompt_logprobs == nullptr) return;
    const size_t num_tokens = size_t(batch_.num_tokens);
    std::fill_n(output.prompt_logprobs, num_tokens, kNaN);
    std::fill_n(output.prompt_ranks, num_tokens, 0);
    if (output.prompt_top_token_ids != nullptr) {
      std::fill_n(output.prompt_top_token_ids, num_tokens * CD_MAX_TOP_LOGPROBS, -1);
      std::fill_n(output.prompt_top_logprobs, num_tokens * CD_MAX_TOP_LOGPROBS, kNaN);
    }
    const int32_t num_rows = int32_t(ws_.outputs.prompt_tokens.size());
    const int32_t rows_per_slab = int32_t(std::max<size_t>(1, kPromptLogitsBudget / size_t(dims_.vocab_size)));
    for (int32_t first = 0; first < num_rows; first += rows_per_slab) {
      const int32_t slab_rows = std::min(rows_per_slab, num_rows - first);
      const int32_t* tokens = &ws_.outputs.prompt_tokens[size_t(first)];
      final_logits(tokens, slab_rows);
      parallel_tasks(slab_rows, [&](int32_t, int32_t begin, int32_t end) {
        for (int32_t i = begin; i < end; ++i) report_prompt_logprobs(tokens[i], i, output);
      });
    }
  }

  void report_prompt_logprobs(int32_t token, int32_t row, cd_forward_output& output) const {
    const int32_t seq = ws_.token_seqs[size_t(token)];
    const int32_t next_token_id = prompt_next_token(batch_, seq, token);
    const float* logits = &ws_.output_logits[size_t(row) * size_t(dims_.vocab_size)];
    const LogSoftmax raw = log_softmax_of(model_.kernels, logits, dims_.vocab_size);
    output.prompt_logprobs[token] = raw.at(logits, next_token_id);
    output.prompt_ranks[token] = rank_of(logits, dims_.vocab_size, next_token_id);
    const int32_t num_top = batch_.num_prompt_top_logprobs[seq];
    if (num_top == 0) return;
    const size_t top_row = size_t(token) * CD_MAX_TOP_LOGPROBS;
    top_logprobs(logits, dims_.vocab_size, raw, num_top, output.prompt_top_token_ids + top_row,
                 output.prompt_top_logprobs + top_row);
  }

  Model& model_;
  const Dimensions& dims_;
  const cd_batch& batch_;
  Workspace& ws_;
  // Rows of the sampled outputs per sequence: 1 + the most proposals a sequence carries.
  int32_t sample_stride_ = 1;
};

void Model::forward(const cd_batch& batch, cd_forward_output& output) {
  if (tp.comm != nullptr) send_batch(*tp.comm, batch, num_kv_groups, tp.batch_message);
  ForwardPass(*this, batch).run(output);
}

void Model::serve_rank() {
  ReceivedBatch received;
  cd_forward_output no_output{};
  while (receive_batch(*tp.comm, num_kv_groups, received)) ForwardPass(*this, received.batch).run(no_output);
}

}  // namespace conduit
