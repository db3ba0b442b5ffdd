// The speculation simulator: bench:spec's batch-1 workloads' greedy outputs, recorded once through
// plain decoding, replayed through the real Speculator (proposer, adaptive choice, acceptance and
// step-cost models) with a measured step-cost curve. A proposer or chooser change is judged by
// counts on the same outputs and the same curve, which a busy machine does not move; the bench then
// confirms it on the clock. Each step costs curve[k] (a batch-1 step verifying k proposals) plus
// the engine's fixed work; plain decoding costs curve[0] plus that a token.
//
//   node --import tsx tools/spec-sim.ts record [--out FILE]   greedy outputs, and the curve on CPU time (1 thread)
//   node --import tsx tools/spec-sim.ts replay [--in FILE] [--engine-us 30]
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import type { NativeModel } from '../native/api.ts';
import type { Proposer, SpeculativeConfig } from '../engine/spec/proposer.ts';
import { Speculator } from '../engine/spec/speculator.ts';
import { packageRoot } from '../package-root.ts';
import { BENCH_NGRAM, BENCH_SUFFIX, oneSequenceStep } from './spec-workloads.ts';

/** A prompt and its plain greedy output (the first output token comes from the prompt's step). */
export interface Trace {
  prompt: number[];
  output: number[];
}

export interface SimResult {
  numSteps: number;
  numTokens: number;
  numProposed: number;
  numAccepted: number;
  /** The decode steps' modelled cost, and plain decoding's for the same tokens, in the curve's units. */
  cost: number;
  plainCost: number;
}

/**
 * Replays traces through a Speculator with config (and proposer, else the config's own) as the
 * scheduler drives it at batch 1. stepCosts[k]: a step verifying k proposals, engine's included.
 * oracle: each step verifies exactly the proposal's accepted prefix (what a chooser that knew
 * would pick), the bound on choosing alone.
 */
export function simulate(traces: readonly Trace[], config: SpeculativeConfig, stepCosts: readonly number[], proposer?: Proposer, oracle = false): SimResult {
  const speculator = new Speculator(config, proposer);
  const result: SimResult = { numSteps: 0, numTokens: 0, numProposed: 0, numAccepted: 0, cost: 0, plainCost: 0 };
  const maxK = Math.min(config.numSpeculativeTokens, stepCosts.length - 1);
  for (const { prompt, output } of traces) {
    const sequence = { tokenIds: [...prompt, output[0]], numPromptTokens: prompt.length, maxDraftTokens: 0, proposal: [] as number[], acceptance: speculator.newAcceptanceStats() };
    for (let numOutput = 1; numOutput < output.length; ) {
      sequence.maxDraftTokens = Math.min(maxK, output.length - numOutput - 1);
      let numDrafts = speculator.choose([sequence], 1, Number.MAX_SAFE_INTEGER)[0];
      const proposal = sequence.proposal;
      let numAccepted = 0;
      if (oracle) numDrafts = proposal.length;
      while (numAccepted < numDrafts && proposal[numAccepted] === output[numOutput + numAccepted]) numAccepted++;
      if (oracle) numDrafts = numAccepted;
      // The accepted proposals, then the token sampled after them.
      for (let i = 0; i <= numAccepted; i++) sequence.tokenIds.push(output[numOutput + i]);
      if (numDrafts > 0) {
        const nextGuess = numAccepted === numDrafts && proposal.length > numDrafts ? proposal[numDrafts] === output[numOutput + numAccepted] : null;
        speculator.recordVerification(sequence.acceptance, numDrafts, numAccepted, nextGuess);
      } else if (proposal.length > 0) {
        speculator.recordUnverifiedGuess(sequence.acceptance, proposal[0], output[numOutput]);
      }
      numOutput += numAccepted + 1;
      speculator.observeStep(1 + numDrafts, stepCosts[numDrafts]);
      result.numSteps++;
      result.numTokens += numAccepted + 1;
      result.numProposed += numDrafts;
      result.numAccepted += numAccepted;
      result.cost += stepCosts[numDrafts];
      proposal.length = 0;
    }
    result.plainCost += (output.length - 1) * stepCosts[0];
    // It leaves the scheduler: a proposer that learns from outputs (suffix) keeps this one.
    speculator.finish(sequence);
  }
  return result;
}

/** The recording: each workload's traces, and the step-cost curve they are replayed with. */
interface Recording {
  cpu: string;
  /** Process CPU microseconds of a batch-1 step verifying k = 0..8 proposals at position curvePosition, one thread. */
  stepUs: number[];
  curvePosition: number;
  workloads: Record<string, Trace[]>;
}

const DEFAULT_FILE = path.join(packageRoot, '.bench', 'spec-traces.json');
const TINY_DIR = path.join(packageRoot, 'models', 'conduit-tiny');
const MAX_OUTPUT_TOKENS = 512;

async function greedyOutputs(model: NativeModel, prompts: readonly number[][]): Promise<number[][]> {
  const { createEngine } = await import('../engine/engine.ts');
  const { NativeRunner } = await import('../engine/native-runner.ts');
  const maxModelLen = Math.max(...prompts.map((p) => p.length)) + MAX_OUTPUT_TOKENS + 1;
  const shared: NativeModel = { info: model.info, forward: (batch) => model.forward(batch), setActiveThreads: (n) => model.setActiveThreads(n), close: () => {} };
  const runner = new NativeRunner(shared, { maxModelLen, maxNumSeqs: 1, maxNumBatchedTokens: 2048 });
  const engine = createEngine(runner, { servedName: 'spec-sim', maxNumSeqs: 1, maxNumBatchedTokens: 2048, generationDefaults: { eosTokenIds: [] }, enablePrefixCaching: false, speculative: null });
  const outputs: number[][] = [];
  for (const [index, promptTokenIds] of prompts.entries()) {
    outputs.push(
      await new Promise<number[]>((resolve, reject) => {
        const tokens: number[] = [];
        engine.generate({ requestId: `r${index}`, promptTokenIds, sampling: { temperature: 0, maxTokens: MAX_OUTPUT_TOKENS, ignoreEos: true } }, (news) => {
          tokens.push(...news.newTokenIds);
          if (news.finishReason === 'length') resolve(tokens);
          else if (news.finishReason !== null) reject(new Error(`${news.finishReason}: ${news.error?.message}`));
        });
      }),
    );
  }
  await engine.close();
  return outputs;
}

