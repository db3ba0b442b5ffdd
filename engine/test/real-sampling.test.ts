// Every sampling parameter through the engine on a real (tiny, random) checkpoint, against a
// reference that drives the runtime by hand, one sequence alone, one token per call, building
// the penalty history, the bias and the min_tokens ban from first principles. The engine runs
// all requests at once with chunked prompts and preemption; the runtime is batch-invariant, so
// tokens, logprobs, top logprobs and prompt logprobs must match bit for bit. (The runtime's
// processing itself is checked against an fp64 reference in native/test.)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { NativeModel } from '../../native/api.ts';
import { MAX_TOP_LOGPROBS, SEQ_PROMPT_LOGPROBS, SEQ_SAMPLE } from '../../native/api.ts';
import { buildBatch, penaltyHistory } from '../../native/test/helpers.ts';
import { createEngine, type Engine } from '../engine.ts';
import { NativeRunner } from '../native-runner.ts';
import type { PromptTokenLogprobs, RequestOutput, SamplingParams, TokenLogprobs } from '../types.ts';
import { RecordingRunner, TINY_EOS, TINY_VOCAB_SIZE, load, tinyCheckpoint } from './tiny-model.ts';

interface Case {
  requestId: string;
  prompt: number[];
  sampling: SamplingParams;
}

const prompt = (first: number, length: number) => Array.from({ length }, (_, i) => (first + 7 * i) % TINY_VOCAB_SIZE);

/** Every parameter, alone and combined; maxTokens ends each unless a stop token does. */
const cases: Case[] = [
  { requestId: 'penalties', prompt: prompt(3, 14), sampling: { temperature: 0, maxTokens: 10, presencePenalty: 0.6, frequencyPenalty: 0.9 } },
  { requestId: 'repetition', prompt: prompt(40, 9), sampling: { temperature: 0, maxTokens: 10, repetitionPenalty: 1.8 } },
  { requestId: 'repetition-below-1', prompt: prompt(41, 9), sampling: { temperature: 0, maxTokens: 10, repetitionPenalty: 0.5 } },
  { requestId: 'bias', prompt: prompt(11, 6), sampling: { temperature: 0, maxTokens: 8, logitBias: new Map([[77, 4], [78, 3.5], [9, -100]]) } },
  { requestId: 'min-p', prompt: prompt(90, 11), sampling: { temperature: 1.3, minP: 0.2, seed: 99n, maxTokens: 10 } },
  {
    requestId: 'everything',
    prompt: prompt(5, 17),
    sampling: {
      temperature: 0.9, topK: 50, topP: 0.9, minP: 0.05, seed: 1234n, presencePenalty: -0.5, frequencyPenalty: 0.3,
      repetitionPenalty: 1.2, logitBias: new Map([[100, 2]]), maxTokens: 12, numTopLogprobs: 5,
    },
  },
  // EOS pushed to the top: min_tokens holds it off for 4 tokens, then it ends the output.
  { requestId: 'min-tokens', prompt: prompt(60, 7), sampling: { temperature: 0, maxTokens: 12, minTokens: 4, logitBias: new Map([[TINY_EOS, 60]]) } },
  { requestId: 'top-logprobs', prompt: prompt(70, 10), sampling: { temperature: 0, maxTokens: 6, numTopLogprobs: MAX_TOP_LOGPROBS } },
  { requestId: 'prompt-logprobs', prompt: prompt(20, 19), sampling: { temperature: 0, maxTokens: 3, numPromptLogprobs: 3 } },
  { requestId: 'prompt-logprobs-only', prompt: prompt(21, 13), sampling: { temperature: 0, maxTokens: 2, numPromptLogprobs: 0 } },
];

interface Trace {
  tokenIds: number[];
  logprobs: number[];
  topLogprobs: TokenLogprobs[];
  promptLogprobs: PromptTokenLogprobs[] | null;
  finishReason: string;
}

function topOf(ids: Int32Array, logprobs: Float32Array, row: number, numTop: number, logprob: number): TokenLogprobs {
  const begin = row * MAX_TOP_LOGPROBS;
  return { logprob, topTokenIds: Array.from(ids.subarray(begin, begin + numTop)), topLogprobs: Array.from(logprobs.subarray(begin, begin + numTop)) };
}

