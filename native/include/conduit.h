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
  CD_ERR_INTERNAL = 5,
  /* The device asked for cannot be used here (no plugin, no driver, no such device). */
  CD_ERR_UNSUPPORTED_DEVICE = 6,
  /* A tensor-parallel rank could not be reached, or has died: the group must restart as one. */
  CD_ERR_RANK_UNAVAILABLE = 7
} cd_status;

typedef enum cd_dtype { CD_DTYPE_F32 = 0, CD_DTYPE_BF16 = 1, CD_DTYPE_F16 = 2 } cd_dtype;

/* Where a model's weights and KV cache live and its forward passes run (native/src/device.h). */
typedef enum cd_device { CD_DEVICE_CPU = 0, CD_DEVICE_CUDA = 1 } cd_device;

typedef enum cd_kernel {
  CD_KERNEL_AUTO = 0,
  CD_KERNEL_AVX512 = 1,
  CD_KERNEL_AVX2 = 2,
  CD_KERNEL_SCALAR = 3,
  /* avx512 with bf16 matmuls on AMX tiles (Sapphire Rapids and later, tile state granted). */
  CD_KERNEL_AMX = 4
} cd_kernel;

/* How a stored tensor encodes its elements. */
typedef enum cd_encoding {
  /* Elements of cd_tensor_ref.dtype. */
  CD_ENCODING_PLAIN = 0,
  /* OCP MXFP4 (gpt-oss's experts): per 32 elements of a row, 16 bytes of E2M1 values at the ref
     (element 2i in the low nibble of byte i, 2i + 1 in the high one) and one E8M0 scale byte,
     2^(byte - 127), at the scales' ref. Rows are [k / 2] bytes of blocks and [k / 32] scales. */
  CD_ENCODING_MXFP4 = 1,
  /* ggml's blocks as GGUF stores them (ggml-common.h), each row whole blocks: Q8_0 and Q4_0 per
     32 elements, Q4_K, Q5_K and Q6_K per 256. Elements are the fp32 values ggml dequantizes. */
  CD_ENCODING_GGML_Q8_0 = 2,
  CD_ENCODING_GGML_Q4_0 = 3,
  CD_ENCODING_GGML_Q4_K = 4,
  CD_ENCODING_GGML_Q5_K = 5,
  CD_ENCODING_GGML_Q6_K = 6,
  /* ggml's MXFP4 (gpt-oss's experts in GGUF): per 32 elements one E8M0 scale byte, then 16 bytes of
     E2M1 values, element j in the low nibble of byte j, j + 16 in the high one. */
  CD_ENCODING_GGML_MXFP4 = 7
} cd_encoding;

/*
 * Where one tensor's bytes lie, and which of its elements a weight reads. size_bytes == 0 marks
 * an absent optional tensor (a bias). A weight of rows x k elements reads element (row, i) at
 * row * row_stride + i * col_stride elements from offset_bytes: row-major [rows, k] by default
 * (strides 0), every other row of a tensor whose rows interleave two weights (gpt-oss's
 * gate_up_proj: row_stride 2k), or a transposed [k, n] tensor (row_stride 1, col_stride n). The
 * storage type is per weight, so one model may mix dtypes and encodings.
 */
typedef struct cd_tensor_ref {
  int32_t file_index;    /* into cd_model_spec.file_paths */
  uint64_t offset_bytes; /* absolute offset within the file of element (0, 0) */
  uint64_t size_bytes;   /* the bytes the weight spans */
  cd_dtype dtype;        /* stored dtype (CD_ENCODING_PLAIN) */
  cd_encoding encoding;
  int64_t row_stride;    /* elements; 0: k */
  int64_t col_stride;    /* elements; 0: 1 (the only value MXFP4 takes) */
  /* MXFP4: the scales of element (0, 0)'s block, and the bytes the scales span. */
  int32_t scales_file_index;
  uint64_t scales_offset_bytes;
  uint64_t scales_size_bytes;
  /* Non-zero: the rows of each head of this many rows are stored in llama.cpp's rotary order
     (adjacent pairs) and are read back in Hugging Face's rotate-half order. */
  int32_t rotary_permuted_head_dim;
  /* Block encodings: the weight's element (row, i) is the stored row's element first_column + i
     (a row-parallel segment of ggml blocks, which byte offsets cannot address). */
  int32_t first_column;
} cd_tensor_ref;

