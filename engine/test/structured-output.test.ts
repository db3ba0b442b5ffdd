// Structured outputs through the engine on conduit-tiny (its real vocabulary, the native runtime,
// grammar threads): every constraint kind holds at temperature 1; what the grammar engine cannot
// honour is refused before any token; grammars compile while prompts are computed; a grammar's
// stop token ends the output; and constrained and free requests sharing batches give what each
// gives alone, token for token (the runtime is batch-invariant and jump-forward depends only on
// the request's own state).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { Worker } from 'node:worker_threads';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import { packageRoot } from '../../package-root.ts';
import { loadModel } from '../../native/index.ts';
import { createEngine, type Engine } from '../engine.ts';
import { GrammarService, prepareStructuredOutput } from '../grammar/service.ts';
import type { ThreadRequest } from '../grammar/messages.ts';
import { GrpcEngineClient } from '../grpc/client.ts';
import { serveEngine } from '../grpc/service.ts';
import { loadGrammarVocabulary } from '../grammar/vocabulary.ts';
import { NativeRunner } from '../native-runner.ts';
import type { ScheduledSequence, SchedulerOutput } from '../scheduler-output.ts';
import type { GenerateRequest, RequestOutput, StructuredOutput } from '../types.ts';
import { RecordingRunner } from './tiny-model.ts';

const MODEL_DIR = path.join(packageRoot, 'models', 'conduit-tiny');
const VOCAB_SIZE = 4096;
const EOS = 4095;
const MAX_NUM_SEQS = 16;

const vocabulary = loadGrammarVocabulary(MODEL_DIR, VOCAB_SIZE);
const textOf = (tokenIds: readonly number[]) => Buffer.concat(tokenIds.map((id) => vocabulary.tokenBytes[id] ?? new Uint8Array())).toString('utf8');

interface Outcome {
  tokenIds: number[];
  text: string;
  finishReason: string;
  error?: string;
  numOutputs: number;
}

async function withEngine(
  fn: (engine: Engine, runner: RecordingRunner, grammars: GrammarService) => Promise<void>,
  maxNumBatchedTokens = 256,
  numCores?: number,
  deferGrammarCompiles?: 'short-prompts' | 'always' | 'never',
): Promise<void> {
  const model = await loadModel({ modelDir: MODEL_DIR, dtype: 'auto', kvCacheDtype: 'auto', numKvBlocks: 512, blockSizeTokens: 16, numThreads: 2, kernel: 'auto' });
  const runner = new RecordingRunner(new NativeRunner(model, { maxModelLen: 2048, maxNumSeqs: MAX_NUM_SEQS, maxNumBatchedTokens }));
  const grammars = new GrammarService({ modelDir: MODEL_DIR, vocabSize: VOCAB_SIZE, eosTokenIds: [EOS], maxNumSeqs: MAX_NUM_SEQS, numThreads: 2 });
  const engine = createEngine(runner, { servedName: 'tiny', maxNumSeqs: MAX_NUM_SEQS, maxNumBatchedTokens, generationDefaults: { eosTokenIds: [EOS] }, grammars, numCores, deferGrammarCompiles });
  try {
    await fn(engine, runner, grammars);
  } finally {
    await engine.close();
  }
}

function generate(engine: Engine, request: GenerateRequest): Promise<Outcome> {
  return new Promise((resolve) => {
    const tokenIds: number[] = [];
    let numOutputs = 0;
    engine.generate(request, (output: RequestOutput) => {
      numOutputs++;
      tokenIds.push(...output.newTokenIds);
      if (output.finishReason === null) return;
      const text = textOf(output.stopTokenId === undefined ? tokenIds : tokenIds.slice(0, -1));
      resolve({ tokenIds, text, finishReason: output.finishReason, error: output.error?.message, numOutputs });
    });
  });
}

const prompt = (salt: number, length = 12) => Array.from({ length }, (_, i) => (salt * 131 + i * 17) % 4000);

function request(requestId: string, structuredOutput: StructuredOutput | undefined, seed: number, extra: Partial<GenerateRequest> = {}): GenerateRequest {
  return { requestId, promptTokenIds: prompt(seed), sampling: { temperature: 1, seed: BigInt(seed), maxTokens: 160 }, structuredOutput, ...extra };
}

const PERSON = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 12 },
    age: { type: 'integer', minimum: 0, maximum: 120 },
    height: { type: 'number', exclusiveMinimum: 0.5, maximum: 2.5 },
    born: { type: 'string', format: 'date' },
    tags: { type: 'array', items: { enum: ['red', 'green', 'blue'] }, minItems: 1, maxItems: 3 },
    email: { type: ['string', 'null'], format: 'email' },
    address: {
      type: 'object',
      properties: { city: { type: 'string', maxLength: 8 }, zip: { type: 'string', pattern: '^[0-9]{5}$' } },
      required: ['city', 'zip'],
      additionalProperties: false,
    },
  },
  required: ['name', 'age', 'height', 'born', 'tags', 'address'],
  additionalProperties: false,
};

