// Structured outputs' cost on the 125 M benchmark model (tools/bench-model.ts, with the GPT-2
// vocabulary of tools/bench-tokenizer.ts), the engine run in process with its grammar threads:
//
// 1. Decode throughput, constrained against free, at batch 1 and 32, in alternating rounds of one
//    run: the same prompts and seeds, every request running to max_tokens (free ones ignore EOS;
//    constrained ones follow a JSON schema whose array is never long enough to close). Three
//    constrained modes: masks filled while the forward pass runs (the default) with jump-forward
//    off, so every token is sampled under its mask (the grammar's whole cost, the target's
//    figure); the same with jump-forward (forced tokens ride in the next step); and masks filled
//    before the forward pass starts (the overlap's reference). Target: >= 0.9 x free at both
//    batch sizes (vLLM with xgrammar: 0.71 x at batch 1, vLLM PR 10835).
// 2. Time to first token with a schema the worker has never seen (compiled while the prompt is
//    computed) against one it has cached, at two prompt lengths. Target: new <= 1.2 x cached.
//    The schema is an agent's nested object of four properties. The first tokens of both are what
//    the schema forces from its start ({"name": "), output as the first step ends; so the time to
//    the first sampled token is printed too: there a new schema's compile shows wherever the
//    prompt's prefill is shorter than it. On a machine whose cores the forward pass takes, the
//    compile would share a core with one of the pass's threads and the first step wait for that
//    one: the engine runs steps on the cores the compiles leave (engine/compute-threads.ts). Two
//    references on the 32-token prompt: the same engine with that rule off (steps on every
//    thread while a grammar compiles), and the grammar threads at a raised niceness instead
//    (--grammar-nice, 10 by default: GrammarServiceSettings.threadNice, not the default).
//
//   npm run bench:structured [-- --threads N --grammar-threads N --grammar-nice N --rounds 3 --max-tokens 96]
import os from 'node:os';
import { parseArgs } from 'node:util';
import { validateConfig } from '../configs/schema.ts';
import { createEngine, type Engine } from '../engine/engine.ts';
import { GrammarService } from '../engine/grammar/service.ts';
import { NativeRunner } from '../engine/native-runner.ts';
import type { GenerateRequest, StructuredOutput } from '../engine/types.ts';
import { loadModel } from '../native/index.ts';
import { BENCH_SHAPE, describeCpu, ensureBenchCheckpoint } from './bench-model.ts';
import { ensureBenchTokenizer } from './bench-tokenizer.ts';
import { median } from '../loadtest/stats.ts';

const BLOCK_SIZE_TOKENS = 16;
const MAX_MODEL_LEN = 2048;
const MAX_NUM_SEQS = 32;
const EOS = 2;
const PROMPT_TOKENS = 32;

/** An order book: lines of a SKU and a quantity, at least 500 of them, so no answer closes within max_tokens. */
const ORDER_SCHEMA = {
  type: 'object',
  properties: {
    customer: { type: 'string', maxLength: 16 },
    lines: {
      type: 'array',
      minItems: 500,
      items: {
        type: 'object',
        properties: { sku: { type: 'string', pattern: '^[A-Z]{3}-[0-9]{4}$' }, quantity: { type: 'integer', minimum: 1, maximum: 999 }, rush: { type: 'boolean' } },
        required: ['sku', 'quantity', 'rush'],
        additionalProperties: false,
      },
    },
  },
  required: ['customer', 'lines'],
  additionalProperties: false,
};

type Mode = 'free' | 'masked' | 'jump-forward' | 'masked, serial';

function tokens(count: number, salt: number): number[] {
  // Ids past the special tokens, spread over the vocabulary.
  return Array.from({ length: count }, (_, i) => 3 + ((salt * 7919 + i * 104729 + 17) % (BENCH_SHAPE.vocabSize - 3)));
}

