// Speculative decoding's benchmark: every figure a ratio to plain decoding measured in the same
// run, on the kernel path the CPU has, and every speculative run's tokens checked equal to the
// plain run's.
//
// 1. Verify cost on the 125 M benchmark model (tools/bench-model.ts) at batch 1: one decode step
//    carrying k = 1..8 proposals against a plain decode step (median of rounds). Target: at most
//    1.3 x for k = 4 (decode is memory-bound: the weights are read once for all k + 1 rows).
//    1b. The same on conduit-tiny, the model of the workloads below: its weights are few enough
//    that each proposal's compute is a visible share of a step, which bounds their speedups.
// 2. conduit-tiny, greedy, 512-token continuations of verses of its corpus (it repeats itself:
//    prompt lookup's home ground), batch 1. Target: at least 2 x plain decode tokens/s.
// 3. Input-grounded: a passage of the model's own greedy output in the prompt, then the prompt
//    that produced it, so that the continuation copies spans of the passage. Target: at least 2 x.
// 4. Random prompts (uniform token ids: nothing to look up), batch 1. Target: at least 0.97 x.
// 5. 32 concurrent streams of corpus continuations: 96 requests through the engine's 32 slots, a
//    slot refilled as its request ends, as a server's queue does. Target: at least 1.0 x plain
//    throughput. 5b, no target: 32 requests at once, ending together.
// Each engine workload runs plain decoding, ngram and suffix (adaptive, up to 8 proposals per
// sequence and step), the draft model models/conduit-tiny-draft (adaptive, up to 4: each guess
// costs a draft step) and, for reference, ngram at a fixed k = 4, every prompt through one engine
// as a server would (suffix learns from the outputs before). It prints each proposer's speedup
// against the target, acceptance (accepted / verified proposals) and output tokens per step,
// the speedup taken apart (tokens per step over the step's cost against a plain step's, forward
// pass and engine work apart), at batch 1 a projection of its tokens per step onto the 125 M
// model's step costs (where decode is memory-bound, as the targets assume), and at the end a
// summary of every ratio against its target.
//
// Engine workloads run in --engine-rounds rounds that interleave the modes, in reverse order every
// other round (so no mode always follows the same one: at 32 streams the ratios are 1-4 % apart,
// the size of an order effect); each mode's time is the median of its rounds.
//
//   npm run bench:spec [-- --threads N --tokens 512 --rounds 20 --engine-rounds 3 --modes draft,ngram]
// (--modes: only the modes whose names start with one of these, beside plain decoding.)
import { existsSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import type { NativeModel } from '../native/api.ts';
import { loadModel } from '../native/index.ts';
import { createEngine } from '../engine/engine.ts';
import { NativeRunner } from '../engine/native-runner.ts';
import { DraftProposer, loadDraftProposer } from '../engine/spec/draft.ts';
import type { SpeculativeConfig } from '../engine/spec/proposer.ts';
import type { GenerateRequest, SpecDecodeCounters } from '../engine/types.ts';
import { loadTokenizer } from '../gateway/tokenizer/load.ts';
import { packageRoot } from '../package-root.ts';
import { BENCH_SHAPE, describeCpu, ensureBenchCheckpoint } from './bench-model.ts';
import { BENCH_NGRAM, BENCH_SUFFIX, GROUNDED_PASSAGE_TOKENS, corpusPrompts, groundedPrompts, oneSequenceStep, randomPrompts } from './spec-workloads.ts';
import { median } from '../loadtest/stats.ts';

const { values } = parseArgs({
  options: {
    threads: { type: 'string' },
    tokens: { type: 'string', default: '512' },
    rounds: { type: 'string', default: '20' },
    'engine-rounds': { type: 'string', default: '3' },
    modes: { type: 'string' },
  },
});
const numThreads = Number(values.threads ?? Math.min(os.availableParallelism(), 16));
const numOutputTokens = Number(values.tokens);
const numRounds = Number(values.rounds);
const numEngineRounds = Number(values['engine-rounds']);
const BLOCK_SIZE_TOKENS = 16;
/** Workload 5: requests through 32 slots, three per slot, so that 32 stay in flight for most of the run. */
const NUM_STREAMS = 32;
const NUM_STREAM_REQUESTS = 3 * NUM_STREAMS;
const TINY_DIR = path.join(packageRoot, 'models', 'conduit-tiny');
const DRAFT_DIR = path.join(packageRoot, 'models', 'conduit-tiny-draft');

/** Prompt lookup and suffix decoding as spec-workloads.ts sets them (the simulator replays the same). */
const ngram = BENCH_NGRAM;
const suffix = BENCH_SUFFIX;
/** Adaptive proposers choose 0 .. 8 per sequence and step; fixed k = 4 is the reference without adaptivity. */
const draft: SpeculativeConfig = { ...ngram, method: 'draft_model', draftModel: DRAFT_DIR, numSpeculativeTokens: 4 };
const allModes: Array<[string, SpeculativeConfig | null]> = [
  ['plain decode', null],
  ['ngram adaptive', ngram],
  ['suffix adaptive', suffix],
  ['draft adaptive', draft],
  ['ngram k = 4', { ...ngram, numSpeculativeTokens: 4, adaptive: false }],
];
const modePrefixes = values.modes?.split(',');
const modes = allModes.filter(([name, config]) => config === null || modePrefixes === undefined || modePrefixes.some((prefix) => name.startsWith(prefix)));
/** The draft model's runtime, loaded once for every run (a run's proposer holds only its block tables). */
let draftModel: NativeModel | null = null;


/** Prints the step's time with k = 1..8 proposals over a plain step's on the model in modelDir; returns them, k = 0..8. */
async function verifyCost(modelDir: string, title: string, target: number | null): Promise<number[]> {
  const maxBlocksPerSeq = 16;
  const model = await loadModel({ modelDir, dtype: 'auto', kvCacheDtype: 'auto', numKvBlocks: maxBlocksPerSeq, blockSizeTokens: BLOCK_SIZE_TOKENS, numThreads, kernel: 'auto' });
  try {
    // A 128-token history to attend to.
    const prompt = oneSequenceStep(0, 1, 0, maxBlocksPerSeq);
    prompt.numTokens = 128;
    prompt.tokenIds = Int32Array.from({ length: 128 }, (_, i) => 7 + i);
    prompt.positions = Int32Array.from({ length: 128 }, (_, i) => i);
    prompt.queryStarts = Int32Array.of(0, 128);
    await model.forward(prompt);
    const batches = Array.from({ length: 9 }, (_, k) => oneSequenceStep(128, 1 + k, k, maxBlocksPerSeq));
    for (const batch of batches) await model.forward(batch);
    const times: number[][] = batches.map(() => []);
    // Interleaved, so that load from elsewhere spreads over every k alike.
    for (let round = 0; round < numRounds; round++) {
      for (const [k, batch] of batches.entries()) {
        const start = performance.now();
        await model.forward(batch);
        times[k].push(performance.now() - start);
      }
    }
    const plainMs = median(times[0]);
    console.log(`\n${title}, batch 1, ${numThreads} threads, median of ${numRounds}`);
    console.log(`   plain decode step: ${plainMs.toFixed(2)} ms`);
    for (let k = 1; k <= 8; k++) {
      const ms = median(times[k]);
      const ratio = ms / plainMs;
      const verdict = k === 4 && target !== null ? `   (target <= ${target} x: ${ratio <= target ? 'met' : 'MISSED'})` : '';
      console.log(`   k = ${k}: ${ms.toFixed(2)} ms = ${ratio.toFixed(2)} x a decode step${verdict}`);
    }
    return times.map((t) => median(t) / plainMs);
  } finally {
    model.close();
  }
}

interface WorkloadResult {
  outputs: number[][];
  seconds: number;
  numSteps: number;
  /** The steps' forward passes (the runner's calls), of the seconds. */
  forwardMs: number;
  spec: SpecDecodeCounters;
}

/**
 * Every prompt through one engine (as a server would serve them: suffix learns from the outputs
 * before), one after another (batch 1) or all at once.
 */
async function runWorkload(model: NativeModel, prompts: number[][], maxTokens: number, speculative: SpeculativeConfig | null, maxNumSeqs: number): Promise<WorkloadResult> {
  const maxModelLen = Math.max(...prompts.map((p) => p.length)) + maxTokens + 1;
  // The engine closes its runner, and the runner its model: this one outlives every run.
  const shared: NativeModel = { info: model.info, forward: (batch) => model.forward(batch), setActiveThreads: (n) => model.setActiveThreads(n), close: () => {} };
  const runner = new NativeRunner(shared, { maxModelLen, maxNumSeqs, maxNumBatchedTokens: 2048 });
  const sharedDraft: NativeModel | null = draftModel === null ? null : { info: draftModel.info, forward: (batch) => draftModel!.forward(batch), setActiveThreads: (n) => draftModel!.setActiveThreads(n), close: () => {} };
  const engine = createEngine(runner, {
    servedName: 'bench',
    maxNumSeqs,
    maxNumBatchedTokens: 2048,
    generationDefaults: { eosTokenIds: [] },
    enablePrefixCaching: false,
    speculative,
    ...(speculative?.method === 'draft_model' && { proposer: new DraftProposer(sharedDraft!, { maxNumSeqs, maxNumBatchedTokens: 2048 }) }),
  });
  let numSteps = 0;
  let forwardMs = 0;
  const spec: SpecDecodeCounters = { numDrafts: 0, numDraftTokens: 0, numAcceptedTokens: 0, numAcceptedTokensPerPosition: [] };
  engine.onReport(({ stats }) => {
    if (stats === null) return;
    numSteps++;
    forwardMs += stats.forwardMs;
    if (stats.specDecode === undefined) return;
    spec.numDrafts += stats.specDecode.numDrafts;
    spec.numDraftTokens += stats.specDecode.numDraftTokens;
    spec.numAcceptedTokens += stats.specDecode.numAcceptedTokens;
    stats.specDecode.numAcceptedTokensPerPosition.forEach((count, position) => {
      spec.numAcceptedTokensPerPosition[position] = (spec.numAcceptedTokensPerPosition[position] ?? 0) + count;
    });
  });
  const generate = (promptTokenIds: number[], index: number) =>
    new Promise<number[]>((resolve, reject) => {
      const tokens: number[] = [];
      const request: GenerateRequest = { requestId: `r${index}`, promptTokenIds, sampling: { temperature: 0, maxTokens, ignoreEos: true } };
      engine.generate(request, (output) => {
        tokens.push(...output.newTokenIds);
        if (output.finishReason === 'length') resolve(tokens);
        else if (output.finishReason !== null) reject(new Error(`${output.finishReason}: ${output.error?.message}`));
      });
    });
  const start = performance.now();
  let outputs: number[][];
  if (maxNumSeqs > 1) outputs = await Promise.all(prompts.map(generate));
  else {
    outputs = [];
    for (const [index, prompt] of prompts.entries()) outputs.push(await generate(prompt, index));
  }
  const seconds = (performance.now() - start) / 1000;
  await engine.close();
  return { outputs, seconds, numSteps, forwardMs, spec };
}

async function engineWorkloads(): Promise<void> {
  const tokenizer = loadTokenizer(TINY_DIR).tokenizer;
  const model = await loadModel({ modelDir: TINY_DIR, dtype: 'auto', kvCacheDtype: 'auto', numKvBlocks: 4096, blockSizeTokens: BLOCK_SIZE_TOKENS, numThreads, kernel: 'auto' });
  if (modes.some(([, config]) => config?.method === 'draft_model')) {
    if (existsSync(path.join(DRAFT_DIR, 'config.json'))) {
      const loaded = await loadDraftProposer({
        modelDir: DRAFT_DIR, targetVocabSize: model.info.vocabSize, dtype: 'auto', kvCacheDtype: 'auto', numKvBlocks: 4096, blockSizeTokens: BLOCK_SIZE_TOKENS, numThreads, kernel: 'auto', maxNumSeqs: 32, maxNumBatchedTokens: 2048,
      });
      draftModel = loaded.model;
    } else {
      console.log(`   (no ${DRAFT_DIR}: the draft row is skipped; tools/train/run-draft.sh makes it)`);
      modes.splice(modes.findIndex(([, config]) => config?.method === 'draft_model'), 1);
    }
  }
  try {
    const corpus = corpusPrompts(tokenizer);
    console.log(`\n2. conduit-tiny, greedy ${numOutputTokens}-token continuations of ${corpus.length} corpus verses, one at a time (batch 1)`);
    const continuations = await compareModes(model, 'corpus', corpus, numOutputTokens, 1, 2);

    console.log(`\n3. input-grounded: the model's own ${Math.min(GROUNDED_PASSAGE_TOKENS, numOutputTokens)}-token continuation as a passage, then its prompt again, batch 1`);
    const grounded = groundedPrompts(tokenizer, corpus, continuations);
    await compareModes(model, 'input-grounded', grounded, numOutputTokens, 1, 2);

    console.log(`\n4. random prompts (uniform token ids, 64 each), ${numOutputTokens}-token continuations, batch 1`);
    const random = randomPrompts();
    await compareModes(model, 'random prompts', random, numOutputTokens, 1, 0.97);

    const streamTokens = Math.min(128, numOutputTokens);
    const streams = Array.from({ length: NUM_STREAM_REQUESTS }, (_, i) => [...corpus[i % corpus.length], ...tokenizer.encode(` ${i}`, { addSpecialTokens: false })]);
    console.log(`\n5. ${NUM_STREAMS} concurrent streams of ${streamTokens}-token corpus continuations: ${NUM_STREAM_REQUESTS} requests, the engine's ${NUM_STREAMS} slots refilled as requests end`);
    await compareModes(model, '32 streams', streams, streamTokens, NUM_STREAMS, 1.0);
    // The same streams once each, ending together: the run lasts as long as the stream that
    // accepts least, so tokens accepted elsewhere shorten nothing (no target; printed for comparison).
    console.log(`\n5b. ${NUM_STREAMS} requests at once, no refill (they end together; reference, no target)`);
    await compareModes(model, '32 at once', streams.slice(0, NUM_STREAMS), streamTokens, NUM_STREAMS, null);
  } finally {
    model.close();
    draftModel?.close();
  }
}

interface ModeTotals {
  seconds: number[];
  run: WorkloadResult | null;
  /** The run of the median time, for the split of its steps. */
  runs: WorkloadResult[];
}

/** The run whose time is the median of the mode's rounds. */
function medianRun(runs: WorkloadResult[]): WorkloadResult {
  return [...runs].sort((a, b) => a.seconds - b.seconds)[Math.floor(runs.length / 2)];
}

/**
 * A mode's speedup taken apart: tokens per step, over what its step costs against a plain step
 * (the forward pass, and the engine's own work around it: scheduling, proposing, verifying,
 * outputs, the loop's turn), so that a ratio short of its target says which side falls short.
 */
function stepSplit(run: WorkloadResult, plainRun: WorkloadResult): string {
  const stepMs = (1000 * run.seconds) / run.numSteps;
  const plainStepMs = (1000 * plainRun.seconds) / plainRun.numSteps;
  const forwardMs = run.forwardMs / run.numSteps;
  const plainForwardMs = plainRun.forwardMs / plainRun.numSteps;
  return (
    `step ${(1000 * stepMs).toFixed(0)} us (forward ${(1000 * forwardMs).toFixed(0)} + engine ${(1000 * (stepMs - forwardMs)).toFixed(0)}) = ` +
    `${(stepMs / plainStepMs).toFixed(2)} x a plain step (forward ${(forwardMs / plainForwardMs).toFixed(2)} x); ` +
    `${(plainRun.numSteps / run.numSteps).toFixed(2)} x the tokens per step / ${(stepMs / plainStepMs).toFixed(2)} = ${(plainRun.numSteps / run.numSteps / (stepMs / plainStepMs)).toFixed(2)} x`
  );
}

/** Each workload's ratio to plain decoding, per proposer, against its target, for the closing summary. */
let tinyVerifyRatio = NaN;
/** The 125 M model's step time with k = 0..8 proposals over a plain step's. */
let memoryBoundStepRatios: number[] = [];

/**
 * What a batch-1 run's tokens per step would give where decode is memory-bound: each step
 * costing the 125 M model's step of as many proposals (its mean, interpolated), against a plain
 * step, engine work left out. A projection, labelled as one: conduit-tiny gives real acceptance,
 * the 125 M model the cost of a step that reads its weights once for all rows.
 */
function projected(run: WorkloadResult, plainRun: WorkloadResult): string {
  const numDraftsPerStep = Math.min(run.spec.numDraftTokens / run.numSteps, memoryBoundStepRatios.length - 1);
  const below = Math.floor(numDraftsPerStep);
  const above = Math.min(below + 1, memoryBoundStepRatios.length - 1);
  const stepRatio = memoryBoundStepRatios[below] + (numDraftsPerStep - below) * (memoryBoundStepRatios[above] - memoryBoundStepRatios[below]);
  const tokensPerStepRatio = plainRun.numSteps / run.numSteps;
  return `projected on the 125 M model's step costs: ${numDraftsPerStep.toFixed(2)} proposals/step cost ${stepRatio.toFixed(2)} x a plain step: ${(tokensPerStepRatio / stepRatio).toFixed(2)} x`;
}
const summary: Array<{ workload: string; target: number | null; ratios: Map<string, number> }> = [];

/** The ratio, and against its target where the workload has one. */
function verdict(ratio: number, target: number | null): string {
  if (target === null) return `${ratio.toFixed(2)} x`;
  return `${ratio.toFixed(2)} x (target >= ${target} x: ${ratio >= target ? 'met' : 'MISSED'})`;
}

/**
 * Each mode over every prompt, in rounds that interleave the modes so that load from elsewhere
 * falls on all of them alike; a mode's time is the median of its rounds.
 */
async function compareModes(model: NativeModel, workload: string, prompts: number[][], maxTokens: number, maxNumSeqs: number, target: number | null): Promise<number[][]> {
  const totals = new Map<string, ModeTotals>(modes.map(([name]) => [name, { seconds: [], run: null, runs: [] }]));
  for (let round = 0; round < numEngineRounds; round++) {
    for (const [name, config] of round % 2 === 0 ? modes : [...modes].reverse()) {
      const total = totals.get(name)!;
      const run = await runWorkload(model, prompts, maxTokens, config, maxNumSeqs);
      total.seconds.push(run.seconds);
      total.run ??= run;
      total.runs.push(run);
    }
  }
  const numTokens = prompts.length * maxTokens;
  const plain = totals.get('plain decode')!;
  const plainRate = numTokens / median(plain.seconds);
  const plainRun = medianRun(plain.runs);
  console.log(`   plain decode    ${plainRate.toFixed(0)} tok/s, ${(numTokens / plain.run!.numSteps).toFixed(2)} tokens/step; ${stepSplit(plainRun, plainRun)}`);
  const ratios = new Map<string, number>();
  for (const [name] of modes.slice(1)) {
    const { run, seconds } = totals.get(name)!;
    const same = run!.outputs.every((tokens, i) => tokens.length === plain.run!.outputs[i].length && tokens.every((t, j) => t === plain.run!.outputs[i][j]));
    if (!same) throw new Error(`${name} changed an output`);
    const ratio = numTokens / median(seconds) / plainRate;
    ratios.set(name, ratio);
    const { numDraftTokens, numAcceptedTokens } = run!.spec;
    const acceptance = numDraftTokens === 0 ? 0 : numAcceptedTokens / numDraftTokens;
    console.log(
      `   ${name.padEnd(15)} ${(numTokens / median(seconds)).toFixed(0)} tok/s = ${verdict(ratio, target)}; ` +
        `acceptance ${(100 * acceptance).toFixed(1)} % of ${numDraftTokens} proposed, ${(numTokens / run!.numSteps).toFixed(2)} tokens/step; outputs identical`,
    );
    console.log(`   ${''.padEnd(15)} ${acceptedByPosition(run!.spec)}`);
    console.log(`   ${''.padEnd(15)} ${stepSplit(medianRun(totals.get(name)!.runs), plainRun)}`);
    if (maxNumSeqs === 1) console.log(`   ${''.padEnd(15)} ${projected(run!, plain.run!)}`);
  }
  summary.push({ workload, target, ratios });
  return plain.run!.outputs;
}

/**
 * The share of proposing steps whose proposals were accepted up to each position (vLLM's
 * accepted tokens per position over drafts): where it stays high at the last position, longer
 * proposals would have been accepted too.
 */
function acceptedByPosition(spec: SpecDecodeCounters): string {
  if (spec.numDrafts === 0) return 'no proposals';
  const shares = spec.numAcceptedTokensPerPosition.map((count) => `${((100 * count) / spec.numDrafts).toFixed(0)}`);
  return `of ${spec.numDrafts} proposing steps, % accepted through position 1..${shares.length}: ${shares.join(' ')}`;
}

/** Every ratio against its target, as measured above. */
function printSummary(verifyRatio: number): void {
  console.log('\nsummary (ratios to plain decoding, this run)');
  console.log(`   verify cost k = 4: ${verifyRatio.toFixed(2)} x a decode step (target <= 1.3 x: ${verifyRatio <= 1.3 ? 'met' : 'MISSED'}); on conduit-tiny ${tinyVerifyRatio.toFixed(2)} x`);
  for (const { workload, target, ratios } of summary) {
    const [bestName, bestRatio] = [...ratios].reduce((best, entry) => (entry[1] > best[1] ? entry : best));
    const each = [...ratios].map(([name, ratio]) => `${name} ${ratio.toFixed(2)} x`).join(', ');
    console.log(`   ${workload.padEnd(15)} best ${bestName}: ${verdict(bestRatio, target)}   [${each}]`);
  }
}

console.log(`bench:spec on ${describeCpu()}, ${numThreads} threads`);
memoryBoundStepRatios = await verifyCost(ensureBenchCheckpoint(), `1. verify cost, 125 M model (hidden ${BENCH_SHAPE.hiddenSize}, ${BENCH_SHAPE.numLayers} layers)`, 1.3);
const verifyRatio = memoryBoundStepRatios[4];
// The engine workloads' model is small enough that a proposal's compute is a visible share of
// its step (no target: what a step of proposals costs there bounds every speedup below).
tinyVerifyRatio = (await verifyCost(TINY_DIR, '1b. verify cost, conduit-tiny (the model of workloads 2-5)', null))[4];
await engineWorkloads();
printSummary(verifyRatio);
