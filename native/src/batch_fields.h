// The fields of cd_batch and cd_forward_output as the binding marshals them, spelled once:
// X(C field, JS key of ForwardBatch / ForwardResult in native/api.ts, element type). A new field
// of a step touches conduit.h, api.ts and these lists.
#pragma once

// Scalars of ForwardBatch (int32).
#define CD_BATCH_SCALARS(X)                \
  X(num_seqs, "numSeqs")                   \
  X(num_tokens, "numTokens")               \
  X(max_blocks_per_seq, "maxBlocksPerSeq")

// Arrays every batch carries; the binding copies them, so the caller may refill its arrays at once.
#define CD_BATCH_ARRAYS(X)                                  \
  X(token_ids, "tokenIds", int32_t)                         \
  X(positions, "positions", int32_t)                        \
  X(query_starts, "queryStarts", int32_t)                   \
  X(block_tables, "blockTables", int32_t)                   \
  X(seq_flags, "seqFlags", uint8_t)                         \
  X(temperatures, "temperatures", float)                    \
  X(top_ps, "topPs", float)                                 \
  X(top_ks, "topKs", int32_t)                               \
  X(seeds, "seeds", uint64_t)                               \
  X(output_indices, "outputIndices", int32_t)               \
  X(min_ps, "minPs", float)                                 \
  X(presence_penalties, "presencePenalties", float)         \
  X(frequency_penalties, "frequencyPenalties", float)       \
  X(repetition_penalties, "repetitionPenalties", float)     \
  X(penalty_starts, "penaltyStarts", int32_t)               \
  X(penalty_token_ids, "penaltyTokenIds", int32_t)          \
  X(penalty_output_counts, "penaltyOutputCounts", int32_t)  \
  X(penalty_in_prompt, "penaltyInPrompt", uint8_t)          \
  X(bias_starts, "biasStarts", int32_t)                     \
  X(bias_token_ids, "biasTokenIds", int32_t)                \
  X(bias_values, "biasValues", float)                       \
  X(num_top_logprobs, "numTopLogprobs", int32_t)            \
  X(num_prompt_top_logprobs, "numPromptTopLogprobs", int32_t) \
  X(prompt_next_token_ids, "promptNextTokenIds", int32_t)

// Arrays a batch may leave absent or null (the C field is then NULL); copied like the above.
#define CD_BATCH_OPTIONAL_ARRAYS(X)           \
  X(num_draft_tokens, "numDraftTokens", int32_t) \
  X(bitmask_rows, "bitmaskRows", int32_t)

// Outputs, written in place into the caller's typed arrays; an empty one (nothing asked for it) is NULL.
#define CD_FORWARD_OUTPUTS(X)                              \
  X(sampled_token_ids, "sampledTokenIds", int32_t)         \
  X(sampled_logprobs, "sampledLogprobs", float)            \
  X(logits, "logits", float)                               \
  X(top_token_ids, "topTokenIds", int32_t)                 \
  X(top_logprobs, "topLogprobs", float)                    \
  X(prompt_logprobs, "promptLogprobs", float)              \
  X(prompt_top_token_ids, "promptTopTokenIds", int32_t)    \
  X(prompt_top_logprobs, "promptTopLogprobs", float)       \
  X(prompt_ranks, "promptRanks", int32_t)                  \
  X(num_accepted_tokens, "numAcceptedTokens", int32_t)
