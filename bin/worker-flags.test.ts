import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { validateConfig } from '../configs/schema.ts';
import { parseWorkerArgs, workerArgs, defaultKvCacheBytes } from './worker-flags.ts';

test('a spawned worker gets exactly the settings its model configuration names', () => {
  const config = validateConfig(
    { models: [{
        path: '/m/llama', served_name: 'chat', dtype: 'bf16', quantization: 'int8', max_model_len: 4096, kv_cache_blocks: 100,
        max_num_seqs: 8, kernel: 'avx2', device: 'cuda', enable_prefix_caching: false, scheduling_policy: 'priority',
        performance_mode: 'throughput', tensor_parallel_size: 2, max_prefill_tokens_beside_decodes: 128,
      }] },
    'c.yaml',
  );
  const args = workerArgs(config.models[0], 3, 'unix:/tmp/w.sock');
  assert.equal(args[0], 'worker');
  const settings = parseWorkerArgs(args.slice(1));
  assert.deepEqual(settings, {
    modelDir: '/m/llama',
    servedName: 'chat',
    dtype: 'bf16',
    kvCacheDtype: 'auto',
    maxModelLen: 4096,
    kvCacheBlocks: 100,
    kvCacheBytes: undefined,
    blockSizeTokens: 16,
    maxNumSeqs: 8,
    maxNumBatchedTokens: 512,
    prefillLimits: { maxNumPartialPrefills: 8, maxLongPartialPrefills: 8, longPrefillTokenThreshold: 64, maxPrefillTokensBesideDecodes: 128 },
    numThreads: 3,
    kernel: 'avx2',
    device: 'cuda',
    quantization: 'int8',
    tensorParallelSize: 2,
    enablePrefixCaching: false,
    schedulingPolicy: 'priority',
    speculative: null,
    grammarThreads: 2,
    listen: 'unix:/tmp/w.sock',
  });
});

test('speculative_config travels to the worker in vLLM\'s spelling, with vLLM\'s lookup defaults', () => {
  const model = (speculative_config: unknown) => validateConfig({ models: [{ path: '/m/x', speculative_config }] }, 'c.yaml').models[0];
  const spawned = (speculative_config: unknown) => parseWorkerArgs(workerArgs(model(speculative_config), 1, 'h:1').slice(1)).speculative;
  assert.deepEqual(spawned({ method: 'ngram', num_speculative_tokens: 4 }), { method: 'ngram', numSpeculativeTokens: 4, promptLookupMin: 5, promptLookupMax: 5, adaptive: true });
  assert.deepEqual(spawned({ method: 'ngram', num_speculative_tokens: 3, prompt_lookup_max: 4, adaptive: false }), { method: 'ngram', numSpeculativeTokens: 3, promptLookupMin: 4, promptLookupMax: 4, adaptive: false });
  assert.deepEqual(spawned({ method: 'ngram', num_speculative_tokens: 8, prompt_lookup_min: 2, prompt_lookup_max: 6 }), { method: 'ngram', numSpeculativeTokens: 8, promptLookupMin: 2, promptLookupMax: 6, adaptive: true });
  assert.deepEqual(spawned({ method: 'suffix', num_speculative_tokens: 8, suffix_decoding_max_tree_depth: 16, suffix_decoding_min_token_prob: 0.2 }), {
    method: 'suffix',
    numSpeculativeTokens: 8,
    promptLookupMin: 5,
    promptLookupMax: 5,
    adaptive: true,
    suffix: { maxTreeDepth: 16, maxCachedRequests: 10_000, maxCachedTokens: 1 << 17, maxSpecFactor: 1, minTokenProb: 0.2 },
  });
  // draft_model (vLLM's name): the draft checkpoint resolves against the config file, like the model's path.
  assert.deepEqual(spawned({ method: 'draft_model', model: 'draft', num_speculative_tokens: 3 }), {
    method: 'draft_model', draftModel: path.resolve('draft'), numSpeculativeTokens: 3, promptLookupMin: 5, promptLookupMax: 5, adaptive: true,
  });
  assert.equal(validateConfig({ models: [{ path: 'x', speculative_config: { method: 'draft_model', model: 'd', num_speculative_tokens: 3 } }] }, '/srv/conf/c.yaml').models[0].speculative_config?.model, '/srv/conf/d');
  const flag = (value: string) => parseWorkerArgs(['--model', '/m/x', '--listen', 'h:1', '--speculative-config', value]).speculative;
  assert.equal(flag('{"method":"ngram","num_speculative_tokens":2,"prompt_lookup_min":1,"prompt_lookup_max":3}')?.promptLookupMax, 3);
  for (const bad of ['{"method":"eagle","num_speculative_tokens":2}', '{"method":"ngram"}', '{"method":"ngram","num_speculative_tokens":0}',
    '{"method":"ngram","num_speculative_tokens":2,"prompt_lookup_min":4,"prompt_lookup_max":2}', '{"method":"ngram","num_speculative_tokens":2,"typo":1}', 'ngram',
    '{"method":"suffix","num_speculative_tokens":2,"suffix_decoding_max_tree_depth":0}', '{"method":"suffix","num_speculative_tokens":2,"suffix_decoding_min_token_prob":2}',
    '{"method":"draft_model","num_speculative_tokens":2}', '{"method":"ngram","model":"/m/d","num_speculative_tokens":2}', '{"method":"draft_model","model":"","num_speculative_tokens":2}']) {
    assert.throws(() => flag(bad), /--speculative-config/, bad);
  }
});

