// Speculative decoding changes no output: on a real (tiny, random) checkpoint, every request's
// tokens, logprobs and top logprobs with proposals verified in the step are bitwise those of
// plain decoding, whatever the proposer proposes (the true continuation, a corrupted one,
// garbage, or prompt lookup), alone and mixed in a batch, through chunked prefill, preemption
// and a cached prefix; the KV pool gets every block back, and the prefix cache only ever names
// blocks of tokens that plain decoding computed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createEngine, type Engine } from '../engine.ts';
import { extendBlockHashes, rootHash, type BlockHash } from '../kv/block-hash.ts';
import { NativeRunner } from '../native-runner.ts';
import type { Proposer, ProposerInput, SpeculativeConfig } from '../spec/proposer.ts';
import type { RequestOutput, SamplingParams, SpecDecodeCounters, StepReport } from '../types.ts';
import { RecordingRunner, TINY_EOS, TINY_VOCAB_SIZE, blockSizeTokens, load, tinyCheckpoint } from './tiny-model.ts';
import { seeded } from './spec-harness.ts';

interface Case {
  requestId: string;
  prompt: number[];
  sampling: SamplingParams;
}

interface Generated {
  tokenIds: number[];
  logprobs: number[];
  top: string;
  finishReason: string | null;
}

/** Requests of every kind: greedy, seeded, penalties, bias, logprobs, min_tokens and stop tokens, a shared prefix. */
function makeCases(random: () => number, numCases: number): Case[] {
  const token = () => 3 + Math.floor(random() * (TINY_VOCAB_SIZE - 3));
  const sharedPrefix = Array.from({ length: 3 * blockSizeTokens }, token);
  const samplings: Array<(i: number) => SamplingParams> = [
    () => ({ temperature: 0, ignoreEos: true }),
    (i) => ({ temperature: 0.9, topP: 0.9, seed: BigInt(i) * 7919n + 1n, ignoreEos: true }),
    (i) => ({ temperature: 1, topK: 20, repetitionPenalty: 1.3, frequencyPenalty: 0.4, presencePenalty: 0.3, seed: BigInt(i) + 5n, ignoreEos: true }),
    () => ({ temperature: 0, numTopLogprobs: 3, minTokens: 6, stopTokenIds: [token(), token(), token()] }),
    (i) => ({ temperature: 0.7, minP: 0.05, seed: BigInt(i), logitBias: new Map([[token(), 5], [token(), -100]]), numTopLogprobs: 2, ignoreEos: true }),
  ];
  return Array.from({ length: numCases }, (_, i) => {
    // Repeating tokens give prompt lookup something to find.
    const ownLength = 1 + Math.floor(random() * 16);
    let own = Array.from({ length: ownLength }, token);
    if (random() < 0.5) own = [...own, ...own.slice(0, Math.max(1, ownLength >> 1)), ...own];
    const prompt = random() < 0.4 ? [...sharedPrefix, ...own] : own;
    const maxTokens = 8 + Math.floor(random() * 33);
    return { requestId: `r${i}`, prompt, sampling: { ...samplings[i % samplings.length](i), maxTokens } };
  });
}

function generate(engine: Engine, { requestId, prompt, sampling }: Case, suffix: string): Promise<Generated> {
  return new Promise((resolve, reject) => {
    const result: Generated = { tokenIds: [], logprobs: [], top: '', finishReason: null };
    const tops: unknown[] = [];
    engine.generate({ requestId: requestId + suffix, promptTokenIds: prompt, sampling }, (output: RequestOutput) => {
      result.tokenIds.push(...output.newTokenIds);
      result.logprobs.push(...output.newLogprobs);
      if (output.newTopLogprobs !== undefined) tops.push(...output.newTopLogprobs);
      assert.equal(output.newLogprobs.length, output.newTokenIds.length);
      if (output.finishReason === null) return;
      if (output.finishReason === 'error') reject(new Error(`${requestId}: ${output.error?.message}`));
      result.finishReason = output.finishReason;
      result.top = JSON.stringify(tops);
      resolve(result);
    });
  });
}

/** Proposes each request's true continuation (from a plain run), a token wrong here and there. */
class OracleProposer implements Proposer {
  constructor(
    private readonly continuations: Map<string, number[]>,
    private readonly random: () => number,
    private readonly errorRate: number,
  ) {}