/* The gated activation between an MLP's gate and up projections and its down projection. */
typedef enum cd_activation {
  CD_ACTIVATION_SILU = 0,      /* silu(gate) * up */
  CD_ACTIVATION_GELU_TANH = 1, /* gelu_pytorch_tanh(gate) * up (Gemma) */
  /* gpt-oss: g = min(gate, limit), u = clamp(up, -limit, limit), (u + 1) * g * sigmoid(alpha * g) */
  CD_ACTIVATION_CLAMPED_SWIGLU = 2
} cd_activation;

/* How a MoE router turns its logits into experts and weights. */
typedef enum cd_routing {
  /* Softmax over every expert, the top k, renormalized to sum to 1 when norm_topk_prob is set
     (Mixtral always, Qwen3-MoE by config). */
  CD_ROUTING_SOFTMAX_TOPK = 0,
  /* The top k logits, softmax over them (gpt-oss). */
  CD_ROUTING_TOPK_SOFTMAX = 1
} cd_routing;

/* One expert of a MoE layer: an MLP of moe_intermediate_size. Biases are optional. */
typedef struct cd_expert_spec {
  cd_tensor_ref gate_proj; /* [moe_intermediate, hidden] */
  cd_tensor_ref up_proj;   /* [moe_intermediate, hidden] */
  cd_tensor_ref down_proj; /* [hidden, moe_intermediate] */
  cd_tensor_ref gate_bias, up_bias, down_bias;
} cd_expert_spec;

/* Rotary embeddings one or more layers share. */
typedef struct cd_rope_spec {
  /* The leading dims of each head that rotate (partial rotary: Phi-4-mini); the rest pass. */
  int32_t rotary_dim;
  /* [rotary_dim / 2] inverse frequencies, any scaling (llama3, linear, YaRN, LongRoPE) applied. */
  const double* inv_freq;
  /* cos and sin are multiplied by it (YaRN's and LongRoPE's attention factor; 1 otherwise). */
  double attention_scaling;
} cd_rope_spec;

