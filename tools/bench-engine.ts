// The engine's benchmark on the 125 M benchmark model (tools/bench-model.ts), three figures,
// each a ratio of two measurements taken in the same run:
//
// 1. Prefix caching: time to first token of a request whose 1,024-token prefix is cached,
//    against the same request with the prefix uncached (a fresh cache salt each time), in
//    alternating rounds. Target: at least 10 x shorter.
// 2. Continuous against static batching: output tok/s of one mixed-length workload (output
//    lengths drawn from an exponential distribution, mean 96 tokens, 8 to 512), run with
//    continuous batching (a finished request's slot is refilled at the next step) and with static
//    batching as Hugging Face generate and FasterTransformer run it (a batch of maxNumSeqs
//    requests starts together and runs until its longest is done, finished rows computing
//    padding; only requested tokens count). Target: at least 2 x. Also printed: static batching
//    whose finished rows leave the batch early, which on a CPU, where a step costs more the more
//    rows it has, wastes far less.
// 3. Scheduling and wire overhead at 64 running sequences: the worker (engine and gRPC service)
//    runs here and its client in a child process, as the gateway does; per decode step, the
//    engine loop's wall time outside the native call (scheduling, batch filling, outputs, wire
//    encoding and writes, everything on this event loop) as a fraction of the step. Target: at
//    most 5 %.
//
//   npm run bench:engine [-- --threads N --rounds 5 --requests 48]
import { spawn } from 'node:child_process';
import os from 'node:os';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';
import type { ForwardBatch, ForwardResult, NativeModel } from '../native/api.ts';
import { loadModel } from '../native/index.ts';
import { createEngine, type Engine } from '../engine/engine.ts';
import { GrpcEngineClient } from '../engine/grpc/client.ts';
import { serveEngine } from '../engine/grpc/service.ts';
import { NativeRunner } from '../engine/native-runner.ts';
import type { GenerateRequest, StepStats } from '../engine/types.ts';
import { createRng } from '../loadtest/random.ts';
import { BENCH_SHAPE, describeCpu, ensureBenchCheckpoint } from './bench-model.ts';
import { median } from '../loadtest/stats.ts';

const BLOCK_SIZE_TOKENS = 16;
const MAX_MODEL_LEN = 2048;
const PREFIX_TOKENS = 1024;
const SUFFIX_TOKENS = 16;
const OVERHEAD_SEQS = 64;
const OVERHEAD_PROMPT_TOKENS = 32;
const OVERHEAD_OUTPUT_TOKENS = 48;

/** A model whose forward() adds up the time spent inside the runtime's call. */
class TimedModel implements NativeModel {
  nativeMs = 0;
  constructor(private readonly inner: NativeModel) {}
  get info() {
    return this.inner.info;
  }
  async forward(batch: ForwardBatch): Promise<ForwardResult> {
    const start = performance.now();
    try {
      return await this.inner.forward(batch);
    } finally {
      this.nativeMs += performance.now() - start;
    }
  }
  setActiveThreads(numThreads: number) {
    this.inner.setActiveThreads(numThreads);
  }
  close() {
    this.inner.close();
  }
}

async function startEngine(modelDir: string, numThreads: number, maxNumSeqs: number, maxNumBatchedTokens: number, numKvBlocks: number) {
  const model = new TimedModel(
    await loadModel({ modelDir, dtype: 'auto', kvCacheDtype: 'auto', numKvBlocks, blockSizeTokens: BLOCK_SIZE_TOKENS, numThreads, kernel: 'auto' }),
  );
  const runner = new NativeRunner(model, { maxModelLen: MAX_MODEL_LEN, maxNumSeqs, maxNumBatchedTokens });
  const engine = createEngine(runner, { servedName: 'bench', maxNumSeqs, maxNumBatchedTokens, generationDefaults: { eosTokenIds: [] } });
  return { engine, model };
}

function tokens(count: number, salt: number): number[] {
  return Array.from({ length: count }, (_, i) => (salt * 7919 + i * 104729 + 17) % BENCH_SHAPE.vocabSize);
}

/** Resolves with the time to the first output token and the number of output tokens. */
function run(engine: Engine, request: GenerateRequest): Promise<{ ttftMs: number; numOutputTokens: number }> {
  const start = performance.now();
  let ttftMs = -1;
  return new Promise((resolve, reject) => {
    engine.generate(request, (output) => {
      if (ttftMs < 0 && output.newTokenIds.length > 0) ttftMs = performance.now() - start;
      if (output.finishReason === null) return;
      if (output.error !== undefined) reject(new Error(`${request.requestId}: ${output.error.message}`));
      else resolve({ ttftMs, numOutputTokens: output.numOutputTokens });
    });
  });
}

const fmt = (value: number, digits = 1) => value.toFixed(digits);