  propose(sequence: ProposerInput, maxNumTokens: number, out: number[]): void {
    out.length = 0;
    const known = this.continuations.get(sequence.tokenIds.slice(0, sequence.numPromptTokens).join(','));
    const numOutputTokens = sequence.tokenIds.length - sequence.numPromptTokens;
    for (let i = 0; i < maxNumTokens && known !== undefined && numOutputTokens + i < known.length; i++) {
      out.push(this.random() < this.errorRate ? Math.floor(this.random() * TINY_VOCAB_SIZE) : known[numOutputTokens + i]);
    }
  }
}

class GarbageProposer implements Proposer {
  constructor(private readonly random: () => number) {}
  propose(_sequence: ProposerInput, maxNumTokens: number, out: number[]): void {
    out.length = 0;
    const count = Math.floor(this.random() * (maxNumTokens + 1));
    for (let i = 0; i < count; i++) out.push(Math.floor(this.random() * TINY_VOCAB_SIZE));
  }
}

const limits = { maxModelLen: 128, maxNumSeqs: 6, maxNumBatchedTokens: 48 };

interface Run {
  outputs: Generated[];
  storedHashes: Set<BlockHash>;
  counters: SpecDecodeCounters;
  numPreempted: number;
  numVerifiedSteps: number;
}

async function run(modelDir: string, cases: Case[], options: { numKvBlocks: number; batched: boolean; speculative?: SpeculativeConfig; proposer?: Proposer }): Promise<Run> {
  const runner = new RecordingRunner(new NativeRunner(await load(modelDir, options.numKvBlocks), limits));
  const engine = createEngine(runner, {
    servedName: 'tiny',
    maxNumSeqs: limits.maxNumSeqs,
    maxNumBatchedTokens: limits.maxNumBatchedTokens,
    prefillLimits: { maxNumPartialPrefills: 6, maxLongPartialPrefills: 6, longPrefillTokenThreshold: 64 },
    generationDefaults: { eosTokenIds: [TINY_EOS] },
    speculative: options.speculative,
    proposer: options.proposer,
  });
  const storedHashes = new Set<BlockHash>();
  const counters: SpecDecodeCounters = { numDrafts: 0, numDraftTokens: 0, numAcceptedTokens: 0, numAcceptedTokensPerPosition: [] };
  let numPreempted = 0;
  engine.onReport((report: StepReport) => {
    for (const event of report.events) if (event.kind === 'stored') for (const hash of event.blockHashes) storedHashes.add(hash);
    numPreempted += report.stats?.numPreempted ?? 0;
    const spec = report.stats?.specDecode;
    if (spec === undefined) return;
    counters.numDrafts += spec.numDrafts;
    counters.numDraftTokens += spec.numDraftTokens;
    counters.numAcceptedTokens += spec.numAcceptedTokens;
    spec.numAcceptedTokensPerPosition.forEach((count, position) => (counters.numAcceptedTokensPerPosition[position] = (counters.numAcceptedTokensPerPosition[position] ?? 0) + count));
  });
  try {
    let outputs: Generated[];
    if (options.batched) {
      outputs = await Promise.all(cases.map((c) => generate(engine, c, '')));
    } else {
      outputs = [];
      for (const c of cases) outputs.push(await generate(engine, c, ''));
    }
    // Every block back in the pool: none leaked by a rejected proposal.
    assert.equal(engine.health().load.numFreeBlocks, options.numKvBlocks, 'every KV block is free at the end');
    const numVerifiedSteps = runner.steps.filter((step) => step.scheduled.some((entry) => entry.draftTokenIds.length > 0)).length;
    return { outputs, storedHashes, counters, numPreempted, numVerifiedSteps };
  } finally {
    await engine.close();
  }
}

/** Hashes of every full block of tokens plain decoding computes (all known tokens but the last). */
function computedBlockHashes(cases: Case[], outputs: Generated[]): Set<BlockHash> {
  const root = rootHash({ model: 'tiny' });
  const hashes = new Set<BlockHash>();
  cases.forEach((c, i) => {
    const tokenIds = [...c.prompt, ...outputs[i].tokenIds];
    const numBlocks = Math.floor((tokenIds.length - 1) / blockSizeTokens);
    for (const hash of extendBlockHashes([], root, tokenIds, blockSizeTokens, numBlocks)) hashes.add(hash);
  });
  return hashes;
}