/** One sequence alone, blocks 0.., the whole prompt in one call, then a token per call. */
async function referenceRun(model: NativeModel, { prompt, sampling }: Case): Promise<Trace> {
  const minTokens = sampling.minTokens ?? 0;
  const maxTokens = sampling.maxTokens!;
  const blockIds = Array.from({ length: Math.ceil((prompt.length + maxTokens) / 4) }, (_, i) => i);
  const tokens = prompt.slice();
  const trace: Trace = { tokenIds: [], logprobs: [], topLogprobs: [], promptLogprobs: null, finishReason: 'length' };
  for (let start = 0; trace.tokenIds.length < maxTokens; start = tokens.length - 1) {
    const outputs = tokens.slice(prompt.length);
    const bias = new Map(sampling.logitBias ?? []);
    if (outputs.length < minTokens) bias.set(TINY_EOS, -Infinity);
    const scoresPrompt = start === 0 && sampling.numPromptLogprobs !== undefined;
    const result = await model.forward(
      buildBatch([
        {
          tokenIds: tokens.slice(start),
          startPosition: start,
          blockIds,
          flags: SEQ_SAMPLE | (scoresPrompt ? SEQ_PROMPT_LOGPROBS : 0),
          temperature: sampling.temperature,
          topP: sampling.topP,
          topK: sampling.topK,
          minP: sampling.minP,
          seed: sampling.seed,
          outputIndex: outputs.length,
          presencePenalty: sampling.presencePenalty,
          frequencyPenalty: sampling.frequencyPenalty,
          repetitionPenalty: sampling.repetitionPenalty,
          penaltyHistory: penaltyHistory(prompt, outputs),
          logitBias: [...bias],
          numTopLogprobs: sampling.numTopLogprobs,
          numPromptTopLogprobs: scoresPrompt ? sampling.numPromptLogprobs : 0,
        },
      ]),
    );
    if (scoresPrompt) {
      const numTop = sampling.numPromptLogprobs!;
      trace.promptLogprobs = prompt.slice(1).map((_, position) => ({
        ...topOf(result.promptTopTokenIds, result.promptTopLogprobs, position, numTop, result.promptLogprobs[position]),
        rank: result.promptRanks[position],
      }));
    }
    const tokenId = result.sampledTokenIds[0];
    tokens.push(tokenId);
    trace.tokenIds.push(tokenId);
    trace.logprobs.push(result.sampledLogprobs[0]);
    if ((sampling.numTopLogprobs ?? 0) > 0) {
      trace.topLogprobs.push(topOf(result.topTokenIds, result.topLogprobs, 0, sampling.numTopLogprobs!, result.sampledLogprobs[0]));
    }
    if (tokenId === TINY_EOS && trace.tokenIds.length > minTokens) {
      trace.finishReason = 'stop';
      break;
    }
  }
  return trace;
}

/**
 * What the engine hands a request, step by step. Each output is kept as handed over and as a copy
 * made then: the runtime writes every pass into the same arrays (native/index.ts), so an output
 * that held a view of them would change under a later step, and the two would differ at the end.
 */
function engineRun(engine: Engine, { requestId, prompt, sampling }: Case): Promise<Trace> {
  return new Promise((resolve, reject) => {
    const trace: Trace = { tokenIds: [], logprobs: [], topLogprobs: [], promptLogprobs: null, finishReason: '' };
    const kept: RequestOutput[] = [];
    const copies: RequestOutput[] = [];
    engine.generate({ requestId, promptTokenIds: prompt, sampling }, (output: RequestOutput) => {
      kept.push(output);
      copies.push(structuredClone(output));
      trace.tokenIds.push(...output.newTokenIds);
      trace.logprobs.push(...output.newLogprobs);
      trace.topLogprobs.push(...(output.newTopLogprobs ?? []));
      if (output.promptLogprobs !== undefined) {
        assert.equal(trace.promptLogprobs, null, `${requestId}: prompt logprobs come once`);
        trace.promptLogprobs = output.promptLogprobs;
      }
      if (output.finishReason === null) return;
      if (output.error !== undefined) reject(new Error(`${requestId}: ${output.error.message}`));
      trace.finishReason = output.finishReason;
      // Every step after each earlier output has run by now.
      try {
        assert.deepEqual(kept, copies, `${requestId}: an output changed after it was handed over`);
        resolve(trace);
      } catch (err) {
        reject(err);
      }
    });
  });
}