/* One decoder layer. Matrices are [out_features, in_features], as Hugging Face stores. */
typedef struct cd_layer_spec {
  cd_tensor_ref input_norm;     /* [hidden] */
  cd_tensor_ref q_proj;         /* [num_heads * head_dim, hidden] */
  cd_tensor_ref k_proj;         /* [num_kv_heads * head_dim, hidden] */
  cd_tensor_ref v_proj;         /* [num_kv_heads * head_dim, hidden] */
  cd_tensor_ref q_bias;         /* optional [num_heads * head_dim] */
  cd_tensor_ref k_bias;         /* optional [num_kv_heads * head_dim] */
  cd_tensor_ref v_bias;         /* optional [num_kv_heads * head_dim] */
  cd_tensor_ref q_norm;         /* optional [head_dim]: RMS norm of each query head before RoPE */
  cd_tensor_ref k_norm;         /* optional [head_dim] */
  cd_tensor_ref sinks;          /* optional [num_heads]: a logit per head in every softmax's denominator */
  cd_tensor_ref o_proj;         /* [hidden, num_heads * head_dim] */
  cd_tensor_ref o_bias;         /* optional [hidden] */
  cd_tensor_ref attn_out_norm;  /* optional [hidden]: norm of the attention output before the residual add */
  cd_tensor_ref ffn_norm;       /* [hidden]: the norm before the MLP (Llama's post_attention_layernorm) */
  cd_tensor_ref ffn_out_norm;   /* optional [hidden]: norm of the MLP output before the residual add */
  /* Tokens each query may look back, inclusive of itself; 0 when unlimited. */
  int32_t sliding_window_tokens;
  int32_t rope_index;           /* into cd_model_spec.ropes */
  /* Which KV-cache group holds this layer's K and V, and its slot among the group's layers. */
  int32_t kv_group;
  int32_t kv_slot;
  /* Dense MLP (num_experts == 0). */
  cd_tensor_ref gate_proj;      /* [intermediate, hidden] */
  cd_tensor_ref up_proj;        /* [intermediate, hidden] */
  cd_tensor_ref down_proj;      /* [hidden, intermediate] */
  /* MoE MLP (num_experts > 0). */
  int32_t num_experts;
  cd_tensor_ref router;         /* [num_experts, hidden] */
  cd_tensor_ref router_bias;    /* optional [num_experts] */
  const cd_expert_spec* experts; /* [num_experts] */
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
  /* Every RMS norm multiplies by (1 + weight) instead of weight (Gemma). */
  int32_t norm_adds_one;
  /* Norm weights are used in fp32 as stored, not rounded to the weight dtype (llama.cpp's Gemma
     files hold 1 + w, summed in fp32: what transformers multiplies by). */
  int32_t norms_in_fp32;
  /* Embeddings are multiplied by this, rounded to the weight dtype (Gemma: sqrt(hidden)); 1 otherwise. */
  double embedding_scale;
  /* Attention scores are q . k times this (head_dim^-0.5, or Gemma's query_pre_attn_scalar^-0.5). */
  double attention_scale;
  /* cap * tanh(x / cap) of the scaled attention scores and of the final logits; 0 when off. */
  double attention_softcap;
  double final_softcap;
  cd_activation activation;
  double swiglu_alpha;          /* CD_ACTIVATION_CLAMPED_SWIGLU */
  double swiglu_limit;
  /* MoE layers. */
  int32_t moe_intermediate_size;
  int32_t num_experts_per_token;
  cd_routing routing;
  int32_t norm_topk_prob;
  const cd_rope_spec* ropes;
  int32_t num_ropes;
  /* KV-cache groups (vLLM's hybrid allocator): each group's layers share one block table, and a
     block holds layers_per_kv_block of a group's layers. A model whose layers all see the same
     span has one group; one mixing sliding-window and full layers groups each kind apart, so the
     blocks a window has left can be freed on its layers alone. */
  int32_t num_kv_groups;
  int32_t layers_per_kv_block;
  cd_tensor_ref embed_tokens; /* [vocab, hidden] */
  cd_tensor_ref final_norm;   /* [hidden] */
  cd_tensor_ref lm_head;      /* [vocab, hidden]; equal to embed_tokens when tied */
  const cd_layer_spec* layers; /* [num_layers] */
} cd_model_spec;

typedef enum cd_quantization {
  CD_QUANTIZATION_NONE = 0,
  /* Matrices (not the embedding table) become int8 with one fp16 scale per 32 weights, Q8_0-style. */
  CD_QUANTIZATION_INT8 = 1,
  /* 4-bit per 32 weights with an fp32 scale and min (MatrixFormat::kQ4Panels), min-max rounded;
     GGUF's Q4_K and Q4_0 blocks take this form exactly whatever the setting. */
  CD_QUANTIZATION_INT4 = 2
} cd_quantization;

typedef struct cd_load_options {
  cd_dtype weight_dtype;   /* matrices stored otherwise are converted at load */
  cd_quantization quantization;
  cd_dtype kv_cache_dtype;
  int32_t num_kv_blocks;
  int32_t block_size_tokens;
  int32_t num_threads;
  cd_kernel kernel;        /* CD_KERNEL_AUTO picks the best the CPU supports */
  cd_device device;
  /*
   * Tensor parallelism (Megatron): tp_size ranks (1, 2, 4 or 8) each hold tp_rank's share of the
   * heads, KV heads, MLP columns and vocabulary, joined through the shared-memory segment named
   * tp_group. Rank 0 runs cd_model_forward; the others run cd_model_serve_rank. A rank > 0 waits
   * up to tp_connect_timeout_ms for rank 0's segment; rank 0 waits as long for every rank to load.
   */
  int32_t tp_size;
  int32_t tp_rank;
  const char* tp_group;
  int32_t tp_connect_timeout_ms;
  /* Rank 0: the processes it started as ranks 1.. (tp_size - 1 pids), so that one that dies before
     it connects fails the load at once; NULL when they were started elsewhere. */
  const int32_t* tp_rank_pids;
  int32_t device_index;    /* CD_DEVICE_CUDA: which GPU */
} cd_load_options;

typedef struct cd_model cd_model;