test('each kind of constraint holds at temperature 1: a JSON schema, JSON mode, a regex, a choice, an EBNF grammar', async () => {
  const ajv = new Ajv2020.default({ strict: false });
  addFormats.default(ajv);
  const validate = ajv.compile(PERSON);
  await withEngine(async (engine) => {
    const schemaOutcomes = await Promise.all([1, 2, 3, 4].map((seed) => generate(engine, request(`person-${seed}`, { constraint: { kind: 'json_schema', schema: JSON.stringify(PERSON) } }, seed, { sampling: { temperature: 1, seed: BigInt(seed), maxTokens: 400 } }))));
    for (const outcome of schemaOutcomes) {
      assert.equal(outcome.finishReason, 'stop', outcome.text);
      assert.ok(validate(JSON.parse(outcome.text)), `${outcome.text}: ${ajv.errorsText(validate.errors)}`);
      assert.ok(outcome.numOutputs < outcome.tokenIds.length, `jump-forward emits forced tokens several per step (${outcome.numOutputs} outputs for ${outcome.tokenIds.length} tokens)`);
    }
    const object = await generate(engine, request('object', { constraint: { kind: 'json_object' } }, 5));
    assert.equal(object.finishReason, 'stop', object.text);
    const value = JSON.parse(object.text);
    assert.ok(typeof value === 'object' && value !== null && !Array.isArray(value), object.text);
    const regex = await generate(engine, request('regex', { constraint: { kind: 'regex', pattern: '[0-9]{3}-[a-z]{2,5}' } }, 6));
    assert.match(regex.text, /^[0-9]{3}-[a-z]{2,5}$/);
    const choice = await generate(engine, request('choice', { constraint: { kind: 'choice', choices: ['yes', 'no', 'not sure'] } }, 7));
    assert.ok(['yes', 'no', 'not sure'].includes(choice.text), choice.text);
    assert.equal(choice.finishReason, 'stop');
    const grammar = await generate(engine, request('ebnf', { constraint: { kind: 'grammar', grammar: 'root ::= "(" item ("," item)? ")"\nitem ::= [a-c] [0-9]' } }, 8));
    assert.match(grammar.text, /^\([a-c][0-9](,[a-c][0-9])?\)$/);
  });
});