test('grammar_threads travels to the worker (--grammar-threads), 2 by default, at least 1', () => {
  const model = validateConfig({ models: [{ path: '/m/x', grammar_threads: 4 }] }, 'c.yaml').models[0];
  assert.equal(parseWorkerArgs(workerArgs(model, 1, 'h:1').slice(1)).grammarThreads, 4);
  assert.equal(validateConfig({ models: [{ path: '/m/x' }] }, 'c.yaml').models[0].grammar_threads, 2);
  assert.equal(parseWorkerArgs(['--model', '/m/x', '--listen', 'h:1', '--grammar-threads', '3']).grammarThreads, 3);
  for (const bad of ['0', '1.5', 'many']) {
    assert.throws(() => parseWorkerArgs(['--model', '/m/x', '--listen', 'h:1', '--grammar-threads', bad]), /--grammar-threads/, bad);
  }
  assert.throws(() => validateConfig({ models: [{ path: '/m/x', grammar_threads: 0 }] }, 'c.yaml'), /grammar_threads/);
});

test('a worker without a KV size gets the default bytes; bad flags name the flag', () => {
  const settings = parseWorkerArgs(['--model', '/m/x', '--listen', '127.0.0.1:0']);
  assert.equal(settings.kvCacheBytes, defaultKvCacheBytes);
  assert.equal(settings.servedName, 'x');
  assert.equal(settings.enablePrefixCaching, true);
  assert.equal(settings.schedulingPolicy, 'fcfs');
  assert.deepEqual(settings.prefillLimits, { maxNumPartialPrefills: 64, maxLongPartialPrefills: 1, longPrefillTokenThreshold: 64, maxPrefillTokensBesideDecodes: 96, prefillTokensPerDecodeRow: 8, backlogPromptTokens: 2048 });
  assert.throws(() => parseWorkerArgs(['--model', '/m/x', '--listen', 'h:1', '--enable-prefix-caching', 'yes']), /--enable-prefix-caching/);
  assert.throws(() => parseWorkerArgs(['--model', '/m/x', '--listen', 'h:1', '--scheduling-policy', 'lifo']), /--scheduling-policy/);
  assert.throws(() => parseWorkerArgs(['--model', '/m/x', '--listen', 'h:1', '--max-num-seqs', 'many']), /--max-num-seqs/);
  assert.throws(() => parseWorkerArgs(['--model', '/m/x', '--listen', 'h:1', '--performance-mode', 'latency']), /--performance-mode/);
  assert.throws(() => parseWorkerArgs(['--model', '/m/x', '--listen', 'h:1', '--max-num-partial-prefills', '0']), /--max-num-partial-prefills/);
  assert.throws(() => parseWorkerArgs(['--model', '/m/x', '--listen', 'h:1', '--long-prefill-token-threshold', '-1']), /--long-prefill-token-threshold/);
  assert.throws(() => parseWorkerArgs(['--model', '/m/x']), /--listen/);
});

