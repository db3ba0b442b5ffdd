// The one mapping between a model's configuration and the `conduit worker` command line, so
// that spawned local workers and workers started by hand on other machines are configured
// by the same flags.
import { parseArgs } from 'node:util';
import os from 'node:os';
import type { LlmModelConfig } from '../configs/schema.ts';
import { logLevelSchema, modelSchema, routerSchema, servedName, type LogLevel } from '../configs/schema.ts';
import { prefillLimitsFor, type PrefillLimits } from '../engine/scheduler.ts';
import type { SpeculativeConfig } from '../engine/spec/proposer.ts';
import { SUFFIX_DEFAULTS } from '../engine/spec/suffix.ts';
import type { SharedStateSettings, WorkerSettings } from '../engine/worker.ts';

/** The KV-cache size of a worker whose configuration names none. */
export const defaultKvCacheBytes = 256 * 1024 * 1024;

export const workerFlagOptions = {
  model: { type: 'string' },
  listen: { type: 'string' },
  'served-name': { type: 'string' },
  dtype: { type: 'string' },
  'kv-cache-dtype': { type: 'string' },
  'max-model-len': { type: 'string' },
  'kv-cache-blocks': { type: 'string' },
  'kv-cache-bytes': { type: 'string' },
  'block-size': { type: 'string' },
  'max-num-seqs': { type: 'string' },
  'max-num-batched-tokens': { type: 'string' },
  'performance-mode': { type: 'string' },
  'max-num-partial-prefills': { type: 'string' },
  'max-long-partial-prefills': { type: 'string' },
  'long-prefill-token-threshold': { type: 'string' },
  'max-prefill-tokens-beside-decodes': { type: 'string' },
  threads: { type: 'string' },
  'grammar-threads': { type: 'string' },
  kernel: { type: 'string' },
  device: { type: 'string' },
  quantization: { type: 'string' },
  'tensor-parallel-size': { type: 'string' },
  // Not a model setting: only a worker an MPI launcher started (with its ranks) joins them over MPI.
  'tensor-parallel-transport': { type: 'string' },
  'enable-prefix-caching': { type: 'string' },
  'scheduling-policy': { type: 'string' },
  'speculative-config': { type: 'string' },
  // Shared state for gateways elsewhere (not model settings: a spawned local worker has none).
  'redis-url': { type: 'string' },
  'advertise-address': { type: 'string' },
  'heartbeat-interval-s': { type: 'string' },
  'heartbeat-ttl-s': { type: 'string' },
  // Not a model setting: spawned workers take their gateway's level from CONDUIT_LOG_LEVEL.
  'log-level': { type: 'string' },
} as const;

const flagToField: Record<string, keyof LlmModelConfig> = {
  'served-name': 'served_name',
  dtype: 'dtype',
  'kv-cache-dtype': 'kv_cache_dtype',
  'max-model-len': 'max_model_len',
  'kv-cache-blocks': 'kv_cache_blocks',
  'kv-cache-bytes': 'kv_cache_bytes',
  'block-size': 'block_size',
  'max-num-seqs': 'max_num_seqs',
  'max-num-batched-tokens': 'max_num_batched_tokens',
  'performance-mode': 'performance_mode',
  'max-num-partial-prefills': 'max_num_partial_prefills',
  'max-long-partial-prefills': 'max_long_partial_prefills',
  'long-prefill-token-threshold': 'long_prefill_token_threshold',
  'max-prefill-tokens-beside-decodes': 'max_prefill_tokens_beside_decodes',
  threads: 'threads_per_worker',
  'grammar-threads': 'grammar_threads',
  kernel: 'kernel',
  device: 'device',
  quantization: 'quantization',
  'tensor-parallel-size': 'tensor_parallel_size',
  'enable-prefix-caching': 'enable_prefix_caching',
  'scheduling-policy': 'scheduling_policy',
  'speculative-config': 'speculative_config',
};
const numericFields = new Set<keyof LlmModelConfig>([
  'max_model_len', 'kv_cache_blocks', 'kv_cache_bytes', 'block_size', 'max_num_seqs',
  'max_num_batched_tokens', 'max_num_partial_prefills', 'max_long_partial_prefills', 'long_prefill_token_threshold', 'max_prefill_tokens_beside_decodes', 'threads_per_worker',
  'tensor_parallel_size', 'grammar_threads',
]);
const booleanFields = new Set<keyof LlmModelConfig>(['enable_prefix_caching']);
const jsonFields = new Set<keyof LlmModelConfig>(['speculative_config']);