test('what the grammar engine cannot honour is refused before any token, naming it', async () => {
  await withEngine(async (engine) => {
    const cases: Array<[StructuredOutput, RegExp]> = [
      [{ constraint: { kind: 'json_schema', schema: JSON.stringify({ type: 'object', properties: { a: { type: 'array', uniqueItems: true } } }) } }, /"uniqueItems" is not supported \(at #\/properties\/a\)/],
      [{ constraint: { kind: 'json_schema', schema: JSON.stringify({ type: 'number', exclusiveMinimum: 1e12 }) } }, /"exclusiveMinimum" beyond 9.01e\+9 is not supported on numbers \(at #\)/],
      [{ constraint: { kind: 'json_schema', schema: JSON.stringify({ type: 'string', format: 'uri-template' }) } }, /string format "uri-template" is not supported/],
      [{ constraint: { kind: 'json_schema', schema: JSON.stringify({ oneOf: [{ type: 'integer' }, { type: 'number' }] }) } }, /"oneOf" is supported only when no value can match two/],
      [{ constraint: { kind: 'json_schema', schema: '{"type": ' } }, /not JSON/],
      [{ constraint: { kind: 'regex', pattern: '[a-' } }, /could not be compiled: Regex parsing error/],
      [{ constraint: { kind: 'grammar', grammar: 'root ::= undefined_rule' } }, /could not be compiled/],
      [{ constraint: { kind: 'choice', choices: [] } }, /one or more non-empty strings/],
      [{ constraint: { kind: 'structural_tag', structuralTag: JSON.stringify({ type: 'structural_tag', format: { type: 'tag', begin: '<', content: { type: 'json_schema', json_schema: { not: {} } }, end: '>' } }) } }, /"not" is not supported/],
    ];
    for (const [index, [structured, message]] of cases.entries()) {
      const outcome = await generate(engine, request(`bad-${index}`, structured, index));
      assert.equal(outcome.finishReason, 'error');
      assert.deepEqual(outcome.tokenIds, []);
      assert.match(outcome.error!, message);
    }
    // The threads keep serving after a grammar aborted inside them.
    const after = await generate(engine, request('after', { constraint: { kind: 'choice', choices: ['ok'] } }, 9));
    assert.equal(after.text, 'ok');
  });
});

test('a structural tag (forced tool calls): each call in its wrapper, its arguments JSON on one line, held to their schema', async () => {
  const parameters = { type: 'object', properties: { city: { type: 'string', maxLength: 10 }, unit: { enum: ['c', 'f'] } }, required: ['city', 'unit'], additionalProperties: false };
  const call = (name: string, schema: object) => ({ type: 'tag', begin: `<tool_call>\n{"name": "${name}", "arguments": `, content: { type: 'json_schema', json_schema: schema }, end: '}\n</tool_call>' });
  const format = { type: 'tags_with_separator', tags: [call('get_weather', parameters), call('get_time', { type: 'object', properties: {}, additionalProperties: false })], separator: '\n', at_least_one: true, stop_after_first: true };
  const ajv = new Ajv2020.default({ strict: false });
  await withEngine(async (engine) => {
    for (const seed of [51, 52, 53, 54]) {
      const outcome = await generate(engine, request(`tag-${seed}`, { constraint: { kind: 'structural_tag', structuralTag: JSON.stringify({ type: 'structural_tag', format }) } }, seed, { sampling: { temperature: 1, seed: BigInt(seed), maxTokens: 200 } }));
      assert.equal(outcome.finishReason, 'stop', outcome.text);
      const match = /^<tool_call>\n(\{.*\})\n<\/tool_call>$/.exec(outcome.text);
      assert.ok(match !== null, outcome.text);
      const parsed = JSON.parse(match[1]) as { name: string; arguments: object };
      assert.ok(ajv.validate(parsed.name === 'get_weather' ? parameters : { type: 'object', additionalProperties: false }, parsed.arguments), outcome.text);
    }
  });
});

test('the grammar compiles while the prompt is computed; no sample is drawn before it is ready', async () => {
  await withEngine(async (engine, runner) => {
    const long: GenerateRequest = { ...request('long', { constraint: { kind: 'json_schema', schema: JSON.stringify(PERSON) } }, 11), promptTokenIds: prompt(11, 600) };
    const outcome = await generate(engine, long);
    assert.equal(outcome.finishReason, 'stop', outcome.text);
    const entries = runner.steps.flatMap((step) => step.scheduled.filter((entry) => entry.requestId === 'long'));
    assert.ok(entries.some((entry) => !entry.grammar!.isReady && entry.numScheduledTokens > 0), 'prompt chunks ran while the grammar compiled');
    assert.ok(entries.every((entry) => !entry.sample || entry.grammar!.isReady), 'nothing sampled before the grammar was ready');
  }, 64);
});

test('while a new grammar compiles, the compute threads leave its thread a core (2 on 2 cores: 1), all rejoin once it ends; the outputs are bitwise those of full-thread steps', async () => {
  // The schema differs from every other test's, so it compiles; the free request's prompt
  // logprobs score its prefill chunks, which run beside the compile.
  const schema = JSON.stringify({ ...PERSON, properties: { ...PERSON.properties, nickname: { type: 'string', maxLength: 6 } } });
  const constrained: GenerateRequest = { ...request('compiling', { constraint: { kind: 'json_schema', schema } }, 31), promptTokenIds: prompt(31, 600) };
  const free: GenerateRequest = request('free', undefined, 32, { promptTokenIds: prompt(32, 300), sampling: { temperature: 1, seed: 32n, maxTokens: 64, numTopLogprobs: 3, numPromptLogprobs: 2 } });
  const run = async (numCores: number) => {
    let outcome: { outputs: RequestOutput[][]; activeThreadsAtStep: number[]; steps: SchedulerOutput[]; numStepsCompiling: number; numActiveAfter: number } | null = null;
    await withEngine(async (engine, runner, grammars) => {
      const outputs: RequestOutput[][] = [[], []];
      await Promise.all([constrained, free].map((each, i) => new Promise<void>((resolve) => {
        engine.generate(each, (output) => {
          outputs[i].push(output);
          if (output.finishReason !== null) resolve();
        });
      })));
      assert.equal(grammars.numBusyGrammarThreads, 0);
      const numStepsCompiling = runner.steps.filter((step) => step.scheduled.some((entry) => entry.grammar !== null && !entry.grammar.isReady)).length;
      outcome = { outputs, activeThreadsAtStep: runner.activeThreadsAtStep, steps: runner.steps, numStepsCompiling, numActiveAfter: Atomics.load(runner.activeThreadsCell!, 0) };
    }, 64, numCores);
    return outcome!;
  };
  const lowered = await run(2);
  assert.ok(lowered.numStepsCompiling > 0, 'steps ran while the grammar compiled');
  // From admission (before the first step) one thread, then both from the compile's end on.
  const numLoweredSteps = lowered.activeThreadsAtStep.indexOf(2);
  assert.ok(numLoweredSteps >= 1, `the first step ran on one thread: ${lowered.activeThreadsAtStep}`);
  // After it, a step may begin while a grammar thread fills its one mask row on one thread.
  const fillsMask = (step: number) => lowered.steps[step].scheduled.some((entry) => entry.sample && entry.grammar?.isReady === true);
  assert.ok(lowered.activeThreadsAtStep.every((count, step) => count === (step < numLoweredSteps ? 1 : 2) || (count === 1 && fillsMask(step))), `${lowered.activeThreadsAtStep}`);
  assert.equal(lowered.numActiveAfter, 2);
  // Cores to spare: both threads stay while it compiles.
  const full = await run(64);
  assert.ok(full.activeThreadsAtStep.every((count) => count === 2), `${full.activeThreadsAtStep}`);
  // Steps may group the outputs differently (the compile ends at another moment): compared whole.
  const whole = (outputs: RequestOutput[]) => ({
    tokenIds: outputs.flatMap((output) => output.newTokenIds),
    logprobs: outputs.flatMap((output) => output.newLogprobs),
    topLogprobs: outputs.flatMap((output) => output.newTopLogprobs ?? []),
    promptLogprobs: outputs.flatMap((output) => output.promptLogprobs ?? []),
    finishReason: outputs.at(-1)!.finishReason,
  });
  for (const i of [0, 1]) assert.deepEqual(whole(lowered.outputs[i]), whole(full.outputs[i]), `${[constrained, free][i].requestId}: the same tokens and logprobs on 1 thread as on 2`);
  assert.ok(whole(lowered.outputs[1]).promptLogprobs.length > 0 && whole(lowered.outputs[1]).topLogprobs.length > 0, 'the free request reported its logprobs');
  assert.equal(lowered.outputs[0].at(-1)!.finishReason, 'stop');
});

test('a grammar thread raises the compute threads itself the moment its compile (or a deferred grammar\'s byte phase) ends, while the event loop is busy', async () => {
  const cell = new Int32Array(new SharedArrayBuffer(4));
  const grammars = new GrammarService({ modelDir: MODEL_DIR, vocabSize: VOCAB_SIZE, eosTokenIds: [EOS], maxNumSeqs: MAX_NUM_SEQS, numThreads: 1 });
  grammars.shareComputeThreads(cell, 2, 2);
  // Blocks the event loop until the cell reads 2: no reply of the thread can be handled meanwhile.
  const blockUntilRaised = (what: string) => {
    const deadline = performance.now() + 60_000;
    while (Atomics.load(cell, 0) !== 2) assert.ok(performance.now() < deadline, `${what}: the compute threads were not raised without the event loop`);
  };
  try {
    for (const [index, deferCompile] of [[0, true], [1, false]] as const) {
      const schema = JSON.stringify({ ...PERSON, title: `raised-${index}-${Date.now()}` });
      const prepared = prepareStructuredOutput({ constraint: { kind: 'json_schema', schema } }, VOCAB_SIZE);
      assert.ok(!('code' in prepared));
      const grammar = grammars.create(`raise-${index}`, prepared, [EOS]);
      grammars.open(grammar, deferCompile);
      assert.equal(Atomics.load(cell, 0), 1, 'lowered as the compile is posted');
      assert.equal(grammars.numBusyGrammarThreads, 1);
      blockUntilRaised(deferCompile ? 'byte phase' : 'compile');
      assert.equal(grammars.numBusyGrammarThreads, 0);
      grammars.close(grammar.requestId);
    }
  } finally {
    await grammars.shutdown();
  }
});

test('a grammar thread filling a step\'s few rows leaves its core for the fill (the compute threads drop, and rejoin once it ends); many rows keep every compute thread', async () => {
  const cell = new Int32Array(new SharedArrayBuffer(4));
  const grammars = new GrammarService({ modelDir: MODEL_DIR, vocabSize: VOCAB_SIZE, eosTokenIds: [EOS], maxNumSeqs: MAX_NUM_SEQS, numThreads: 1 });
  grammars.shareComputeThreads(cell, 2, 2);
  try {
    const opened = Array.from({ length: 2 }, (_, index) => {
      const prepared = prepareStructuredOutput({ constraint: { kind: 'regex', pattern: '[a-z]+' } }, VOCAB_SIZE);
      assert.ok(!('code' in prepared));
      return grammars.create(`fill-${index}`, prepared, [EOS]);
    });
    const ready = new Promise<void>((resolve) => (grammars.onChange = () => opened.every((grammar) => grammar.isReady) && resolve()));
    for (const grammar of opened) grammars.open(grammar);
    await Promise.race([ready, new Promise((_, reject) => setTimeout(() => reject(new Error('the grammars did not open within 60 s')), 60_000).unref())]);
    assert.equal(Atomics.load(cell, 0), 2, 'no compile runs');
    // Each entry's first fill accepts thousands of output tokens (a long fill, which the watcher
    // below cannot miss); later fills accept none and write the same row again.
    const letters = vocabulary.tokenBytes.findIndex((bytes) => bytes != null && /^[a-z]+$/.test(Buffer.from(bytes).toString('latin1')));
    const numOutputTokens = 20_000;
    const entries = opened.map((grammar) => ({ requestId: grammar.requestId, tokenIds: [1, 2, 3, ...Array<number>(numOutputTokens).fill(letters)], sample: true, numOutputTokens, grammar }) as unknown as ScheduledSequence);
    // Another thread watches the cell (the event loop, descheduled as it posts, would see a
    // fill's tenths of a millisecond only by luck), keeping the lowest it reads in each phase's
    // own slot: a read of the last phase, stored late, cannot count in this one.
    const watch = new Int32Array(new SharedArrayBuffer(12));
    const watcher = new Worker(`const { parentPort, workerData: [cell, watch] } = require('node:worker_threads');
      parentPort.postMessage('watching');
      for (let phase; (phase = Atomics.load(watch, 0)) >= 0; ) if (phase > 0) Atomics.store(watch, phase, Math.min(Atomics.load(watch, phase), Atomics.load(cell, 0)));`, { eval: true, workerData: [cell, watch] });
    await once(watcher, 'message');
    const lowestDuringFills = async (phase: number, scheduled: ScheduledSequence[], numFills: number) => {
      Atomics.store(watch, phase, 2);
      Atomics.store(watch, 0, phase);
      for (let fill = 0; fill < numFills; fill++) {
        grammars.fillStep(scheduled);
        await grammars.stepDone();
        assert.equal(Atomics.load(cell, 0), 2, 'every compute thread rejoins once the fill has answered');
      }
      Atomics.store(watch, 0, 0);
      return Atomics.load(watch, phase);
    };
    try {
      assert.equal(await lowestDuringFills(1, entries.slice(0, 1), 5), 1, 'one row: a compute thread leaves the fill its core');
      assert.equal(await lowestDuringFills(2, entries, 5), 2, 'more rows than grammar threads: every compute thread stays');
    } finally {
      Atomics.store(watch, 0, -1);
      await once(watcher, 'exit');
    }
  } finally {
    await grammars.shutdown();
  }
});

test('what a new grammar forces from its start is output before anything is sampled, even before it compiles', async () => {
  await withEngine(async (engine) => {
    const outputs: RequestOutput[] = [];
    const long: GenerateRequest = { ...request('start', { constraint: { kind: 'json_schema', schema: JSON.stringify(PERSON) } }, 61), promptTokenIds: prompt(61, 600) };
    await new Promise<void>((resolve) => engine.generate(long, (output) => (outputs.push(output), output.finishReason !== null && resolve())));
    const [first] = outputs;
    assert.ok(first.newTokenIds.length > 0);
    assert.ok('{"name": "'.startsWith(textOf(first.newTokenIds)), textOf(first.newTokenIds));
    assert.equal(first.prefillTimeMs, undefined, 'no token of it was sampled');
    assert.equal(outputs.filter((output) => output.prefillTimeMs !== undefined).length, 1, 'the first sampled token reports the prefill');
    // A budget smaller than the forced start ends with it.
    const cut = await generate(engine, request('start-cut', { constraint: { kind: 'json_schema', schema: JSON.stringify({ ...PERSON, title: 'other' }) } }, 62, { sampling: { temperature: 1, seed: 62n, maxTokens: 2 } }));
    assert.equal(cut.finishReason, 'length');
    assert.equal(cut.tokenIds.length, 2);
  }, 64);
});

test('a request alone with a new grammar, compiled after its forced start: that start comes before the compile ends, the first sample waits in its pass for the mask; outputs bitwise those of compiling from admission, new and cached; refusals still come before any token', async () => {
  const schema = JSON.stringify({ ...PERSON, properties: { ...PERSON.properties, pet: { enum: ['cat', 'dog'] } }, required: [...PERSON.required, 'pet'] });
  const structured: StructuredOutput = { constraint: { kind: 'json_schema', schema } };
  const whole = (outputs: RequestOutput[]) => ({ tokenIds: outputs.flatMap((output) => output.newTokenIds), logprobs: outputs.flatMap((output) => output.newLogprobs), finishReason: outputs.at(-1)!.finishReason });
  const run = async (mode: 'always' | 'never') => {
    const outcome: { outputs: RequestOutput[][]; compilingAtFirstOutput: number; sampledBeforeReady: number; neighboursSampledBeforeReady: number } = { outputs: [], compilingAtFirstOutput: -1, sampledBeforeReady: 0, neighboursSampledBeforeReady: 0 };
    await withEngine(async (engine, runner, grammars) => {
      const collect = (each: GenerateRequest, onFirst?: () => void) => new Promise<RequestOutput[]>((resolve) => {
        const outputs: RequestOutput[] = [];
        engine.generate(each, (output) => {
          if (outputs.length === 0) onFirst?.();
          outputs.push(output);
          if (output.finishReason !== null) resolve(outputs);
        });
      });
      // New (compiled now), then cached, each alone, short prompts.
      outcome.outputs.push(await collect(request('new', structured, 71), () => (outcome.compilingAtFirstOutput = grammars.numBusyGrammarThreads)));
      outcome.outputs.push(await collect(request('cached', structured, 72)));
      const sampledBeforeReady = (ids: string[]) => runner.steps.flatMap((step) => step.scheduled).filter((entry) => ids.includes(entry.requestId) && entry.sample && !entry.grammar!.isReady).length;
      outcome.sampledBeforeReady = sampledBeforeReady(['new', 'cached']);
      // A neighbour arrives during the new grammar's first pass (its compile deferred, as it
      // arrived alone): in every step scheduled after that, neither is alone, so it holds back its
      // sample until ready. (When the forced start is known before that first pass, the pass may
      // itself sample, rightly: it was scheduled alone. Only the steps after count.)
      const other = { constraint: { kind: 'json_schema', schema: JSON.stringify({ ...PERSON, title: 'neighbours' }) } } as const;
      let neighbour: Promise<RequestOutput[]> | null = null;
      let numStepsBeforeNeighbour = 0;
      const freeNeighbour = request('pair-1', undefined, 74, { sampling: { temperature: 1, seed: 74n, maxTokens: 400, ignoreEos: true } });
      const execute = runner.execute.bind(runner);
      runner.execute = (output, bitmasks) => {
        if (neighbour === null && output.scheduled.some((entry) => entry.requestId === 'pair-0')) {
          // This step is recorded by execute() below: it and those before it were scheduled alone.
          numStepsBeforeNeighbour = runner.steps.length + 1;
          neighbour = collect(freeNeighbour);
        }
        return execute(output, bitmasks);
      };
      const first = await collect(request('pair-0', other, 73));
      outcome.outputs.push(first, await neighbour!);
      // Only while the neighbour is in flight: a compile that outlasts its 400 tokens (a loaded
      // machine) leaves pair-0 alone again, when it may rightly sample.
      outcome.neighboursSampledBeforeReady = runner.steps.slice(numStepsBeforeNeighbour)
        .filter((step) => step.scheduled.some((entry) => entry.requestId === 'pair-1'))
        .flatMap((step) => step.scheduled)
        .filter((entry) => entry.requestId === 'pair-0' && entry.sample && !entry.grammar!.isReady).length;
      for (const [index, bad] of [{ kind: 'regex', pattern: '[a-' }, { kind: 'grammar', grammar: 'root ::= undefined_rule' }].entries()) {
        const refused = await generate(engine, request(`bad-${index}`, { constraint: bad as StructuredOutput['constraint'] }, 75 + index));
        assert.equal(refused.finishReason, 'error');
        assert.deepEqual(refused.tokenIds, [], 'nothing generated before the refusal');
        assert.match(refused.error!, /could not be compiled/);
      }
    }, 256, undefined, mode);
    return outcome;
  };
  const deferred = await run('always');
  const eager = await run('never');
  assert.ok(deferred.compilingAtFirstOutput === 1, `the forced start came while the grammar compiled (busy grammar threads then: ${deferred.compilingAtFirstOutput})`);
  assert.ok('{"name": "'.startsWith(textOf(deferred.outputs[0][0].newTokenIds)) && deferred.outputs[0][0].newTokenIds.length > 0, textOf(deferred.outputs[0][0].newTokenIds));
  assert.equal(deferred.sampledBeforeReady, 1, 'the new grammar\'s first sample was drawn in a pass that began before it was ready (the cached one\'s never)');
  assert.equal(eager.sampledBeforeReady, 0);
  assert.equal(deferred.neighboursSampledBeforeReady, 0, 'beside another request, no sample before the grammar is ready');
  for (const [index, outputs] of deferred.outputs.entries()) {
    assert.deepEqual(whole(outputs), whole(eager.outputs[index]), `request ${index}: the same tokens and logprobs deferred as from admission`);
  }
  assert.equal(deferred.outputs[0].at(-1)!.finishReason, 'stop');
});

test('a deferred grammar whose compile over the vocabulary fails after its forced start: its pass\'s sample (under an empty mask row) is never output; the request ends with the compile\'s error', async () => {
  await withEngine(async (engine, runner, grammars) => {
    // Test-only: the request's compile, when it comes, is replaced by one that fails (an EBNF
    // rule left undefined), for the same slot: its byte phase succeeded, its vocabulary compile
    // fails, as in production the corner can only arise.
    const service = grammars as unknown as { post: (thread: unknown, request: ThreadRequest) => void };
    const post = service.post.bind(grammars);
    let numReplaced = 0;
    service.post = (thread, message) => {
      if (message.kind !== 'compile') return post(thread, message);
      numReplaced++;
      post(thread, { kind: 'open', slot: message.slot, key: `broken-${message.slot}`, constraint: { kind: 'grammar', grammar: 'root ::= undefined_rule' }, constrainAfter: null, stopTokenIds: [EOS], jumpForward: false, deferCompile: false, countsCompile: true });
    };
    const schema = JSON.stringify({ ...PERSON, title: 'fails-over-the-vocabulary' });
    const outputs: RequestOutput[] = [];
    await new Promise<void>((resolve) => engine.generate(request('broken', { constraint: { kind: 'json_schema', schema } }, 81), (output) => {
      outputs.push(output);
      if (output.finishReason !== null) resolve();
    }));
    assert.equal(numReplaced, 1, 'its compile was deferred, then failed');
    const sampled = runner.steps.flatMap((step) => step.scheduled).filter((entry) => entry.requestId === 'broken' && entry.sample);
    assert.equal(sampled.length, 1, 'a pass sampled it while it compiled (the corner)');
    const last = outputs.at(-1)!;
    assert.equal(last.finishReason, 'error');
    assert.match(last.error!.message, /could not be compiled/);
    const tokenIds = outputs.flatMap((output) => output.newTokenIds);
    assert.ok(tokenIds.length > 0 && '{"name": "'.startsWith(textOf(tokenIds)), `only the forced start was output: ${JSON.stringify(textOf(tokenIds))}`);
    assert.ok(outputs.every((output) => output.prefillTimeMs === undefined), 'no sampled token was output');
    assert.equal(grammars.numBusyGrammarThreads, 0);
  }, 256, undefined, 'always');
});

test('prefix tokens (Mistral\'s [TOOL_CALLS]) come first, unseen by the grammar, then its forced start and what it allows', async () => {
  await withEngine(async (engine) => {
    const PREFIX = [4000, 4001];
    for (const [i, jumpForward] of [true, false].entries()) {
      const outcome = await generate(engine, request(`prefix-${i}`, { constraint: { kind: 'json_schema', schema: JSON.stringify(PERSON) }, prefixTokenIds: PREFIX, jumpForward }, 70 + i));
      assert.equal(outcome.finishReason, 'stop', outcome.error);
      assert.deepEqual(outcome.tokenIds.slice(0, 2), PREFIX);
      const rest = textOf(outcome.tokenIds.slice(2, -1));
      assert.ok(rest.startsWith('{"name": "'), rest);
      JSON.parse(rest);
    }
    const choice = await generate(engine, request('prefix-choice', { constraint: { kind: 'choice', choices: ['left', 'right'] }, prefixTokenIds: [5] }, 72));
    assert.equal(choice.tokenIds[0], 5);
    assert.ok(['left', 'right'].includes(textOf(choice.tokenIds.slice(1, -1))), textOf(choice.tokenIds));
    for (const [structured, message] of [
      [{ constraint: { kind: 'choice', choices: ['a'] }, prefixTokenIds: [VOCAB_SIZE] }, /prefixTokenIds must be token ids below 4096/],
      [{ constraint: { kind: 'choice', choices: ['a'] }, prefixTokenIds: [5], constrainAfter: '</think>' }, /cannot come with constrainAfter/],
    ] as Array<[StructuredOutput, RegExp]>) {
      const refused = await generate(engine, request('prefix-bad', structured, 73));
      assert.equal(refused.finishReason, 'error');
      assert.match(refused.error!, message);
    }
  });
});

test('constrained and free requests in shared batches give what each gives alone, token for token', async () => {
  const structured = (i: number): StructuredOutput | undefined =>
    i % 3 === 0 ? undefined : i % 3 === 1 ? { constraint: { kind: 'json_schema', schema: JSON.stringify(PERSON) } } : { constraint: { kind: 'regex', pattern: '(ab|[0-9]{2})+!' }, jumpForward: false };
  const requests = Array.from({ length: 9 }, (_, i) => request(`mixed-${i}`, structured(i), 20 + i, { sampling: { temperature: i % 2 === 0 ? 0 : 1, seed: BigInt(20 + i), maxTokens: 96 } }));
  const alone: Outcome[] = [];
  await withEngine(async (engine) => {
    for (const each of requests) alone.push(await generate(engine, each));
  });
  await withEngine(async (engine) => {
    const together = await Promise.all(requests.map((each) => generate(engine, each)));
    together.forEach((outcome, i) => {
      assert.deepEqual(outcome.tokenIds, alone[i].tokenIds, `${requests[i].requestId}: ${outcome.text} vs alone ${alone[i].text}`);
      assert.equal(outcome.finishReason, alone[i].finishReason);
    });
  });
});

test('a cut-off output ends with length; a grammar\'s stop token ends it with stop even under min_tokens and ignore_eos', async () => {
  await withEngine(async (engine) => {
    const cut = await generate(engine, request('cut', { constraint: { kind: 'json_schema', schema: JSON.stringify(PERSON) } }, 31, { sampling: { temperature: 1, seed: 31n, maxTokens: 7 } }));
    assert.equal(cut.finishReason, 'length');
    assert.equal(cut.tokenIds.length, 7);
    assert.ok(cut.text.startsWith('{"name":'), cut.text);
    const done = await generate(engine, request('done', { constraint: { kind: 'choice', choices: ['fine'] } }, 32, { sampling: { temperature: 1, seed: 32n, maxTokens: 50, minTokens: 20, ignoreEos: true } }));
    assert.equal(done.finishReason, 'stop');
    assert.equal(done.tokenIds.at(-1), EOS);
    assert.equal(done.text, 'fine');
  });
});

test('every kind of constraint crosses engine.proto intact: the same tokens as asked in process', async () => {
  const kinds: StructuredOutput[] = [
    { constraint: { kind: 'json_schema', schema: JSON.stringify(PERSON) }, jumpForward: false },
    { constraint: { kind: 'json_object' } },
    { constraint: { kind: 'regex', pattern: '[a-z]{1,4}!' } },
    { constraint: { kind: 'choice', choices: ['left', 'right'] } },
    { constraint: { kind: 'grammar', grammar: 'root ::= "<" [0-9]+ ">"' } },
    { constraint: { kind: 'structural_tag', structuralTag: JSON.stringify({ type: 'structural_tag', format: { type: 'const_string', value: 'fixed' } }) } },
    { constraint: { kind: 'regex', pattern: '[0-9]+' }, constrainAfter: 'x' },
    { constraint: { kind: 'choice', choices: ['left', 'right'] }, prefixTokenIds: [7, 8] },
  ];
  await withEngine(async (engine) => {
    const server = await serveEngine(engine, '127.0.0.1:0');
    const client = new GrpcEngineClient(server.address);
    try {
      for (const [i, structured] of kinds.entries()) {
        const each = request(`wire-${i}`, structured, 40 + i, { sampling: { temperature: 1, seed: BigInt(40 + i), maxTokens: 48 } });
        const direct = await generate(engine, each);
        const remote = await new Promise<number[]>((resolve, reject) => {
          const tokenIds: number[] = [];
          client.generate({ ...each, requestId: `remote-${i}` }, (output) => {
            tokenIds.push(...output.newTokenIds);
            if (output.finishReason === 'error') reject(new Error(output.error?.message));
            else if (output.finishReason !== null) resolve(tokenIds);
          });
        });
        assert.deepEqual(remote, direct.tokenIds, `${JSON.stringify(structured)}: ${direct.text}`);
      }
    } finally {
      client.close();
      await server.close();
    }
  });
});

test('a grammar service\'s threadNice lowers its grammar threads\' priority alone, not the process\'s', { skip: process.platform !== 'linux' && 'per-thread niceness is Linux\'s' }, async () => {
  const niceOfThreads = () =>
    readdirSync('/proc/self/task').map((tid) => ({ tid: Number(tid), nice: Number(readFileSync(`/proc/self/task/${tid}/stat`, 'utf8').split(') ')[1].split(' ')[16]) }));
  const before = niceOfThreads();
  const grammars = new GrammarService({ modelDir: MODEL_DIR, vocabSize: VOCAB_SIZE, eosTokenIds: [EOS], maxNumSeqs: MAX_NUM_SEQS, numThreads: 1, threadNice: 7 });
  try {
    const prepared = prepareStructuredOutput({ constraint: { kind: 'regex', pattern: '[a-z]+' } }, VOCAB_SIZE);
    assert.ok(!('code' in prepared));
    const grammar = grammars.create('nice', prepared, [EOS]);
    const opened = new Promise<void>((resolve) => (grammars.onChange = () => grammar.isReady && resolve()));
    grammars.open(grammar);
    await Promise.race([opened, new Promise((_, reject) => setTimeout(() => reject(new Error('the grammar did not open within 60 s')), 60_000).unref())]);
    const niced = niceOfThreads().filter(({ tid, nice }) => nice === 7 && !before.some((thread) => thread.tid === tid));
    assert.equal(niced.length, 1, 'the one grammar thread runs at niceness 7');
    assert.equal(niceOfThreads().find(({ tid }) => tid === process.pid)?.nice, before.find(({ tid }) => tid === process.pid)?.nice, 'the main thread keeps its niceness');
  } finally {
    await grammars.shutdown();
  }
});

test('a grammar thread that dies mid-output fails its sequences alone; no step waits on its rows, and later grammars get a new thread', async () => {
  const model = await loadModel({ modelDir: MODEL_DIR, dtype: 'auto', kvCacheDtype: 'auto', numKvBlocks: 512, blockSizeTokens: 16, numThreads: 2, kernel: 'auto' });
  const runner = new NativeRunner(model, { maxModelLen: 2048, maxNumSeqs: MAX_NUM_SEQS, maxNumBatchedTokens: 256 });
  const grammars = new GrammarService({ modelDir: MODEL_DIR, vocabSize: VOCAB_SIZE, eosTokenIds: [EOS], maxNumSeqs: MAX_NUM_SEQS, numThreads: 1 });
  const engine = createEngine(runner, { servedName: 'tiny', maxNumSeqs: MAX_NUM_SEQS, maxNumBatchedTokens: 256, generationDefaults: { eosTokenIds: [EOS] }, grammars });
  const within = <T>(promise: Promise<T>, what: string) =>
    Promise.race([promise, new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`${what} did not end within 60 s`)), 60_000).unref())]);
  try {
    const endless = { constraint: { kind: 'regex', pattern: '[a-z]{400}' } } satisfies StructuredOutput;
    let killed = false;
    const doomed = within(new Promise<RequestOutput>((resolve) => {
      engine.generate(request('doomed', endless, 71, { sampling: { temperature: 1, seed: 71n, maxTokens: 300 } }), (output) => {
        if (!killed && output.numOutputTokens >= 4) {
          killed = true;
          // The thread dies while the next steps' fills are posted to it.
          void (grammars as unknown as { threads: Array<{ worker: { terminate(): Promise<number> } }> }).threads[0].worker.terminate();
        }
        if (output.finishReason !== null) resolve(output);
      });
    }), 'the request whose thread died');
    const free = within(generate(engine, request('free-beside', undefined, 72, { sampling: { temperature: 1, seed: 72n, maxTokens: 40, ignoreEos: true } })), 'a free request beside it');
    const ended = await doomed;
    assert.equal(ended.finishReason, 'error');
    assert.match(ended.error?.message ?? '', /grammar thread stopped/);
    assert.equal((await free).tokenIds.length, 40);
    const after = await within(generate(engine, request('after', { constraint: { kind: 'regex', pattern: '[a-z]{1,4}!' } }, 73)), 'a grammar after the loss');
    assert.equal(after.finishReason, 'stop', after.error);
    assert.match(after.text, /^[a-z]{1,4}!$/);
  } finally {
    await engine.close();
  }
});
