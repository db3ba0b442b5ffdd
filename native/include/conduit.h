/*
 * Conduit native runtime: the C API.
 *
 * Opaque handles, plain structs, status codes. No function throws or aborts; every failure is a
 * cd_status plus a message written into the caller's buffer. Inputs are trusted: the TypeScript
 * layer (native/checkpoint.ts, native/index.ts) has already checked every shape, offset and index.
 */
#ifndef CONDUIT_H
#define CONDUIT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cd_status {
  CD_OK = 0,
  CD_ERR_INVALID_ARGUMENT = 1,
  /* The kernel path asked for is not supported by this CPU. */
  CD_ERR_UNSUPPORTED_KERNEL = 2,
  /* A checkpoint file could not be opened or mapped. */
  CD_ERR_IO = 3,
  CD_ERR_OUT_OF_MEMORY = 4,
  CD_ERR_INTERNAL = 5
} cd_status;

typedef enum cd_dtype { CD_DTYPE_F32 = 0, CD_DTYPE_BF16 = 1, CD_DTYPE_F16 = 2 } cd_dtype;

typedef enum cd_kernel {
  CD_KERNEL_AUTO = 0,
  CD_KERNEL_AVX512 = 1,
  CD_KERNEL_AVX2 = 2,
  CD_KERNEL_SCALAR = 3
} cd_kernel;

/* Where one tensor's bytes lie. size_bytes == 0 marks an absent optional tensor (a bias). */
typedef struct cd_tensor_ref {
  int32_t file_index;  /* into cd_model_spec.file_paths */
  uint64_t offset_bytes; /* absolute offset within the file */
  uint64_t size_bytes;
  cd_dtype dtype;      /* stored dtype */
} cd_tensor_ref;

/* One decoder layer. Matrices are [out_features, in_features] row-major, as Hugging Face stores. */
typedef struct cd_layer_spec {
  cd_tensor_ref input_norm;     /* [hidden] */
  cd_tensor_ref q_proj;         /* [num_heads * head_dim, hidden] */
  cd_tensor_ref k_proj;         /* [num_kv_heads * head_dim, hidden] */
  cd_tensor_ref v_proj;         /* [num_kv_heads * head_dim, hidden] */
  cd_tensor_ref q_bias;         /* optional [num_heads * head_dim] */
  cd_tensor_ref k_bias;         /* optional [num_kv_heads * head_dim] */
  cd_tensor_ref v_bias;         /* optional [num_kv_heads * head_dim] */
  cd_tensor_ref o_proj;         /* [hidden, num_heads * head_dim] */
  cd_tensor_ref post_attn_norm; /* [hidden] */
  cd_tensor_ref gate_proj;      /* [intermediate, hidden] */
  cd_tensor_ref up_proj;        /* [intermediate, hidden] */
  cd_tensor_ref down_proj;      /* [hidden, intermediate] */
} cd_layer_spec;

/* A checked checkpoint with every hyperparameter resolved. */
typedef struct cd_model_spec {
  const char* const* file_paths;
  int32_t num_files;
  int32_t num_layers;
  int32_t hidden_size;
  int32_t intermediate_size;
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t vocab_size;
  double rms_norm_eps;
  /* Tokens each query may look back, inclusive of itself; 0 when unlimited. */
  int32_t sliding_window_tokens;
  /* [head_dim / 2] rotary inverse frequencies, any rope scaling already applied. */
  const double* rope_inv_freq;
  cd_tensor_ref embed_tokens; /* [vocab, hidden] */
  cd_tensor_ref final_norm;   /* [hidden] */
  cd_tensor_ref lm_head;      /* [vocab, hidden]; equal to embed_tokens when tied */
  const cd_layer_spec* layers; /* [num_layers] */
} cd_model_spec;

typedef enum cd_quantization {
  CD_QUANTIZATION_NONE = 0,
  /* Matrices (not the embedding table) become int8 with one fp16 scale per 32 weights, Q8_0-style. */
  CD_QUANTIZATION_INT8 = 1
} cd_quantization;

typedef struct cd_load_options {
  cd_dtype weight_dtype;   /* matrices stored otherwise are converted at load */
  cd_quantization quantization;
  cd_dtype kv_cache_dtype;
  int32_t num_kv_blocks;
  int32_t block_size_tokens;
  int32_t num_threads;
  cd_kernel kernel;        /* CD_KERNEL_AUTO picks the best the CPU supports */
} cd_load_options;