/* What a loaded model resolved: the kernel that runs and the KV cache's footprint. */
typedef struct cd_model_info {
  cd_kernel kernel;
  /* K and V of one block: layers_per_kv_block layers of one group. */
  uint64_t kv_bytes_per_block;
  /* The NUMA node a tensor-parallel rank's threads are pinned to; -1 when not pinned (one node). */
  int32_t numa_node;
  cd_device device;
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
  /* [num_kv_groups][num_seqs * max_blocks_per_seq]: each KV-cache group's block tables */
  const int32_t* block_tables;
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
  /*
   * Speculative decoding. NULL: no sequence carries proposals, and every sampled sequence samples
   * at its last token only. Otherwise the last num_draft_tokens[i] tokens of sequence i's chunk
   * are proposed continuations (k of them; the sequence is flagged CD_SEQ_SAMPLE, unconstrained,
   * without CD_SEQ_RETURN_LOGITS or CD_SEQ_PROMPT_LOGPROBS). It samples at each of its last k + 1
   * tokens in turn, the j-th (from 0) exactly as plain decoding samples output index
   * output_indices[i] + j once the proposals before it are output: same logits, same counter,
   * the penalties counting those proposals among the output. A sample equal to the next proposal
   * accepts it and sampling goes on; the first that differs, or the one after the last proposal,
   * is the sequence's last. The bias and bans are the sequence's for every row: the caller keeps
   * a sequence's rows on one side of its min_tokens.
   */
  const int32_t* num_draft_tokens; /* [num_seqs] or NULL */
} cd_batch;

/* How long a pass waits for its token bitmasks before it fails. */
#define CD_BITMASK_WAIT_MS 30000

/*
 * Caller-owned outputs, every entry written by the pass. The sampled outputs hold sample_stride
 * rows per sequence, sample_stride = 1 + the largest num_draft_tokens (1 without proposals): row
 * j of sequence i, at i * sample_stride + j, is its j-th sample (the one at output index
 * output_indices[i] + j).
 */
typedef struct cd_forward_output {
  int32_t* sampled_token_ids; /* [num_seqs * sample_stride]; -1 where not sampled */
  float* sampled_logprobs;    /* [num_seqs * sample_stride]; 0 where not sampled */
  float* logits;              /* [num_logit_seqs * vocab_size], flagged sequences in batch order */
  int32_t* top_token_ids;     /* [num_seqs * sample_stride * CD_MAX_TOP_LOGPROBS]; -1 past a row's numTopLogprobs */
  float* top_logprobs;        /* [num_seqs * sample_stride * CD_MAX_TOP_LOGPROBS]; NaN where the id is -1 */
  /* [num_tokens] when a sequence has CD_SEQ_PROMPT_LOGPROBS, else NULL; NaN where not reported. */
  float* prompt_logprobs;
  /* [num_tokens * CD_MAX_TOP_LOGPROBS] when a flagged sequence has num_prompt_top_logprobs > 0,
     else NULL; -1 / NaN where not reported. */
  int32_t* prompt_top_token_ids;
  float* prompt_top_logprobs;
  /* [num_tokens] with prompt_logprobs: the next token's rank, 1 + the tokens before it in the
     order of top ids (a larger logit, or an equal one with a lower id); 0 where not reported. */
  int32_t* prompt_ranks;
  /* [num_seqs] with num_draft_tokens, else NULL: the proposals each sequence accepted. Its rows
     0 .. that count are sampled, and are the tokens it outputs; the rest are -1. */
  int32_t* num_accepted_tokens;
} cd_forward_output;

/* Returns nonzero when this build and CPU can run the kernel path. */
int cd_kernel_supported(cd_kernel kernel);

/* "auto", "amx", "avx512", "avx2" or "scalar": the names LoadOptions.kernel uses. */
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

/* A tensor-parallel rank > 0: runs every pass rank 0 starts, on the model's own threads, until
   rank 0 frees its model (done gets CD_OK) or the group fails (CD_ERR_RANK_UNAVAILABLE). Returns at once. */
void cd_model_serve_rank(cd_model* model, cd_forward_done done, void* user_data);

/* Nanoseconds this rank has spent in collectives since load (0 without tensor parallelism). */
uint64_t cd_model_collective_ns(const cd_model* model);