function assertSameOutputs(actual: Generated[], expected: Generated[], cases: Case[], label: string, seed: number): void {
  actual.forEach((output, i) => {
    const context = `${label}: ${cases[i].requestId} (seed ${seed}) ${JSON.stringify(cases[i].sampling, (_, v) => (typeof v === 'bigint' ? `${v}n` : v))}`;
    assert.deepEqual(output.tokenIds, expected[i].tokenIds, context);
    // Bitwise: Float32 logprobs compared as numbers (NaN never occurs for a sampled token).
    assert.deepEqual(output.logprobs, expected[i].logprobs, context);
    assert.equal(output.top, expected[i].top, context);
    assert.equal(output.finishReason, expected[i].finishReason, context);
  });
}

test('speculative decoding emits bitwise the tokens and logprobs of plain decoding, whatever is proposed', async (t) => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-spec-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const modelDir = tinyCheckpoint(dir);
  const { seed, random } = seeded(t);
  const cases = makeCases(random, 20);
  // Room for every request at once: the reference, alone, needs no preemption.
  const plain = await run(modelDir, cases, { numKvBlocks: 256, batched: false });
  const continuations = new Map(cases.map((c, i) => [c.prompt.join(','), plain.outputs[i].tokenIds]));
  const expectedHashes = computedBlockHashes(cases, plain.outputs);
  for (const hash of plain.storedHashes) assert.ok(expectedHashes.has(hash));

  const fixed: SpeculativeConfig = { method: 'ngram', numSpeculativeTokens: 5, promptLookupMin: 1, promptLookupMax: 3, adaptive: false };
  const suffix: SpeculativeConfig = { ...fixed, method: 'suffix', suffix: { maxTreeDepth: 12, maxSpecFactor: 2, minTokenProb: 0.05 } };
  const variants: Array<{ label: string; batched: boolean; numKvBlocks: number; proposer?: Proposer; speculative: SpeculativeConfig; accepts: boolean }> = [
    { label: 'oracle, alone', batched: false, numKvBlocks: 256, proposer: new OracleProposer(continuations, random, 0.15), speculative: fixed, accepts: true },
    // 40 blocks of 4 tokens: six requests of up to ~90 tokens preempt each other.
    { label: 'oracle, batched under preemption', batched: true, numKvBlocks: 40, proposer: new OracleProposer(continuations, random, 0.25), speculative: fixed, accepts: true },
    { label: 'garbage, batched under preemption', batched: true, numKvBlocks: 40, proposer: new GarbageProposer(random), speculative: fixed, accepts: false },
    { label: 'ngram, batched', batched: true, numKvBlocks: 256, speculative: fixed, accepts: false },
    { label: 'ngram adaptive, batched', batched: true, numKvBlocks: 40, speculative: { ...fixed, adaptive: true }, accepts: false },
    // One after another, each request learns from the outputs of those before it.
    { label: 'suffix, alone', batched: false, numKvBlocks: 256, speculative: suffix, accepts: false },
    { label: 'suffix adaptive, batched under preemption', batched: true, numKvBlocks: 40, speculative: { ...suffix, adaptive: true }, accepts: false },
  ];
  for (const variant of variants) {
    const result = await run(modelDir, cases, variant);
    assertSameOutputs(result.outputs, plain.outputs, cases, variant.label, seed);
    assert.ok(result.numVerifiedSteps > 0 || variant.speculative.adaptive === true, `${variant.label}: proposals were verified`);
    for (const hash of result.storedHashes) assert.ok(expectedHashes.has(hash), `${variant.label}: the prefix cache named a block plain decoding never computed`);
    const { counters } = result;
    assert.ok(counters.numAcceptedTokens <= counters.numDraftTokens);
    // A proposal is accepted only after every one before it.
    const perPosition = counters.numAcceptedTokensPerPosition;
    assert.equal(perPosition.reduce((sum, count) => sum + count, 0), counters.numAcceptedTokens);
    for (let position = 1; position < perPosition.length; position++) assert.ok(perPosition[position] <= perPosition[position - 1]);
    if (variant.accepts) {
      assert.ok(counters.numAcceptedTokens > 0, `${variant.label}: proposals were accepted`);
      assert.ok(counters.numAcceptedTokens < counters.numDraftTokens, `${variant.label}: proposals were rejected`);
    }
    if (variant.numKvBlocks === 40 && variant.batched) assert.ok(result.numPreempted > 0, `${variant.label}: a request was preempted`);
    if (!variant.batched) assert.deepEqual([...result.storedHashes].sort(), [...plain.storedHashes].sort(), `${variant.label}: the prefix cache holds what plain decoding's does`);
  }
});