typedef struct cd_model cd_model;

/* What a loaded model resolved: the kernel that runs and the KV cache's footprint. */
typedef struct cd_model_info {
  cd_kernel kernel;
  /* K and V of one block over all layers. */
  uint64_t kv_bytes_per_block;
} cd_model_info;

/* Bits of cd_batch.seq_flags. */
#define CD_SEQ_SAMPLE 1
#define CD_SEQ_RETURN_LOGITS 2
#define CD_SEQ_PROMPT_LOGPROBS 4

/* The row stride of the top-logprob outputs: the most alternatives a position reports. */
#define CD_MAX_TOP_LOGPROBS 20

/*
 * One forward pass over a flattened batch; see native/api.ts (ForwardBatch) for the contract.
 * Sequence i owns tokens [query_starts[i], query_starts[i + 1]); its last token is sampled and/or
 * returns logits according to seq_flags[i], and with CD_SEQ_PROMPT_LOGPROBS each of its tokens
 * reports the next token's logprob. Penalty and bias entries are CSR: sequence i's are
 * [penalty_starts[i], penalty_starts[i + 1]) and [bias_starts[i], bias_starts[i + 1]), token ids
 * unique within a sequence.
 */
typedef struct cd_batch {
  int32_t num_seqs;
  int32_t num_tokens;
  const int32_t* token_ids;      /* [num_tokens] */
  const int32_t* positions;      /* [num_tokens] */
  const int32_t* query_starts;   /* [num_seqs + 1] */
  int32_t max_blocks_per_seq;
  const int32_t* block_tables;   /* [num_seqs * max_blocks_per_seq] */
  const uint8_t* seq_flags;      /* [num_seqs] */
  const float* temperatures;     /* [num_seqs] 0 = greedy */
  const float* top_ps;           /* [num_seqs] 1 disables */
  const int32_t* top_ks;         /* [num_seqs] 0 disables */
  const uint64_t* seeds;         /* [num_seqs] */
  const int32_t* output_indices; /* [num_seqs] */
  const float* min_ps;               /* [num_seqs] 0 disables */
  const float* presence_penalties;   /* [num_seqs] 0 disables */
  const float* frequency_penalties;  /* [num_seqs] 0 disables */
  const float* repetition_penalties; /* [num_seqs] 1 disables */
  const int32_t* penalty_starts;        /* [num_seqs + 1] */
  const int32_t* penalty_token_ids;     /* [penalty_starts[num_seqs]] */
  const int32_t* penalty_output_counts; /* occurrences among the output tokens */
  const uint8_t* penalty_in_prompt;     /* 1 where the token occurs in the prompt */
  const int32_t* bias_starts;           /* [num_seqs + 1] */
  const int32_t* bias_token_ids;        /* [bias_starts[num_seqs]] */
  const float* bias_values;             /* finite, or -INFINITY to ban */
  const int32_t* num_top_logprobs;        /* [num_seqs] 0..CD_MAX_TOP_LOGPROBS */
  const int32_t* num_prompt_top_logprobs; /* [num_seqs] 0..CD_MAX_TOP_LOGPROBS */
  const int32_t* prompt_next_token_ids;   /* [num_seqs] the token after the chunk, or -1 */
  /*
   * Structured outputs. NULL bitmask_rows: no sequence is constrained, and nothing below is read.
   * Otherwise a sequence with bitmask_rows[i] >= 0 samples only among the tokens whose bits are
   * set in that row of token_bitmask (bit id & 31 of word id >> 5), before every other step of
   * sampling; a row of -1 leaves the sequence as it would be without this field. The rows may
   * still be being written by other threads when the pass starts: with bitmask_ready non-NULL,
   * the sampler reads them only once *bitmask_ready >= bitmask_ready_target (an acquire load),
   * and fails the pass if that has not happened within CD_BITMASK_WAIT_MS.
   */
  const int32_t* bitmask_rows;    /* [num_seqs] or NULL */
  const uint32_t* token_bitmask;  /* [rows * bitmask_words] */
  int32_t bitmask_words;          /* (vocab_size + 31) / 32 */
  const int32_t* bitmask_ready;   /* NULL when the rows are complete already */
  int32_t bitmask_ready_target;
} cd_batch;