async function startEngine(modelDir: string, numThreads: number, grammarThreads: number, overlapForward: boolean, threadNice = 0, numCores?: number, deferGrammarCompiles: 'short-prompts' | 'never' = 'short-prompts') {
  const model = await loadModel({ modelDir, dtype: 'auto', kvCacheDtype: 'auto', numKvBlocks: 2048, blockSizeTokens: BLOCK_SIZE_TOKENS, numThreads, kernel: 'auto' });
  const runner = new NativeRunner(model, { maxModelLen: MAX_MODEL_LEN, maxNumSeqs: MAX_NUM_SEQS, maxNumBatchedTokens: 1024 });
  const grammars = new GrammarService({ modelDir, vocabSize: BENCH_SHAPE.vocabSize, eosTokenIds: [EOS], maxNumSeqs: MAX_NUM_SEQS, numThreads: grammarThreads, overlapForward, threadNice });
  return createEngine(runner, { servedName: 'bench', maxNumSeqs: MAX_NUM_SEQS, maxNumBatchedTokens: 1024, generationDefaults: { eosTokenIds: [EOS] }, grammars, numCores, deferGrammarCompiles });
}

interface Outcome {
  /** To the first output token (a grammar's forced start may come before any prefill). */
  ttftMs: number;
  /** To the first sampled token (the output that reports the prefill time). */
  firstSampleMs: number;
  numOutputTokens: number;
}

/** Resolves with the request's times and its output's length; rejects on an error. */
function run(engine: Engine, request: GenerateRequest): Promise<Outcome> {
  const start = performance.now();
  let ttftMs = -1;
  let firstSampleMs = -1;
  return new Promise((resolve, reject) => {
    engine.generate(request, (output) => {
      if (ttftMs < 0 && output.newTokenIds.length > 0) ttftMs = performance.now() - start;
      if (firstSampleMs < 0 && output.prefillTimeMs !== undefined) firstSampleMs = performance.now() - start;
      if (output.finishReason === null) return;
      if (output.error !== undefined) reject(new Error(`${request.requestId}: ${output.error.message}`));
      else resolve({ ttftMs, firstSampleMs, numOutputTokens: output.numOutputTokens });
    });
  });
}

function requestOf(mode: Mode, id: string, index: number, maxTokens: number): GenerateRequest {
  const structured: StructuredOutput | undefined =
    mode === 'free' ? undefined : { constraint: { kind: 'json_schema', schema: JSON.stringify(ORDER_SCHEMA) }, jumpForward: mode === 'jump-forward' };
  return {
    requestId: id,
    promptTokenIds: tokens(PROMPT_TOKENS, index),
    sampling: { temperature: 1, seed: BigInt(index), maxTokens, ignoreEos: structured === undefined },
    structuredOutput: structured,
  };
}

/** Output tokens per second of batchSize requests at once (each one at a time for batch 1). */
async function throughput(engine: Engine, mode: Mode, batchSize: number, maxTokens: number, round: number): Promise<number> {
  const requests = Array.from({ length: batchSize }, (_, i) => requestOf(mode, `${mode}-${batchSize}-${round}-${i}`, i, maxTokens));
  const start = performance.now();
  const outcomes = await Promise.all(requests.map((request) => run(engine, request)));
  const seconds = (performance.now() - start) / 1000;
  const numTokens = outcomes.reduce((sum, outcome) => sum + outcome.numOutputTokens, 0);
  if (numTokens !== batchSize * maxTokens) throw new Error(`${mode}: ${numTokens} tokens, expected ${batchSize * maxTokens}`);
  return numTokens / seconds;
}

const fmt = (value: number, digits = 1) => value.toFixed(digits);

/**
 * A schema of the kind agents send (a nested object of four properties, as the research's
 * measured one), made new by a property named after salt: the grammar cache is keyed by the
 * schema's text.
 */