async function prefixCaching(modelDir: string, numThreads: number, numRounds: number) {
  const { engine } = await startEngine(modelDir, numThreads, 8, 512, 256);
  try {
    const prefix = tokens(PREFIX_TOKENS, 1);
    const request = (id: string, salt: string, suffixSalt: number): GenerateRequest => ({
      requestId: id,
      promptTokenIds: [...prefix, ...tokens(SUFFIX_TOKENS, suffixSalt)],
      sampling: { temperature: 0, maxTokens: 1, ignoreEos: true },
      cacheSalt: salt,
    });
    // Warm the runtime, and put the prefix in the cache under the salt the cached runs use.
    await run(engine, request('warm', 'warm', 0));
    const cachedMs: number[] = [];
    const uncachedMs: number[] = [];
    for (let round = 0; round < numRounds; round++) {
      // A new suffix each time: only the 1,024-token prefix can come from the cache.
      uncachedMs.push((await run(engine, request(`uncached-${round}`, `cold-${round}`, 100 + round))).ttftMs);
      cachedMs.push((await run(engine, request(`cached-${round}`, 'warm', 200 + round))).ttftMs);
    }
    return { cachedMs: median(cachedMs), uncachedMs: median(uncachedMs) };
  } finally {
    await engine.close();
  }
}

/** Output lengths: exponential with the given mean, rounded, clamped to [8, 512]; a fixed seed. */
function mixedOutputLengths(count: number, meanTokens: number): number[] {
  const rng = createRng(1);
  return Array.from({ length: count }, () => Math.min(512, Math.max(8, Math.round(-meanTokens * Math.log(1 - rng())))));
}

async function batching(modelDir: string, numThreads: number, numRequests: number, maxNumSeqs: number) {
  const outputLengths = mixedOutputLengths(numRequests, 96);
  const requests = outputLengths.map((maxTokens, index): GenerateRequest => ({
    requestId: `r${index}`,
    promptTokenIds: tokens(32 + (index % 4) * 16, index),
    sampling: { temperature: 0, maxTokens, ignoreEos: true },
  }));
  const numOutputTokens = outputLengths.reduce((sum, length) => sum + length, 0);
  const { engine } = await startEngine(modelDir, numThreads, maxNumSeqs, 512, 1024);
  try {
    await run(engine, { requestId: 'warm', promptTokenIds: tokens(32, 999), sampling: { temperature: 0, maxTokens: 4, ignoreEos: true } });
    const withSuffix = (suffix: string) => requests.map((request) => ({ ...request, requestId: request.requestId + suffix }));
    let start = performance.now();
    await Promise.all(withSuffix('-continuous').map((request) => run(engine, request)));
    const continuousSeconds = (performance.now() - start) / 1000;
    /** Batch by batch; padded: every row runs to the batch's longest. */
    const runStatic = async (suffix: string, padded: boolean) => {
      const staticRequests = withSuffix(suffix);
      const started = performance.now();
      for (let first = 0; first < staticRequests.length; first += maxNumSeqs) {
        const batchRequests = staticRequests.slice(first, first + maxNumSeqs);
        const longest = Math.max(...batchRequests.map((request) => request.sampling.maxTokens!));
        await Promise.all(
          batchRequests.map((request) => run(engine, padded ? { ...request, sampling: { ...request.sampling, maxTokens: longest } } : request)),
        );
      }
      return numOutputTokens / ((performance.now() - started) / 1000);
    };
    return {
      outputLengths,
      continuousTokensPerSecond: numOutputTokens / continuousSeconds,
      staticTokensPerSecond: await runStatic('-static', true),
      leaveEarlyTokensPerSecond: await runStatic('-leave-early', false),
    };
  } finally {
    await engine.close();
  }
}