/** A boolean flag reads `true` or `false`; anything else reaches the schema unchanged and fails there. */
function parseFlagValue(field: keyof LlmModelConfig, value: string): unknown {
  if (numericFields.has(field)) return Number(value);
  if (booleanFields.has(field)) return value === 'true' ? true : value === 'false' ? false : value;
  if (jsonFields.has(field)) return parseJsonFlag(value);
  return value;
}

/** A JSON flag's value, or the text itself when it is not JSON (the schema then says what it expected). */
export function parseJsonFlag(value: string): unknown {
  try {
    return JSON.parse(value);
  } catch {
    return value;
  }
}

/** Flags that make `conduit worker` run `model` with `numThreads` threads on `listen`. */
export function workerArgs(model: LlmModelConfig, numThreads: number, listen: string): string[] {
  const args = ['worker', '--model', model.path, '--listen', listen];
  for (const [flag, field] of Object.entries(flagToField)) {
    const value = field === 'threads_per_worker' ? numThreads : model[field];
    if (value !== undefined) args.push(`--${flag}`, typeof value === 'object' ? JSON.stringify(value) : String(value));
  }
  return args;
}

/** The performance mode's prefill limits, with those the configuration names itself. */
function prefillLimitsOf(model: LlmModelConfig): PrefillLimits {
  const preset = prefillLimitsFor(model.performance_mode, model.max_num_seqs, model.max_num_batched_tokens);
  const maxNumPartialPrefills = model.max_num_partial_prefills ?? preset.maxNumPartialPrefills;
  const maxPrefillTokensBesideDecodes = model.max_prefill_tokens_beside_decodes ?? preset.maxPrefillTokensBesideDecodes;
  return {
    maxNumPartialPrefills,
    maxLongPartialPrefills: model.max_long_partial_prefills ?? Math.min(preset.maxLongPartialPrefills, maxNumPartialPrefills),
    longPrefillTokenThreshold: model.long_prefill_token_threshold ?? preset.longPrefillTokenThreshold,
    ...(maxPrefillTokensBesideDecodes === undefined ? {} : { maxPrefillTokensBesideDecodes }),
    // The mode's allowance per decode; a cap the configuration sets itself is the cap.
    ...(preset.prefillTokensPerDecodeRow === undefined || model.max_prefill_tokens_beside_decodes !== undefined ? {} : { prefillTokensPerDecodeRow: preset.prefillTokensPerDecodeRow }),
    ...(preset.backlogPromptTokens === undefined ? {} : { backlogPromptTokens: preset.backlogPromptTokens }),
  };
}

export function workerSettings(model: LlmModelConfig, listen: string): WorkerSettings {
  const sizedByBlocks = model.kv_cache_blocks !== undefined;
  return {
    modelDir: model.path,
    servedName: servedName(model),
    dtype: model.dtype,
    kvCacheDtype: model.kv_cache_dtype,
    maxModelLen: model.max_model_len,
    kvCacheBlocks: model.kv_cache_blocks,
    kvCacheBytes: sizedByBlocks ? undefined : (model.kv_cache_bytes ?? defaultKvCacheBytes),
    blockSizeTokens: model.block_size,
    maxNumSeqs: model.max_num_seqs,
    maxNumBatchedTokens: model.max_num_batched_tokens,
    prefillLimits: prefillLimitsOf(model),
    numThreads: model.threads_per_worker ?? os.availableParallelism(),
    kernel: model.kernel,
    device: model.device,
    quantization: model.quantization,
    tensorParallelSize: model.tensor_parallel_size,
    enablePrefixCaching: model.enable_prefix_caching,
    schedulingPolicy: model.scheduling_policy,
    speculative: speculativeConfigOf(model),
    grammarThreads: model.grammar_threads,
    listen,
  };
}