function freshSchema(salt: number): string {
  return JSON.stringify({
    type: 'object',
    properties: {
      name: { type: 'string' },
      age: { type: 'integer', minimum: 0, maximum: 130 },
      address: {
        type: 'object',
        properties: { city: { type: 'string' }, zip: { type: 'string', pattern: '^[0-9]{5}$' } },
        required: ['city', 'zip'],
        additionalProperties: false,
      },
      [`tag_${salt}`]: { type: 'string', enum: ['new', 'returning'] },
    },
    required: ['name', 'age', 'address', `tag_${salt}`],
    additionalProperties: false,
  });
}

/** Medians over rounds of a new schema then the same one cached; series keeps each call's schemas apart from every other's. */
async function timeToFirstToken(engine: Engine, promptTokens: number, rounds: number, series: number) {
  const fresh: Outcome[] = [];
  const cached: Outcome[] = [];
  for (let round = 0; round < rounds; round++) {
    const schema = freshSchema(series * 1_000_000 + promptTokens * 1000 + round);
    const request = (id: string, salt: number): GenerateRequest => ({
      requestId: id,
      // A fresh prompt each time: the prefix cache must not shorten the second's prefill.
      promptTokenIds: tokens(promptTokens, salt),
      // Past the forced start ({"name": "), so a token is sampled.
      sampling: { temperature: 1, seed: 1n, maxTokens: 12 },
      structuredOutput: { constraint: { kind: 'json_schema', schema } },
    });
    fresh.push(await run(engine, request(`new-${series}-${promptTokens}-${round}`, 100_000 + series * 10_000 + promptTokens * 100 + round)));
    cached.push(await run(engine, request(`cached-${series}-${promptTokens}-${round}`, 200_000 + series * 10_000 + promptTokens * 100 + round)));
  }
  const of = (outcomes: Outcome[], key: 'ttftMs' | 'firstSampleMs') => median(outcomes.map((outcome) => outcome[key]));
  return { newMs: of(fresh, 'ttftMs'), cachedMs: of(cached, 'ttftMs'), newSampleMs: of(fresh, 'firstSampleMs'), cachedSampleMs: of(cached, 'firstSampleMs') };
}

