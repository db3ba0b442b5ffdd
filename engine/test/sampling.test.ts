import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { readGenerationDefaults } from '../generation-config.ts';
import { resolveSampling, type ResolvedSampling } from '../sampling.ts';

const VOCAB_SIZE = 1000;

function withCheckpoint(files: Record<string, unknown>, body: (dir: string) => void) {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-genconfig-'));
  try {
    for (const [name, json] of Object.entries(files)) writeFileSync(path.join(dir, name), JSON.stringify(json));
    body(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test('generation_config.json supplies defaults that request fields override', () => {
  withCheckpoint(
    {
      'config.json': { eos_token_id: 1 },
      'generation_config.json': { temperature: 0.6, top_p: 0.9, top_k: 20, max_new_tokens: 5, eos_token_id: [2, 3] },
    },
    (dir) => {
      const defaults = readGenerationDefaults(dir);
      assert.deepEqual(defaults, { temperature: 0.6, topP: 0.9, topK: 20, maxNewTokens: 5, eosTokenIds: [2, 3] });
      const fromFile = resolveSampling({ seed: 7n }, defaults, 100, VOCAB_SIZE) as ResolvedSampling;
      assert.deepEqual(fromFile, {
        temperature: 0.6, topP: 0.9, topK: 20, minP: 0, presencePenalty: 0, frequencyPenalty: 0, repetitionPenalty: 1,
        logitBias: new Map(), seed: 7n, maxTokens: 5, minTokens: 0, stopTokenIds: [], ignoreEos: false,
        numTopLogprobs: 0, numPromptLogprobs: null,
      });
      const fromRequest = resolveSampling({ temperature: 0, topP: 1, topK: 0, maxTokens: 9 }, defaults, 100, VOCAB_SIZE) as ResolvedSampling;
      assert.equal(fromRequest.temperature, 0);
      assert.equal(fromRequest.topP, 1);
      assert.equal(fromRequest.topK, 0);
      assert.equal(fromRequest.maxTokens, 9);
    },
  );
});

test('do_sample false means greedy, and config.json eos_token_id is the fallback', () => {
  withCheckpoint(
    { 'config.json': { eos_token_id: 1 }, 'generation_config.json': { do_sample: false, temperature: 0.7 } },
    (dir) => assert.deepEqual(readGenerationDefaults(dir), { temperature: 0, topP: undefined, topK: undefined, maxNewTokens: undefined, eosTokenIds: [1] }),
  );
});

test('without a generation config a request samples at temperature 1 up to the context limit', () => {
  withCheckpoint({ 'config.json': {} }, (dir) => {
    const resolved = resolveSampling({}, readGenerationDefaults(dir), 42, VOCAB_SIZE) as ResolvedSampling;
    assert.equal(resolved.temperature, 1);
    assert.equal(resolved.topP, 1);
    assert.equal(resolved.topK, 0);
    assert.equal(resolved.maxTokens, 42);
  });
});

test('a request without a seed gets its own random 64-bit seed', () => {
  const seeds = new Set<bigint>();
  for (let i = 0; i < 8; i++) seeds.add((resolveSampling({}, { eosTokenIds: [] }, 10, VOCAB_SIZE) as ResolvedSampling).seed);
  assert.equal(seeds.size, 8);
  for (const seed of seeds) assert.ok(seed >= 0n && seed < 1n << 64n);
});

test('invalid sampling values are refused with the field, expectation and value', () => {
  const refusal = resolveSampling({ topP: 1.5 }, { eosTokenIds: [] }, 10, VOCAB_SIZE);
  assert.deepEqual(refusal, {
    code: 'invalid_request',
    message: 'Expected a number in (0, 1] for topP but received 1.5 of type number',
  });
  assert.equal((resolveSampling({ seed: 1n << 64n }, { eosTokenIds: [] }, 10, VOCAB_SIZE) as { code: string }).code, 'invalid_request');
  assert.equal((resolveSampling({ maxTokens: 0 }, { eosTokenIds: [] }, 10, VOCAB_SIZE) as { code: string }).code, 'invalid_request');
});

test('penalties, min-p, logit bias, min_tokens and logprob counts are checked against their ranges', () => {
  const codeOf = (params: Parameters<typeof resolveSampling>[0]) => (resolveSampling(params, { eosTokenIds: [] }, 10, VOCAB_SIZE) as { code?: string }).code;
  assert.equal(codeOf({ minP: 0.05, presencePenalty: -2, frequencyPenalty: 2, repetitionPenalty: 1.3, minTokens: 10 }), undefined);
  assert.equal(codeOf({ logitBias: new Map([[3, -100], [4, -Infinity]]), numTopLogprobs: 20, numPromptLogprobs: 0 }), undefined);
  for (const params of [
    { minP: 1.5 },
    { presencePenalty: 2.5 },
    { frequencyPenalty: Number.NaN },
    { repetitionPenalty: 0 },
    { repetitionPenalty: 1e308 },
    { topK: 2 ** 31 },
    { logitBias: new Map([[VOCAB_SIZE, 1]]) },
    { logitBias: new Map([[1, Number.NaN]]) },
    { logitBias: new Map([[1, Infinity]]) },
    { minTokens: 11 },
    { minTokens: -1 },
    { numTopLogprobs: 21 },
    { numPromptLogprobs: 1.5 },
  ]) {
    assert.equal(codeOf(params), 'invalid_request', JSON.stringify(params, (_, value) => (value instanceof Map ? [...value] : value)));
  }
});
