import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createEngine, type Engine } from '../engine.ts';
import { createWorkerLogger, type Logger } from '../log.ts';
import type { GenerateRequest, RequestOutput } from '../types.ts';
import { FakeRunner, distinctPrompt } from './fake-runner.ts';

function setup(numKvBlocks = 32, log?: Logger) {
  const runner = new FakeRunner({ numKvBlocks, blockSizeTokens: 4, vocabSize: 500, maxModelLen: 64 });
  const engine = createEngine(runner, {
    servedName: 'fake',
    maxNumSeqs: 4,
    maxNumBatchedTokens: 16,
    generationDefaults: { eosTokenIds: [2] },
    log,
  });
  return { runner, engine };
}

function request(requestId: string, maxTokens: number): GenerateRequest {
  return { requestId, promptTokenIds: distinctPrompt(requestId, 5), sampling: { maxTokens, seed: 1n } };
}

/** Resolves with every output of one request once its last one arrives. */
function collect(engine: Engine, req: GenerateRequest, onEach?: (output: RequestOutput) => void): Promise<RequestOutput[]> {
  return new Promise((resolve) => {
    const outputs: RequestOutput[] = [];
    engine.generate(req, (output) => {
      outputs.push(output);
      onEach?.(output);
      if (output.finishReason !== null) resolve(outputs);
    });
  });
}

test('the loop streams one output per request per step and idles when done', async (t) => {
  const { engine, runner } = setup();
  t.after(() => engine.close());
  const [a, b] = await Promise.all([collect(engine, request('a', 3)), collect(engine, request('b', 5))]);
  assert.deepEqual(a.map((output) => output.newTokenIds[0]), runner.scriptedTokenIds('a', 3));
  assert.deepEqual(b.map((output) => output.newTokenIds[0]), runner.scriptedTokenIds('b', 5));
  assert.equal(b.at(-1)?.finishReason, 'length');
  const numSteps = runner.steps.length;
  // An idle engine wakes for the next request.
  const c = await collect(engine, request('c', 1));
  assert.equal(c.length, 1);
  assert.equal(runner.steps.length, numSteps + 1);
  // Each request's own full blocks stay cached: a computes 5 + 3 - 1 tokens (1 block of 4), b 9 (2), c 5 (1).
  assert.deepEqual(engine.health().load, { numRunning: 0, numWaiting: 0, numFreeBlocks: 32, numTotalBlocks: 32, numQueuedPrefillTokens: 0, numCachedBlocks: 4 });
});

test('a request that arrives during a step counts the rest of that step in its queue time', async (t) => {
  const { engine, runner } = setup();
  t.after(() => engine.close());
  // The first request's second step runs HOLD_MS; the second request arrives as it starts.
  const HOLD_MS = 80;
  let second: Promise<RequestOutput[]> | null = null;
  const first = collect(engine, request('first', 3), (output) => {
    if (output.numOutputTokens !== 1) return;
    runner.beforeStep = () => {
      runner.beforeStep = null;
      second = collect(engine, request('second', 1));
      return new Promise((resolve) => setTimeout(resolve, HOLD_MS));
    };
  });
  await first;
  const [output] = await second!;
  assert.ok(output.queueTimeMs! >= HOLD_MS - 5, `queue time ${output.queueTimeMs} ms covers the step in flight`);
});