/** Median process CPU time of a batch-1 step with k = 0..8 proposals at position, rounds interleaved. */
async function measureStepUs(model: NativeModel, position: number, maxBlocksPerSeq: number, numRounds: number): Promise<number[]> {
  await model.forward(oneSequenceStep(0, position, 0, maxBlocksPerSeq));
  const steps = Array.from({ length: 9 }, (_, k) => oneSequenceStep(position, 1 + k, k, maxBlocksPerSeq));
  const times: number[][] = steps.map(() => []);
  for (let round = 0; round < numRounds; round++) {
    for (const [k, step] of steps.entries()) {
      const before = process.cpuUsage();
      await model.forward(step);
      const { user, system } = process.cpuUsage(before);
      times[k].push(user + system);
    }
  }
  return times.map((t) => [...t].sort((a, b) => a - b)[Math.floor(t.length / 2)]);
}

async function record(file: string): Promise<void> {
  const { loadModel } = await import('../native/index.ts');
  const { loadTokenizer } = await import('../gateway/tokenizer/load.ts');
  const { describeCpu } = await import('./bench-model.ts');
  const { corpusPrompts, groundedPrompts, randomPrompts } = await import('./spec-workloads.ts');
  const tokenizer = loadTokenizer(TINY_DIR).tokenizer;
  const model = await loadModel({ modelDir: TINY_DIR, dtype: 'auto', kvCacheDtype: 'auto', numKvBlocks: 4096, blockSizeTokens: 16, numThreads: 1, kernel: 'auto' });
  try {
    const corpus = corpusPrompts(tokenizer);
    const corpusOutputs = await greedyOutputs(model, corpus);
    const grounded = groundedPrompts(tokenizer, corpus, corpusOutputs);
    const workloads: Record<string, Trace[]> = {
      corpus: corpus.map((prompt, i) => ({ prompt, output: corpusOutputs[i] })),
      'input-grounded': await traces(model, grounded),
      'random prompts': await traces(model, randomPrompts()),
    };
    // The input-grounded workload's middle position: its prompts' ~300 tokens and half its output.
    const curvePosition = Math.round(grounded.reduce((sum, p) => sum + p.length, 0) / grounded.length + MAX_OUTPUT_TOKENS / 2);
    const stepUs = await measureStepUs(model, curvePosition, 4096, 500);
    const recording: Recording = { cpu: describeCpu(), stepUs, curvePosition, workloads };
    mkdirSync(path.dirname(file), { recursive: true });
    writeFileSync(file, JSON.stringify(recording));
    console.log(`recorded ${file}: step CPU us at position ${curvePosition}, k = 0..8: ${stepUs.join(' ')}`);
  } finally {
    model.close();
  }
}

async function traces(model: NativeModel, prompts: number[][]): Promise<Trace[]> {
  const outputs = await greedyOutputs(model, prompts);
  return prompts.map((prompt, i) => ({ prompt, output: outputs[i] }));
}

function line(name: string, r: SimResult): string {
  return (
    `   ${name.padEnd(24)} ${(r.plainCost / r.cost).toFixed(3)} x plain; ${(r.numTokens / r.numSteps).toFixed(2)} tokens/step, ` +
    `${(r.numProposed / r.numSteps).toFixed(2)} verified/step, acceptance ${((100 * r.numAccepted) / Math.max(1, r.numProposed)).toFixed(1)} %`
  );
}

function replay(file: string, engineUs: number): void {
  const recording = JSON.parse(readFileSync(file, 'utf8')) as Recording;
  const stepCosts = recording.stepUs.map((us) => us + engineUs);
  console.log(`${recording.cpu}: step costs at position ${recording.curvePosition} (CPU us, + ${engineUs} engine): ${stepCosts.join(' ')}`);
  const fixed: SpeculativeConfig = { ...BENCH_NGRAM, numSpeculativeTokens: 4, adaptive: false };
  for (const [workload, workloadTraces] of Object.entries(recording.workloads)) {
    console.log(workload);
    console.log(line('ngram adaptive', simulate(workloadTraces, BENCH_NGRAM, stepCosts)));
    console.log(line('ngram k = 4', simulate(workloadTraces, fixed, stepCosts)));
    console.log(line('ngram, oracle choice', simulate(workloadTraces, { ...BENCH_NGRAM, adaptive: false }, stepCosts, undefined, true)));
    // A fresh suffix proposer per workload, which learns from the workload's earlier outputs as it goes.
    console.log(line('suffix adaptive', simulate(workloadTraces, BENCH_SUFFIX, stepCosts)));
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values, positionals } = parseArgs({ allowPositionals: true, options: { out: { type: 'string' }, in: { type: 'string' }, 'engine-us': { type: 'string', default: '30' } } });
  if (positionals[0] === 'record') await record(values.out ?? DEFAULT_FILE);
  else if (positionals[0] === 'replay') replay(values.in ?? DEFAULT_FILE, Number(values['engine-us']));
  else throw new Error('usage: spec-sim.ts record [--out FILE] | replay [--in FILE] [--engine-us N]');
}