/** NaN-safe bitwise comparison: numbers as their float32 bit patterns' strings. */
function bits(trace: Trace) {
  const f32 = (values: readonly number[]) => Array.from(new Float32Array(values), (x) => x.toString());
  const top = (entry: TokenLogprobs) => [f32([entry.logprob]), entry.topTokenIds, f32(entry.topLogprobs)];
  return {
    tokenIds: trace.tokenIds,
    logprobs: f32(trace.logprobs),
    topLogprobs: trace.topLogprobs.map(top),
    promptLogprobs: trace.promptLogprobs?.map((entry) => [...top(entry), entry.rank]) ?? null,
    finishReason: trace.finishReason,
  };
}

test('every sampling parameter gives through the engine what the runtime gives one sequence alone', async (t) => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-sampling-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const modelDir = tinyCheckpoint(dir);

  const referenceModel = await load(modelDir, 16);
  const expected = new Map<string, Trace>();
  const unprocessed = new Map<string, Trace>();
  try {
    for (const entry of cases) expected.set(entry.requestId, await referenceRun(referenceModel, entry));
    for (const requestId of ['penalties', 'repetition', 'repetition-below-1', 'min-p']) {
      const entry = cases.find((item) => item.requestId === requestId)!;
      const { temperature, seed, maxTokens } = entry.sampling;
      unprocessed.set(requestId, await referenceRun(referenceModel, { ...entry, sampling: { temperature, seed, maxTokens } }));
    }
  } finally {
    referenceModel.close();
  }
  // The cases exercise what they name.
  for (const [requestId, trace] of unprocessed) assert.notDeepEqual(expected.get(requestId)!.tokenIds, trace.tokenIds, `${requestId} changes the output`);
  const minTokens = expected.get('min-tokens')!;
  assert.deepEqual([minTokens.tokenIds.length, minTokens.tokenIds.at(-1), minTokens.finishReason], [5, TINY_EOS, 'stop']);
  assert.ok(!minTokens.tokenIds.slice(0, 4).includes(TINY_EOS));
  assert.ok(expected.get('bias')!.tokenIds.every((tokenId) => tokenId === 77), 'a bias of +4 takes over this model');
  assert.equal(expected.get('prompt-logprobs')!.promptLogprobs!.length, 18);

  // 12 blocks of 4 hold any one request, not all; 8 tokens a step chunks the prompts.
  const limits = { maxModelLen: 128, maxNumSeqs: 4, maxNumBatchedTokens: 8 };
  const runner = new RecordingRunner(new NativeRunner(await load(modelDir, 12), limits));
  const engine = createEngine(runner, {
    servedName: 'tiny',
    maxNumSeqs: limits.maxNumSeqs,
    maxNumBatchedTokens: limits.maxNumBatchedTokens,
    generationDefaults: { eosTokenIds: [TINY_EOS] },
  });
  t.after(() => engine.close());
  const traces = await Promise.all(cases.map((entry) => engineRun(engine, entry)));
  for (const [index, entry] of cases.entries()) {
    assert.deepEqual(bits(traces[index]), bits(expected.get(entry.requestId)!), entry.requestId);
  }
  assert.ok(runner.steps.some((step) => step.preemptedRequestIds.length > 0), 'a request was preempted');
  assert.ok(runner.steps.some((step) => step.scheduled.some((item) => item.scoresPrompt && !item.sample)), 'a scored prompt was chunked');

  // Without the ban, the same request stops at once: min_tokens is what held EOS off.
  const unbanned = await engineRun(engine, { ...cases.find((entry) => entry.requestId === 'min-tokens')!, requestId: 'no-min', sampling: { temperature: 0, maxTokens: 12, logitBias: new Map([[TINY_EOS, 60]]) } });
  assert.deepEqual(unbanned.tokenIds, [TINY_EOS]);
});
