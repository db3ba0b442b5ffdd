#include "logprobs.h"

#include <algorithm>
#include <cmath>

namespace conduit {

LogSoftmax log_softmax_of(const KernelTable& kernels, const float* logits, int32_t vocab_size) {
  const ArgMax best = kernels.argmax(logits, vocab_size);
  return LogSoftmax{best, std::log(kernels.sum_exp(logits, vocab_size, best.value))};
}

// One pass keeping the best so far sorted: past the first few hundred ids almost every logit
// fails the one comparison with the smallest kept, so the pass costs about a read of the row.
void top_logprobs(const float* logits, int32_t vocab_size, const LogSoftmax& log_softmax, int32_t num_top, int32_t* ids,
                  float* logprobs) {
  const int32_t n = std::min(num_top, vocab_size);
  if (n <= 0) return;
  float values[CD_MAX_TOP_LOGPROBS];
  int32_t count = 0;
  for (int32_t id = 0; id < vocab_size; ++id) {
    const float value = logits[id];
    if (count == n && !(value > values[n - 1])) continue;
    // Ids arrive in increasing order, so the new one goes after every equal value.
    int32_t slot = count < n ? count++ : n - 1;
    for (; slot > 0 && values[slot - 1] < value; --slot) {
      values[slot] = values[slot - 1];
      ids[slot] = ids[slot - 1];
    }
    values[slot] = value;
    ids[slot] = id;
  }
  for (int32_t i = 0; i < n; ++i) logprobs[i] = log_softmax.at(logits, ids[i]);
}

int32_t rank_of(const float* logits, int32_t vocab_size, int32_t id) {
  const float value = logits[id];
  // Branch-free counts, which the compiler vectorizes.
  int32_t num_before = 0;
  for (int32_t j = 0; j < id; ++j) num_before += logits[j] >= value;
  for (int32_t j = id + 1; j < vocab_size; ++j) num_before += logits[j] > value;
  return 1 + num_before;
}

}  // namespace conduit