async function overhead(modelDir: string, numThreads: number) {
  const maxNumBatchedTokens = OVERHEAD_SEQS * OVERHEAD_PROMPT_TOKENS;
  const { engine, model } = await startEngine(modelDir, numThreads, OVERHEAD_SEQS, maxNumBatchedTokens, 512);
  const server = await serveEngine(engine, '127.0.0.1:0');
  const steps: { stats: StepStats; wallMs: number; nativeMs: number }[] = [];
  let lastReportMs = -1;
  let lastNativeMs = 0;
  // One report per loop round: the wall time between two is one whole round of the loop.
  const unsubscribe = engine.onReport((report) => {
    const nowMs = performance.now();
    if (report.stats !== null && lastReportMs >= 0) {
      steps.push({ stats: report.stats, wallMs: nowMs - lastReportMs, nativeMs: model.nativeMs - lastNativeMs });
    }
    lastReportMs = nowMs;
    lastNativeMs = model.nativeMs;
  });
  try {
    const client = spawn(
      process.execPath,
      ['--import', 'tsx', fileURLToPath(import.meta.url), '--client', server.address],
      { stdio: ['ignore', 'inherit', 'inherit'] },
    );
    const code = await new Promise<number | null>((resolve) => client.once('exit', resolve));
    if (code !== 0) throw new Error(`the benchmark client exited with code ${code}`);
  } finally {
    unsubscribe();
    await engine.close();
    await server.close();
  }
  // Decode steps with every sequence running: the shape the target names.
  const decodeSteps = steps.filter((step) => step.stats.numScheduledSeqs === OVERHEAD_SEQS && step.stats.numScheduledTokens === OVERHEAD_SEQS);
  const fractions = decodeSteps.map((step) => (step.wallMs - step.nativeMs) / step.wallMs);
  return {
    numSteps: decodeSteps.length,
    stepMs: median(decodeSteps.map((step) => step.wallMs)),
    overheadMs: median(decodeSteps.map((step) => step.wallMs - step.nativeMs)),
    fraction: median(fractions),
    meanFraction: fractions.reduce((sum, fraction) => sum + fraction, 0) / Math.max(1, fractions.length),
  };
}

/** The client half of the overhead measurement: 64 requests at once over the engine's gRPC stream. */
async function runClient(address: string) {
  const client = new GrpcEngineClient(address);
  await Promise.all(
    Array.from({ length: OVERHEAD_SEQS }, (_, index) =>
      new Promise<void>((resolve, reject) => {
        client.generate(
          {
            requestId: `o${index}`,
            promptTokenIds: tokens(OVERHEAD_PROMPT_TOKENS, 5000 + index),
            sampling: { temperature: 0, maxTokens: OVERHEAD_OUTPUT_TOKENS, ignoreEos: true },
          },
          (output) => {
            if (output.finishReason === null) return;
            if (output.error !== undefined) reject(new Error(output.error.message));
            else resolve();
          },
        );
      }),
    ),
  );
  client.close();
}

async function main() {
  const { values } = parseArgs({
    options: {
      client: { type: 'string' },
      threads: { type: 'string', default: String(os.availableParallelism()) },
      rounds: { type: 'string', default: '5' },
      requests: { type: 'string', default: '48' },
      'max-num-seqs': { type: 'string', default: '16' },
    },
  });
  if (values.client !== undefined) {
    await runClient(values.client);
    return;
  }
  const numThreads = Number(values.threads);
  console.log(`CPU: ${describeCpu()}`);
  console.log(`model: 125 M benchmark checkpoint (bf16), ${numThreads} threads, kernel auto`);
  const modelDir = ensureBenchCheckpoint();

  const prefix = await prefixCaching(modelDir, numThreads, Number(values.rounds));
  const prefixRatio = prefix.uncachedMs / prefix.cachedMs;
  console.log(
    `prefix caching: TTFT of ${PREFIX_TOKENS} cached + ${SUFFIX_TOKENS} new prompt tokens ${fmt(prefix.cachedMs)} ms, ` +
      `all ${PREFIX_TOKENS + SUFFIX_TOKENS} uncached ${fmt(prefix.uncachedMs)} ms (medians of ${values.rounds}): ` +
      `${fmt(prefixRatio)} x shorter (target >= 10 x)`,
  );

  const maxNumSeqs = Number(values['max-num-seqs']);
  const batch = await batching(modelDir, numThreads, Number(values.requests), maxNumSeqs);
  const batchingRatio = batch.continuousTokensPerSecond / batch.staticTokensPerSecond;
  const lengths = batch.outputLengths;
  console.log(
    `batching: ${lengths.length} requests, output lengths ${Math.min(...lengths)}-${Math.max(...lengths)} ` +
      `(mean ${fmt(lengths.reduce((a, b) => a + b, 0) / lengths.length)}), batches of ${maxNumSeqs}: continuous ` +
      `${fmt(batch.continuousTokensPerSecond)} tok/s, static ${fmt(batch.staticTokensPerSecond)} tok/s: ` +
      `${fmt(batchingRatio, 2)} x (target >= 2 x); static with early leavers ${fmt(batch.leaveEarlyTokensPerSecond)} tok/s: ` +
      `${fmt(batch.continuousTokensPerSecond / batch.leaveEarlyTokensPerSecond, 2)} x`,
  );

  const cost = await overhead(modelDir, numThreads);
  console.log(
    `overhead at ${OVERHEAD_SEQS} running sequences (decode steps, over gRPC to a client process): step ${fmt(cost.stepMs)} ms, ` +
      `outside the native call ${fmt(cost.overheadMs, 2)} ms = ${fmt(100 * cost.fraction, 2)} % (median of ${cost.numSteps} steps; ` +
      `mean ${fmt(100 * cost.meanFraction, 2)} %) (target <= 5 %)`,
  );
}

await main();
