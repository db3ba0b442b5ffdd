// The one schema for configs/*.yaml. Keys are snake_case in YAML; every default is here.
import os from 'node:os';
import path from 'node:path';
import { readFileSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import { z } from 'zod';

const dtype = z.enum(['auto', 'fp32', 'bf16', 'fp16']);
/** pino's levels: `info` logs one access line per request; `debug` adds request bodies and output text. */
export const logLevelSchema = z.enum(['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent']);
export type LogLevel = z.infer<typeof logLevelSchema>;
/** A model's routing policy (router/settings.ts); kv-aware unless the model names another. */
export const routingPolicySchema = z.enum(['kv-aware', 'least-load', 'round-robin', 'random']).default('kv-aware');
export type RoutingPolicy = z.infer<typeof routingPolicySchema>;
const hostPort = z.string().regex(/^(unix:.+|[^:\s]+:\d+)$/, 'expected HOST:PORT or unix:PATH');

export const modelSchema = z
  .object({
    /** A Hugging Face checkpoint directory; relative paths resolve against the config file. */
    path: z.string().min(1),
    /** The name clients put in `model`; defaults to the folder name. */
    served_name: z.string().min(1).optional(),
    /** Weight and compute dtype; `auto` keeps the checkpoint's. */
    dtype: dtype.default('auto'),
    /** KV-cache element type; `auto` follows the weight dtype. */
    kv_cache_dtype: dtype.default('auto'),
    /** Longest prompt + output in tokens; defaults to the checkpoint's max_position_embeddings. */
    max_model_len: z.number().int().positive().optional(),
    /** KV-cache size per worker: blocks, or bytes (one of the two; default 256 MiB of bytes). */
    kv_cache_blocks: z.number().int().positive().optional(),
    kv_cache_bytes: z.number().int().positive().optional(),
    block_size: z.number().int().positive().max(256).default(16),
    /** Most sequences in one batch. */
    max_num_seqs: z.number().int().positive().default(64),
    /** Token budget of one engine step (prompt chunks plus decode tokens). */
    max_num_batched_tokens: z.number().int().positive().default(512),
    /**
     * What the engine's scheduler favours when prompts queue (vLLM's --performance-mode):
     * `interactivity` computes one long prompt a step, so each first token comes as soon as it
     * can; `throughput` packs every prompt the step's budget holds. It sets the three below.
     */
    performance_mode: z.enum(['interactivity', 'throughput']).default('interactivity'),
    /** vLLM's names. Most prompts computed in one step; default max_num_seqs. */
    max_num_partial_prefills: z.number().int().positive().optional(),
    /** Of them, most long ones; default 1 (interactivity) or max_num_partial_prefills (throughput). */
    max_long_partial_prefills: z.number().int().positive().optional(),
    /** A prompt with more tokens than this still to compute is long; default max_num_batched_tokens / 8. */
    long_prefill_token_threshold: z.number().int().nonnegative().optional(),
    /**
     * Most prompt tokens in a step that also decodes, so that a prompt does not stall the streams
     * (engine/README.md "Scheduling"); default (interactivity) 3/16 of max_num_batched_tokens, at
     * least 32 and at most the budget; throughput: none (the whole budget).
     */
    max_prefill_tokens_beside_decodes: z.number().int().positive().optional(),
    /** Local worker processes to spawn. */
    num_workers: z.number().int().nonnegative().default(1),
    /** Compute threads per local worker; defaults to the cores divided among the workers. */
    threads_per_worker: z.number().int().positive().optional(),
    /** Workers already running elsewhere (`conduit worker --listen`), by address. */
    remote_workers: z.array(hostPort).default([]),
    /**
     * Threads per worker that compile structured outputs' grammars and fill their token masks
     * while the forward pass runs (each holds its own xgrammar instance and the vocabulary);
     * started on first use. A thread compiling a new grammar holds up the masks of the
     * sequences it serves, so more threads keep new schemas from stalling running ones.
     */
    grammar_threads: z.number().int().min(1).max(64).default(2),
    /** Force a kernel path (tests, benchmarks). */
    kernel: z.enum(['auto', 'amx', 'avx512', 'avx2', 'scalar']).default('auto'),
    /** Where the weights, KV cache and passes live: `cuda` opens the CUDA plugin (bf16 or int8 weights). */
    device: z.enum(['cpu', 'cuda']).default('cpu'),
    /**
     * Weight-only quantization made at load time: `int8` keeps one scale per 32 weights (like
     * Q8_0); `int4` 4-bit codes with a scale and min per 32 (like Q4_K's sub-blocks).
     */
    quantization: z.enum(['none', 'int8', 'int4']).default('none'),
    /**
     * Ranks one worker splits the model over (vLLM's --tensor-parallel-size): the worker is rank 0
     * and starts the others as `conduit rank` processes on this machine. 1, 2, 4 or 8; it must
     * divide the heads, KV heads and intermediate size. threads_per_worker is per rank.
     */
    tensor_parallel_size: z.union([z.literal(1), z.literal(2), z.literal(4), z.literal(8)]).default(1),
    /** Reuse the KV of cached prompt prefixes (hashed per block, shared by reference count). */
    enable_prefix_caching: z.boolean().default(true),
    /** `fcfs`, or `priority`: lower `priority` values first, then arrival order. */
    scheduling_policy: z.enum(['fcfs', 'priority']).default('fcfs'),
    /** A request not started this long after it arrived ends with `queue_timeout` (503). */
    queue_timeout_s: z.number().positive().optional(),
    /** A request not finished this long after it arrived ends with `request_timeout` (504). */
    request_timeout_s: z.number().positive().optional(),
    /**
     * Speculative decoding, in vLLM's spelling (`--speculative-config` on the command line): `ngram`
     * proposes the tokens that followed the latest earlier occurrence of the sequence's last
     * n tokens (n from prompt_lookup_max down to prompt_lookup_min; both 5 when neither is set,
     * the other one's value when one is); the step verifies up to num_speculative_tokens of them
     * per sequence, as many as pay (`adaptive`), and the output is exactly plain decoding's.
     * `suffix` (SuffixDecoding) proposes the most frequent continuation of the sequence's latest
     * tokens in suffix trees over its own tokens and over recent requests' outputs (at most
     * suffix_decoding_max_cached_requests of them, suffix_decoding_max_cached_tokens tokens in
     * all, oldest out first), as long as its estimated probability stays at least
     * suffix_decoding_min_token_prob, at most suffix_decoding_max_spec_factor tokens per token matched.
     * `draft_model` runs `model` (a smaller checkpoint with the same tokenizer; a relative path
     * resolves against the config file) in the same worker, greedily, num_speculative_tokens
     * steps ahead, with a KV cache of its own as large as the target's.
     */
    speculative_config: z
      .object({
        method: z.enum(['ngram', 'suffix', 'draft_model']),
        model: z.string().min(1).optional(),
        num_speculative_tokens: z.number().int().min(1).max(16),
        prompt_lookup_min: z.number().int().positive().optional(),
        prompt_lookup_max: z.number().int().positive().optional(),
        suffix_decoding_max_tree_depth: z.number().int().min(1).max(64).optional(),
        suffix_decoding_max_cached_requests: z.number().int().nonnegative().optional(),
        suffix_decoding_max_cached_tokens: z.number().int().nonnegative().optional(),
        suffix_decoding_max_spec_factor: z.number().positive().optional(),
        suffix_decoding_min_token_prob: z.number().min(0).max(1).optional(),
        adaptive: z.boolean().default(true),
      })
      .strict()
      .refine((s) => (s.prompt_lookup_min ?? s.prompt_lookup_max ?? 5) <= (s.prompt_lookup_max ?? s.prompt_lookup_min ?? 5), {
        message: 'prompt_lookup_min must not exceed prompt_lookup_max',
      })
      .refine((s) => (s.method === 'draft_model') === (s.model !== undefined), {
        message: 'model (the draft checkpoint) is required with method draft_model, and only with it',
      })
      .optional(),
    /**
     * How the gateway picks a worker: `kv-aware` (the longest cached prefix against load),
     * `least-load`, `round-robin` or `random`. With one worker there is nothing to pick.
     */
    routing_policy: routingPolicySchema,
  })
  .strict()
  .refine((m) => !(m.kv_cache_blocks !== undefined && m.kv_cache_bytes !== undefined), {
    message: 'set kv_cache_blocks or kv_cache_bytes, not both',
    path: ['kv_cache_blocks'],
  })
  .refine((m) => (m.max_long_partial_prefills ?? 1) <= (m.max_num_partial_prefills ?? m.max_num_seqs), {
    message: 'max_long_partial_prefills must not exceed max_num_partial_prefills (default max_num_seqs)',
    path: ['max_long_partial_prefills'],
  });

/** The gateway's router: the kv-aware cost, and the state shared in Redis across gateways and nodes. */
export const routerSchema = z
  .object({
    /**
     * Shared state: workers register there with a heartbeat and publish their KV events to
     * Redis Streams; gateways discover them and build their prefix index from the streams.
     * Unset: each gateway routes its configured workers from their engine streams.
     */
    redis_url: z.string().regex(/^rediss?:\/\/\S+$/, 'expected redis://HOST:PORT or rediss://...').optional(),
    /** kv-aware cost = prompt tokens a worker would still compute + load_weight × its load in tokens. */
    load_weight: z.number().nonnegative().default(0.5),
    /** One request in flight on a worker counts as this many tokens of its load (beside its queued prefill). */
    request_load_tokens: z.number().nonnegative().default(32),
    /** A worker with more requests than busy_load_factor × (the workers' mean + 1) is skipped, cache hit or not. */
    busy_load_factor: z.number().min(1).default(2),
    /** A worker whose KV cache is this full (0-1] is skipped likewise. */
    busy_kv_usage: z.number().gt(0).max(1).default(0.95),
    /** A session (x-session-id) keeps its worker this long after its last turn. */
    session_ttl_s: z.number().positive().default(600),
    max_sessions: z.number().int().positive().default(100_000),
    /** With redis_url: how often workers heartbeat and gateways read the registry. */
    heartbeat_interval_s: z.number().positive().default(1),
    /** With redis_url: a worker not heard from for this long leaves routing. */
    heartbeat_ttl_s: z.number().positive().default(3),
  })
  .strict()
  .refine((r) => r.heartbeat_ttl_s > r.heartbeat_interval_s, {
    message: 'heartbeat_ttl_s must be longer than heartbeat_interval_s',
    path: ['heartbeat_ttl_s'],
  });

// Keys and limits (gateway/README.md, "Keys and limits"). Each limit is absent (unlimited) by default.
const keyLimitsShape = {
  /** Requests admitted per minute: a token bucket, so a burst of up to this many, refilled evenly. */
  requests_per_minute: z.number().int().positive().optional(),
  /** Prompt + output tokens per minute: estimated at admission, settled with the actual usage. */
  tokens_per_minute: z.number().int().positive().optional(),
  /** Requests in flight at once (a stream holds its slot until it ends). */
  max_concurrent_requests: z.number().int().positive().optional(),
};
/** What a Bearer header can carry; the browser form (a WebSocket subprotocol) also needs no separators. */
export const apiKeyString = z.string().regex(/^[\x21-\x7e]+$/, 'an API key is printable ASCII without spaces');
/**
 * What a key may do: `user` (the default) calls the APIs; `admin` also the administrative
 * surfaces (repository load/unload, shared memory, trace and log settings), over HTTP and gRPC.
 */
export const keyRoleSchema = z.enum(['user', 'admin']);
/** A bare key is short for {key}: a user key with the default limits, named by its place in the list. */
const apiKeyEntrySchema = z.preprocess(
  (entry) => (typeof entry === 'string' ? { key: entry } : entry),
  z.object({ key: apiKeyString, name: z.string().min(1).optional(), role: keyRoleSchema.default('user'), ...keyLimitsShape }).strict(),
);

export const serverSchema = z
  .object({
    host: z.string().default('0.0.0.0'),
    http_port: z.number().int().min(0).max(65535).default(8000),
    grpc_port: z.number().int().min(0).max(65535).default(8001),
    metrics_port: z.number().int().min(0).max(65535).default(8002),
    /** Largest request body in bytes (and largest WebSocket message). */
    body_limit_bytes: z.number().int().positive().default(8 * 1024 * 1024),
    /**
     * Keys clients must present: a key, or {key, name, role, limits}. With none here, in
     * api_keys_file or in the CONDUIT_API_KEYS environment variable, the server needs no key.
     * Keys of the file and the environment are user keys; only a list entry may be admin.
     */
    api_keys: z.array(apiKeyEntrySchema).default([]),
    /** A file of keys, one per line (blank lines and `#` comments skipped); relative to the config file. */
    api_keys_file: z.string().min(1).optional(),
    /** Every key's limits, unless its entry sets its own; on a server without keys, the anonymous caller's. */
    key_limits: z.object(keyLimitsShape).strict().default({}),
    /** Requests in flight at once, over all keys. */
    max_concurrent_requests: z.number().int().positive().optional(),
    /** How long a shutdown lets in-flight requests finish before cutting them. */
    drain_timeout_s: z.number().nonnegative().default(30),
    /**
     * A local worker whose engine stream carries nothing this long (an idle one sends a heartbeat
     * every second) is killed as hung and restarted; a remote one is out of routing, its requests
     * failed, until it answers again. Above the longest engine step.
     */
    worker_heartbeat_timeout_s: z.number().min(2).default(30),
    /**
     * At start, every worker (local, remote, or the first found in Redis) must serve within this,
     * loading its model included; otherwise the start fails and the server exits 1.
     */
    worker_ready_timeout_s: z.number().positive().default(300),
    /** A request's headers must arrive within this (slowloris); a 408 `receive_timeout` otherwise. */
    headers_timeout_s: z.number().positive().default(10),
    /** The whole request, headers and body, must arrive within this (a dripped body); 60 s carries 8 MiB at 140 KB/s. */
    receive_timeout_s: z.number().positive().default(60),
    /** An idle keep-alive connection closes after this; above the 60 s idle timeout of common load balancers. */
    keep_alive_timeout_s: z.number().positive().default(72),
    /** Connections past this many are refused (closed at once); room for bench:gateway's 1,000 SSE and 1,000 WebSocket clients, twice over. */
    max_connections: z.number().int().positive().default(4096),
    /**
     * A stream without output this long gets its headers and a `: keep-alive` comment, then one more
     * each time again: long enough that nearly every early error still gets its HTTP status, short
     * enough for proxies that drop a response silent for 10 s or more.
     */
    sse_keepalive_s: z.number().positive().default(5),
    /** Threads that parse large bodies and render and tokenize large prompts off the event loop (the workers own the cores; two keep one huge prompt from delaying the next). */
    tokenizer_threads: z.number().int().positive().default(2),
    // The Responses API (/v1/responses).
    /** Most responses the in-memory store holds (store: true); past it, the least recently used leave first. */
    response_store_max_responses: z.number().int().positive().default(1000),
    /**
     * Bytes the stored responses may take (their text, conversation and log-probabilities, counted
     * high); past it, the least recently used leave first. Unset: 1/32 of the machine's memory.
     */
    response_store_max_bytes: z.number().int().positive().optional(),
    /** Seconds a stored response stays retrievable and continuable with previous_response_id. */
    response_store_ttl_s: z.number().positive().default(3600),
    /** Seconds a Responses WebSocket may stay open; then the server closes it (OpenAI: 60 minutes). */
    websocket_max_connection_s: z.number().positive().default(3600),
    /** Seconds between keepalive pings; a peer that leaves one unanswered until the next is dropped. */
    websocket_ping_interval_s: z.number().positive().default(30),
    /** Bytes a response stream (SSE, WebSocket, generate_stream) may have queued for a slow reader before it is cancelled: about 20,000 chunks behind, beyond what the socket buffers hold. */
    stream_max_buffered_bytes: z.number().int().positive().default(4 * 1024 * 1024),
    /** JSON log lines on stdout at this level and above; --log-level and CONDUIT_LOG_LEVEL override it. */
    log_level: logLevelSchema.default('info'),
  })
  .strict()
  .refine((s) => s.headers_timeout_s <= s.receive_timeout_s, {
    message: 'headers_timeout_s must not exceed receive_timeout_s (the headers are part of the request)',
    path: ['headers_timeout_s'],
  });

/** Ordinary models (classifiers, scorers) served the Triton way over KServe v2; see triton/README.md. */
export const modelRepositorySchema = z
  .object({
    /** A Triton-layout model repository; relative paths resolve against the config file. */
    path: z.string().min(1),
    /** `none`: load all at start; `poll`: also reload what changes on disk; `explicit`: load through the API. */
    model_control_mode: z.enum(['none', 'poll', 'explicit']).default('none'),
    /** poll mode: seconds between rescans of the repository. */
    repository_poll_s: z.number().positive().default(15),
    /** explicit mode: models loaded at start (`*` for every model). */
    load_models: z.array(z.string().min(1)).default([]),
    /** Where KServe traces are written (Triton's trace file, a start-up setting); tracing stays off without one. */
    trace_file: z.string().min(1).optional(),
    /** The response cache's size in bytes, for models with `response_cache { enable: true }`; unset or 0: no cache. */
    response_cache_bytes: z.number().int().nonnegative().optional(),
    /** Instances one model may have over its versions (a load asking for more is a 400); default max(4, 2 × cores). */
    max_instances_per_model: z.number().int().positive().optional(),
    /** Instances of all models together; default max(64, 16 × cores). */
    max_instances: z.number().int().positive().optional(),
  })
  .strict();

export const configSchema = z
  .object({
    server: serverSchema.default(serverSchema.parse({})),
    router: routerSchema.default(routerSchema.parse({})),
    models: z.array(modelSchema).min(1),
    model_repository: modelRepositorySchema.optional(),
  })
  .strict()
  .superRefine((config, context) => {
    for (const [i, model] of config.models.entries()) {
      // Workers found in Redis need not be named here.
      if (model.num_workers > 0 || model.remote_workers.length > 0 || config.router.redis_url !== undefined) continue;
      context.addIssue({
        code: 'custom',
        message: 'a model needs num_workers > 0, a remote_workers address, or router.redis_url to find its workers',
        path: ['models', i, 'num_workers'],
      });
    }
  });

/** An entry of `models:`: an LLM served by engine workers (triton/model-config.ts has the ordinary models' `ModelConfig`). */
export type LlmModelConfig = z.infer<typeof modelSchema>;
export type ServerConfig = z.infer<typeof serverSchema>;
export type KeyLimitsConfig = ServerConfig['key_limits'];
export type KeyRole = z.infer<typeof keyRoleSchema>;
export type RouterConfig = z.infer<typeof routerSchema>;
export type ModelRepositoryConfig = z.infer<typeof modelRepositorySchema>;
export type Config = z.infer<typeof configSchema>;

export class ConfigError extends Error {
  override name = 'ConfigError';
}

/** Validates parsed YAML/JSON; errors name the file and each offending field. */
export function validateConfig(raw: unknown, source: string): Config {
  const result = configSchema.safeParse(raw);
  if (!result.success) {
    const lines = result.error.issues.map((issue) => {
      const field = issue.path.length > 0 ? issue.path.join('.') : '(root)';
      return `${source}: ${field}: ${issue.message}`;
    });
    throw new ConfigError(lines.join('\n'));
  }
  const config = result.data;
  const baseDir = path.dirname(path.resolve(source));
  for (const model of config.models) {
    model.path = path.resolve(baseDir, model.path);
    if (model.speculative_config?.model !== undefined) model.speculative_config.model = path.resolve(baseDir, model.speculative_config.model);
  }
  if (config.model_repository !== undefined) config.model_repository.path = path.resolve(baseDir, config.model_repository.path);
  if (config.model_repository?.trace_file !== undefined) config.model_repository.trace_file = path.resolve(baseDir, config.model_repository.trace_file);
  if (config.server.api_keys_file !== undefined) config.server.api_keys_file = path.resolve(baseDir, config.server.api_keys_file);
  return config;
}

export function loadConfigFile(file: string): Config {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    throw new ConfigError(`${file}: cannot read: ${(err as Error).message}`);
  }
  let raw: unknown;
  try {
    raw = parseYaml(text);
  } catch (err) {
    throw new ConfigError(`${file}: invalid YAML: ${(err as Error).message}`);
  }
  return validateConfig(raw, file);
}

export function servedName(model: LlmModelConfig): string {
  return model.served_name ?? path.basename(model.path);
}

/** Cores divided among the local workers of every model, never oversubscribed, at least 1. */
export function threadsPerWorker(model: LlmModelConfig, config: Config, numCores = os.availableParallelism()): number {
  if (model.threads_per_worker !== undefined) return model.threads_per_worker;
  const numLocalWorkers = config.models.reduce((sum, m) => sum + m.num_workers, 0);
  return Math.max(1, Math.floor(numCores / Math.max(1, numLocalWorkers)));
}