/* The CPU compute threads that parallel calls use are read from *num_threads_cell from now on:
   1..numThreads, anything else all. Any thread may store a count there at any time (a 32-bit
   atomic store), also while a pass runs: the pass's next parallel call (each op) uses the new
   count, and results are bitwise the same whatever the count. The caller lowers it while other
   work of its own (a grammar compiling) needs a core, so that a pass never waits on a thread
   sharing one, and whichever thread ends that work raises it at once. The cell must outlive the
   model or the next call. Device models ignore it. */
void cd_model_set_active_threads(cd_model* model, const int32_t* num_threads_cell);

/* Only while no pass is running. */
void cd_model_free(cd_model* model);

/* The format each weight matrix is held in, as lines "name format\n": names as Hugging Face's
   modules under the model (lm_head, layers.3.q_proj, layers.3.experts.5.down_proj), a row-parallel
   matrix's segments as layers.3.o_proj.S (S of 8; a rank lists those it holds); formats fp32,
   fp16, bf16, int8, int4, q4_k (GGUF Q4_K blocks) and q8_k (GGUF Q5_K/Q6_K as int8 super-blocks).
   Writes at most capacity bytes, NUL included, and returns the text's length (snprintf's
   contract). A device model lists none. */
size_t cd_model_matrix_formats(const cd_model* model, char* out, size_t capacity);

/* Benchmark probes (tools/bench-native.ts); the ceilings need an x86-64 CPU with AVX2 at least. */

/* Best streaming-read bandwidth of num_threads threads over a size_bytes buffer, with the widest
   loads the CPU has. */
cd_status cd_probe_stream_read(size_t size_bytes, int32_t num_threads, int32_t num_repeats,
                               double* out_bytes_per_second, char* error, size_t error_capacity);

/* A kernel path's multiply-add ceiling over num_threads threads, in flops per second: the
   TDPBF16PS peak for amx, the vdpbf16ps peak for avx512, the fp32 FMA peak for avx2. */
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

/* CUDA devices, through the plugin (opened here on first use; nothing CUDA is loaded before). */

typedef struct cd_device_info {
  char name[256];
  int32_t compute_capability_major;
  int32_t compute_capability_minor;
  int32_t num_sms;
  uint64_t memory_bytes;
  int32_t driver_version;  /* cudaDriverGetVersion, e.g. 13000 */
  int32_t runtime_version; /* the cudart linked into the plugin */
} cd_device_info;

/* The number of CUDA devices, or -1 when CUDA cannot run here, with the reason in why (the
   plugin missing or failing to open, cudaErrorInsufficientDriver, cudaErrorNoDevice, ...). */
int32_t cd_cuda_device_count(char* why, size_t why_capacity);

/* Loads a model on a CUDA device (options->device) with weights drawn from seed on the device
   instead of read from the spec's files, which may be absent: the GPU check program's
   benchmark models. An optional tensor is present where its ref's size_bytes > 0. */
cd_status cd_model_load_synthetic(const cd_model_spec* spec, const cd_load_options* options, uint64_t seed,
                                  cd_model** out_model, char* error, size_t error_capacity);

cd_status cd_cuda_device_info(int32_t device_index, cd_device_info* out_info, char* error, size_t error_capacity);

/* The GPU's ceilings (tools: the GPU check program): the best streaming-read bandwidth over a
   size_bytes buffer, and the bf16 tensor-core (mma.sync) multiply-add peak in flops per second. */
cd_status cd_cuda_probe_read_bandwidth(int32_t device_index, size_t size_bytes, int32_t num_repeats,
                                       double* out_bytes_per_second, char* error, size_t error_capacity);
cd_status cd_cuda_probe_mma_peak(int32_t device_index, double* out_flops_per_second, char* error,
                                 size_t error_capacity);
/* The in-process tensor-parallel group's all-gather (src/cuda/device_group.h): num_ranks ranks on
   one device, rank_bytes each, checked bitwise; the best gather's seconds, and which communicator
   ran (device copies, or NCCL with a GPU per rank) with why. */
cd_status cd_cuda_probe_all_gather(int32_t device_index, int32_t num_ranks, size_t rank_bytes, double* out_seconds,
                                   char* describe, size_t describe_capacity, char* error, size_t error_capacity);

#ifdef __cplusplus
}
#endif

#endif /* CONDUIT_H */