test('requests sharing a cached prefix share its blocks while any holds them, each its own tokens after it', async (t) => {
  // 14 blocks of 4 for 4 running requests of 8 shared + 3 own prompt tokens and up to 12 outputs:
  // blocks are short, so one freed too early (while another request still reads it) is handed
  // to a newcomer and overwritten, which the fake runner's read-back sees.
  const runner = new FakeRunner({ numKvBlocks: 14, blockSizeTokens: 4, vocabSize: 500, maxModelLen: 64 });
  const engine = createEngine(runner, { servedName: 'fake', maxNumSeqs: 4, maxNumBatchedTokens: 16, generationDefaults: { eosTokenIds: [2] } });
  t.after(() => engine.close());
  const sharedPrefix = distinctPrompt('shared', 8);
  const requests = Array.from({ length: 10 }, (_, i): GenerateRequest => ({
    requestId: `r${i}`,
    promptTokenIds: [...sharedPrefix, ...distinctPrompt(`r${i}`, 3)],
    sampling: { maxTokens: 2 + ((i * 5) % 11) },
  }));
  const outputs = await Promise.all(requests.map((req) => collect(engine, req)));
  for (const [i, req] of requests.entries()) {
    const tokenIds = outputs[i].flatMap((output) => output.newTokenIds);
    assert.equal(outputs[i].at(-1)?.finishReason, 'length', `${req.requestId}: ${outputs[i].at(-1)?.error?.message}`);
    assert.deepEqual(tokenIds, runner.scriptedTokenIds(req.requestId, req.sampling.maxTokens!), req.requestId);
  }
  assert.ok(outputs.slice(1).some((each) => each.some((output) => output.numCachedTokens === 8)), 'later requests hit the shared prefix');
  assert.equal(engine.health().load.numFreeBlocks, 14);
});

test('a refused request gets one error output', async (t) => {
  const { engine } = setup();
  t.after(() => engine.close());
  const [output] = await collect(engine, { requestId: 'x', promptTokenIds: [1, 2], sampling: { maxTokens: 100 } });
  assert.equal(output.finishReason, 'error');
  assert.equal(output.error?.code, 'context_length_exceeded');
});

test('abort ends a request mid-stream and frees its blocks', async (t) => {
  const { engine } = setup();
  t.after(() => engine.close());
  const outputs = await collect(engine, request('a', 40), (output) => {
    if (output.numOutputTokens === 2) engine.abort('a');
  });
  assert.equal(outputs.at(-1)?.finishReason, 'abort');
  assert.equal(engine.health().load.numFreeBlocks, 32);
});

test('a failed step ends its requests with an error and the engine serves on', async (t) => {
  const { engine, runner } = setup();
  t.after(() => engine.close());
  runner.failNextWith = 'forward failed';
  const [failed] = await collect(engine, request('a', 3));
  assert.deepEqual(failed.error, { code: 'internal_error', message: 'forward failed' });
  assert.equal(engine.health().load.numFreeBlocks, 32);
  assert.equal((await collect(engine, request('b', 2))).at(-1)?.finishReason, 'length');
  assert.equal(engine.health().serving, true);
});

test('close ends requests in flight with an error, refuses new ones and closes the runner', async () => {
  const { engine, runner } = setup();
  const pending = collect(engine, request('a', 50));
  await engine.close();
  assert.equal((await pending).at(-1)?.error?.code, 'engine_unavailable');
  assert.equal(runner.closed, true);
  assert.equal(engine.health().serving, false);
  const [late] = await collect(engine, request('b', 1));
  assert.equal(late.error?.code, 'engine_unavailable');
});

test('a listener that throws loses its own request and the engine serves on', async (t) => {
  const lines: string[] = [];
  const { engine } = setup(32, createWorkerLogger('warn', { write: (line: string) => lines.push(line) }));
  t.after(() => engine.close());
  let numCalls = 0;
  engine.generate(request('thrower', 10), () => {
    numCalls++;
    throw new Error('listener bug');
  });
  const other = await collect(engine, request('other', 3));
  assert.equal(other.at(-1)?.finishReason, 'length');
  assert.equal(numCalls, 1);
  // The thrower's prompt and the other's prompt and outputs fill one 4-token block each.
  assert.deepEqual(engine.health().load, { numRunning: 0, numWaiting: 0, numFreeBlocks: 32, numTotalBlocks: 32, numQueuedPrefillTokens: 0, numCachedBlocks: 2 });
  // One line in the worker's log, naming the request and the error.
  const warnings = lines.map((line) => JSON.parse(line)).filter((line) => line.level === 'warn');
  assert.equal(warnings.length, 1);
  assert.equal(warnings[0].engine_request_id, 'thrower');
  assert.equal(warnings[0].err.message, 'listener bug');
});