/** The model's speculative_config in the engine's terms (vLLM's defaults for the lookup lengths); null without one. */
export function speculativeConfigOf(model: LlmModelConfig): SpeculativeConfig | null {
  const spec = model.speculative_config;
  if (spec === undefined) return null;
  const promptLookupMin = spec.prompt_lookup_min ?? spec.prompt_lookup_max ?? 5;
  return {
    method: spec.method,
    numSpeculativeTokens: spec.num_speculative_tokens,
    promptLookupMin,
    promptLookupMax: spec.prompt_lookup_max ?? promptLookupMin,
    adaptive: spec.adaptive,
    ...(spec.model !== undefined && { draftModel: spec.model }),
    ...(spec.method === 'suffix' && {
      suffix: {
        ...SUFFIX_DEFAULTS,
        ...definedOnly({
          maxTreeDepth: spec.suffix_decoding_max_tree_depth,
          maxCachedRequests: spec.suffix_decoding_max_cached_requests,
          maxCachedTokens: spec.suffix_decoding_max_cached_tokens,
          maxSpecFactor: spec.suffix_decoding_max_spec_factor,
          minTokenProb: spec.suffix_decoding_min_token_prob,
        }),
      },
    }),
  };
}

/** The fields that are set: absent ones keep the defaults they are spread over. */
function definedOnly<T extends object>(fields: T): Partial<T> {
  return Object.fromEntries(Object.entries(fields).filter(([, value]) => value !== undefined)) as Partial<T>;
}

type WorkerFlagValues = ReturnType<typeof parseArgs<{ options: typeof workerFlagOptions }>>['values'];

/** `--redis-url` and the heartbeat flags, checked by the configuration's router schema. */
function sharedStateOf(values: WorkerFlagValues): SharedStateSettings | undefined {
  if (values['redis-url'] === undefined) {
    for (const flag of ['advertise-address', 'heartbeat-interval-s', 'heartbeat-ttl-s'] as const) {
      if (values[flag] !== undefined) throw new Error(`conduit worker: --${flag} needs --redis-url`);
    }
    return undefined;
  }
  const raw: Record<string, unknown> = { redis_url: values['redis-url'] };
  if (values['heartbeat-interval-s'] !== undefined) raw.heartbeat_interval_s = Number(values['heartbeat-interval-s']);
  if (values['heartbeat-ttl-s'] !== undefined) raw.heartbeat_ttl_s = Number(values['heartbeat-ttl-s']);
  const parsed = routerSchema.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new Error(`conduit worker: --${String(issue.path[0] ?? 'redis_url').replaceAll('_', '-')}: ${issue.message}`);
  }
  return {
    redisUrl: parsed.data.redis_url!,
    advertiseAddress: values['advertise-address'],
    heartbeatIntervalMs: parsed.data.heartbeat_interval_s * 1000,
    heartbeatTtlMs: parsed.data.heartbeat_ttl_s * 1000,
  };
}

/** --log-level, else CONDUIT_LOG_LEVEL; the worker logs at info without either. */
function workerLogLevelOf(flag: string | undefined, env: NodeJS.ProcessEnv = process.env): LogLevel | undefined {
  const [source, value] = flag !== undefined ? ['--log-level', flag] : ['CONDUIT_LOG_LEVEL', env.CONDUIT_LOG_LEVEL];
  if (value === undefined) return undefined;
  const result = logLevelSchema.safeParse(value);
  if (!result.success) throw new Error(`conduit worker: ${source} ${value}: ${result.error.issues[0].message}`);
  return result.data;
}

/** Parses `conduit worker` flags into the worker's settings. */
export function parseWorkerArgs(argv: string[]): WorkerSettings {
  const { values } = parseArgs({ args: argv, options: workerFlagOptions, strict: true });
  if (values.model === undefined) throw new Error('conduit worker: --model DIR is required');
  if (values.listen === undefined) throw new Error('conduit worker: --listen HOST:PORT is required');
  const raw: Record<string, unknown> = { path: values.model };
  for (const [flag, field] of Object.entries(flagToField)) {
    const value = values[flag as keyof typeof values];
    if (value === undefined) continue;
    raw[field] = parseFlagValue(field, value);
  }
  const parsed = modelSchema.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const field = String(issue.path[0] ?? '');
    const flag = Object.entries(flagToField).find(([, f]) => f === field)?.[0] ?? field;
    throw new Error(`conduit worker: --${flag}: ${issue.message}`);
  }
  const settings = workerSettings(parsed.data, values.listen);
  const transport = values['tensor-parallel-transport'];
  if (transport !== undefined) {
    if (transport !== 'shm' && transport !== 'mpi') throw new Error(`conduit worker: --tensor-parallel-transport ${transport}: expected shm or mpi`);
    settings.tensorParallelTransport = transport;
  }
  const logLevel = workerLogLevelOf(values['log-level']);
  if (logLevel !== undefined) settings.logLevel = logLevel;
  const sharedState = sharedStateOf(values);
  return sharedState === undefined ? settings : { ...settings, sharedState };
}