async function main() {
  const { values } = parseArgs({
    options: {
      threads: { type: 'string', default: String(os.availableParallelism()) },
      rounds: { type: 'string', default: '3' },
      'max-tokens': { type: 'string', default: '96' },
      'grammar-nice': { type: 'string', default: '10' },
      'grammar-threads': { type: 'string', default: String(validateConfig({ models: [{ path: '.' }] }, 'bench').models[0].grammar_threads) },
    },
  });
  const numThreads = Number(values.threads);
  const numRounds = Number(values.rounds);
  const maxTokens = Number(values['max-tokens']);
  const grammarThreads = Number(values['grammar-threads']);
  const grammarNice = Number(values['grammar-nice']);
  console.log(`CPU: ${describeCpu()}`);
  console.log(`model: 125 M benchmark checkpoint (bf16, GPT-2's first 32,000 tokens), ${numThreads} threads, kernel auto; ${grammarThreads} grammar threads`);
  const modelDir = ensureBenchCheckpoint();
  ensureBenchTokenizer(modelDir);

  const overlapped = await startEngine(modelDir, numThreads, grammarThreads, true);
  const serial = await startEngine(modelDir, numThreads, grammarThreads, false);
  const niced = await startEngine(modelDir, numThreads, grammarThreads, true, grammarNice);
  // Cores without end: no step ever leaves one to a compile.
  const unlowered = await startEngine(modelDir, numThreads, grammarThreads, true, 0, Number.MAX_SAFE_INTEGER);
  // Every new grammar compiled from admission, beside its prompt's pass (the schedule before deferral).
  const eager = await startEngine(modelDir, numThreads, grammarThreads, true, 0, undefined, 'never');
  try {
    // Warm all: the runtime, the grammar threads (each loads the vocabulary), the schema's grammar.
    for (const engine of [overlapped, serial, niced, unlowered, eager]) {
      await Promise.all([0, 1].map((i) => run(engine, requestOf('masked', `warm-${i}`, i, 8))));
      await run(engine, requestOf('free', 'warm-free', 0, 8));
    }
    const modes: Array<[Mode, Engine]> = [['free', overlapped], ['masked', overlapped], ['jump-forward', overlapped], ['masked, serial', serial]];
    const verdicts: string[] = [];
    const verdict = (name: string, ratio: number, target: number, atLeast: boolean) =>
      verdicts.push(`${name} ${fmt(ratio, 2)} x (target ${atLeast ? '>=' : '<='} ${target} x: ${(atLeast ? ratio >= target : ratio <= target) ? 'met' : 'NOT met'})`);
    for (const batchSize of [1, MAX_NUM_SEQS]) {
      const rates = new Map<Mode, number[]>(modes.map(([mode]) => [mode, []]));
      for (let round = 0; round < numRounds; round++) {
        for (const [mode, engine] of modes) rates.get(mode)!.push(await throughput(engine, mode, batchSize, maxTokens, round));
      }
      const ratio = (mode: Mode) => median(rates.get(mode)!.map((rate, round) => rate / rates.get('free')![round]));
      const rate = (mode: Mode) => fmt(median(rates.get(mode)!));
      console.log(
        `batch ${batchSize} (${maxTokens} tokens each, medians of ${numRounds} rounds): free ${rate('free')} tok/s; ` +
          `constrained ${rate('masked')} tok/s = ${fmt(ratio('masked'), 2)} x free (target >= 0.9 x); ` +
          `with jump-forward ${rate('jump-forward')} tok/s = ${fmt(ratio('jump-forward'), 2)} x; ` +
          `masks filled before the forward pass ${rate('masked, serial')} tok/s = ${fmt(ratio('masked, serial'), 2)} x`,
      );
      verdict(`constrained / free tokens/s at batch ${batchSize}:`, ratio('masked'), 0.9, true);
    }
    const describe = (promptTokens: number, ttft: Awaited<ReturnType<typeof timeToFirstToken>>, label: string) =>
      console.log(
        `${promptTokens}-token prompt${label} (medians of ${numRounds}): time to first token, new schema ${fmt(ttft.newMs)} ms, ` +
          `cached ${fmt(ttft.cachedMs)} ms = ${fmt(ttft.newMs / ttft.cachedMs, 2)} x (target <= 1.2 x); to the first sampled ` +
          `token, new ${fmt(ttft.newSampleMs)} ms, cached ${fmt(ttft.cachedSampleMs)} ms = ${fmt(ttft.newSampleMs / ttft.cachedSampleMs, 2)} x`,
      );
    for (const promptTokens of [PROMPT_TOKENS, 512]) {
      const ttft = await timeToFirstToken(overlapped, promptTokens, numRounds, 0);
      describe(promptTokens, ttft, '');
      verdict(`time to first token, new / cached schema, ${promptTokens}-token prompt:`, ttft.newMs / ttft.cachedMs, 1.2, false);
    }
    describe(PROMPT_TOKENS, await timeToFirstToken(eager, PROMPT_TOKENS, numRounds, 3), ', every compile from admission (no deferral: the reference)');
    describe(PROMPT_TOKENS, await timeToFirstToken(unlowered, PROMPT_TOKENS, numRounds, 2), ', steps on every thread while it compiles (the rule off)');
    describe(PROMPT_TOKENS, await timeToFirstToken(niced, PROMPT_TOKENS, numRounds, 1), `, grammar threads at niceness ${grammarNice}`);
    console.log(`targets (this run, ${os.loadavg()[0].toFixed(1)} load average at the end):\n  ${verdicts.join('\n  ')}`);
  } finally {
    await overlapped.close();
    await serial.close();
    await niced.close();
    await unlowered.close();
    await eager.close();
  }
}

await main();