/* How long a pass waits for its token bitmasks before it fails. */
#define CD_BITMASK_WAIT_MS 30000

/* Caller-owned outputs, every entry written by the pass. */
typedef struct cd_forward_output {
  int32_t* sampled_token_ids; /* [num_seqs]; -1 where not sampled */
  float* sampled_logprobs;    /* [num_seqs]; 0 where not sampled */
  float* logits;              /* [num_logit_seqs * vocab_size], flagged sequences in batch order */
  int32_t* top_token_ids;     /* [num_seqs * CD_MAX_TOP_LOGPROBS]; -1 past a row's numTopLogprobs */
  float* top_logprobs;        /* [num_seqs * CD_MAX_TOP_LOGPROBS]; NaN where the id is -1 */
  /* [num_tokens] when a sequence has CD_SEQ_PROMPT_LOGPROBS, else NULL; NaN where not reported. */
  float* prompt_logprobs;
  /* [num_tokens * CD_MAX_TOP_LOGPROBS] when a flagged sequence has num_prompt_top_logprobs > 0,
     else NULL; -1 / NaN where not reported. */
  int32_t* prompt_top_token_ids;
  float* prompt_top_logprobs;
  /* [num_tokens] with prompt_logprobs: the next token's rank, 1 + the tokens before it in the
     order of top ids (a larger logit, or an equal one with a lower id); 0 where not reported. */
  int32_t* prompt_ranks;
} cd_forward_output;

/* Returns nonzero when this build and CPU can run the kernel path. */
int cd_kernel_supported(cd_kernel kernel);

/* "auto", "avx512", "avx2" or "scalar": the names LoadOptions.kernel uses. */
const char* cd_kernel_name(cd_kernel kernel);

/* Maps and converts the weights, allocates the KV cache and starts the thread pool. */
cd_status cd_model_load(const cd_model_spec* spec, const cd_load_options* options,
                        cd_model** out_model, char* error, size_t error_capacity);

void cd_model_get_info(const cd_model* model, cd_model_info* out_info);

/* Called on a runtime thread when a forward pass ends: status CD_OK, or a failure and its message
   (valid during the call only). batch and output are the caller's until then. */
typedef void (*cd_forward_done)(void* user_data, cd_status status, const char* error);

/* Starts a forward pass on the model's own threads and returns at once; done reports its end.
   One pass at a time: the next only after done has been called. */
void cd_model_forward(cd_model* model, const cd_batch* batch, cd_forward_output* output, cd_forward_done done,
                      void* user_data);

/* Only while no pass is running. */
void cd_model_free(cd_model* model);

/* Benchmark probes (tools/bench-native.ts); the ceilings need an x86-64 CPU with AVX2 at least. */

/* Best streaming-read bandwidth of num_threads threads over a size_bytes buffer, with the widest
   loads the CPU has. */
cd_status cd_probe_stream_read(size_t size_bytes, int32_t num_threads, int32_t num_repeats,
                               double* out_bytes_per_second, char* error, size_t error_capacity);

/* A kernel path's multiply-add ceiling over num_threads threads, in flops per second: the
   vdpbf16ps peak for avx512, the fp32 FMA peak for avx2. */
cd_status cd_probe_peak(cd_kernel kernel, int32_t num_threads, double* out_flops_per_second, char* error,
                        size_t error_capacity);

/* A pool of num_threads threads: the wake-up latency it measured at start, and the mean
   nanoseconds of one parallel call of num_threads empty tasks over num_calls calls. */
cd_status cd_probe_thread_handoff(int32_t num_threads, int32_t num_calls, double* out_wake_latency_ns,
                                  double* out_call_ns, char* error, size_t error_capacity);

/* One parallel matmul [num_rows, k] x [n, k]^T of random weights, as a forward pass runs it. */
typedef struct cd_matmul_probe {
  cd_kernel kernel;
  cd_dtype dtype;
  cd_quantization quantization;
  int32_t num_rows;
  int32_t k;
  int32_t n;
  int32_t num_threads;
  int32_t num_repeats;
} cd_matmul_probe;

/* Best seconds of one call over num_repeats (after one warm-up). */
cd_status cd_probe_matmul(const cd_matmul_probe* probe, double* out_seconds, char* error,
                          size_t error_capacity);

#ifdef __cplusplus
}
#endif

#endif /* CONDUIT_H */