test('the performance mode sets how prompts share a step, and vLLM\'s three settings and the chunk cap override it', () => {
  const limits = (...flags: string[]) => parseWorkerArgs(['--model', '/m/x', '--listen', 'h:1', ...flags]).prefillLimits;
  assert.deepEqual(limits('--performance-mode', 'interactivity', '--max-num-seqs', '16', '--max-num-batched-tokens', '1024'),
    { maxNumPartialPrefills: 16, maxLongPartialPrefills: 1, longPrefillTokenThreshold: 128, maxPrefillTokensBesideDecodes: 192, prefillTokensPerDecodeRow: 8, backlogPromptTokens: 4096 });
  assert.deepEqual(limits('--performance-mode', 'throughput', '--max-num-seqs', '16'),
    { maxNumPartialPrefills: 16, maxLongPartialPrefills: 16, longPrefillTokenThreshold: 64 });
  assert.deepEqual(limits('--performance-mode', 'throughput', '--max-num-partial-prefills', '2'),
    { maxNumPartialPrefills: 2, maxLongPartialPrefills: 2, longPrefillTokenThreshold: 64 });
  assert.deepEqual(limits('--max-long-partial-prefills', '2', '--long-prefill-token-threshold', '0'),
    { maxNumPartialPrefills: 64, maxLongPartialPrefills: 2, longPrefillTokenThreshold: 0, maxPrefillTokensBesideDecodes: 96, prefillTokensPerDecodeRow: 8, backlogPromptTokens: 2048 });
  assert.throws(() => limits('--max-num-partial-prefills', '1', '--max-long-partial-prefills', '2'), /--max-long-partial-prefills: max_long_partial_prefills must not exceed/);
  // The chunk cap beside decodes: its own setting in either mode, and a floor under 3/16 of a small budget.
  assert.equal(limits('--max-prefill-tokens-beside-decodes', '48').maxPrefillTokensBesideDecodes, 48);
  // A cap the configuration sets is the cap: no allowance per decode beside it.
  assert.equal(limits('--max-prefill-tokens-beside-decodes', '48').prefillTokensPerDecodeRow, undefined);
  assert.equal(limits('--performance-mode', 'throughput', '--max-prefill-tokens-beside-decodes', '200').maxPrefillTokensBesideDecodes, 200);
  assert.equal(limits('--max-num-seqs', '8', '--max-num-batched-tokens', '64').maxPrefillTokensBesideDecodes, 32);
  assert.equal(limits('--max-num-seqs', '4', '--max-num-batched-tokens', '8').maxPrefillTokensBesideDecodes, 8);
  for (const bad of ['0', '-3', '2.5', 'all']) {
    assert.throws(() => limits('--max-prefill-tokens-beside-decodes', bad), /--max-prefill-tokens-beside-decodes/, bad);
  }
});

test('--redis-url registers the worker in Redis; its heartbeat flags are checked like the configuration', () => {
  const settings = parseWorkerArgs([
    '--model', '/m/x', '--listen', '0.0.0.0:7000', '--redis-url', 'redis://10.0.0.9:6379',
    '--advertise-address', '10.0.0.5:7000', '--heartbeat-ttl-s', '5',
  ]);
  assert.deepEqual(settings.sharedState, {
    redisUrl: 'redis://10.0.0.9:6379', advertiseAddress: '10.0.0.5:7000', heartbeatIntervalMs: 1000, heartbeatTtlMs: 5000,
  });
  assert.equal(parseWorkerArgs(['--model', '/m/x', '--listen', 'h:1']).sharedState, undefined);
  assert.throws(() => parseWorkerArgs(['--model', '/m/x', '--listen', 'h:1', '--redis-url', 'localhost']), /--redis-url: expected redis:\/\//);
  assert.throws(
    () => parseWorkerArgs(['--model', '/m/x', '--listen', 'h:1', '--redis-url', 'redis://r:1', '--heartbeat-interval-s', '4']),
    /--heartbeat-ttl-s: heartbeat_ttl_s must be longer/,
  );
  assert.throws(() => parseWorkerArgs(['--model', '/m/x', '--listen', 'h:1', '--advertise-address', 'a:1']), /--advertise-address needs --redis-url/);
});

test('--log-level sets the worker\'s log level, checked', () => {
  const args = ['--model', '/m', '--listen', 'unix:/tmp/w.sock'];
  assert.equal(parseWorkerArgs([...args, '--log-level', 'debug']).logLevel, 'debug');
  assert.throws(() => parseWorkerArgs([...args, '--log-level', 'chatty']), /conduit worker: --log-level chatty: Invalid option/);
});
