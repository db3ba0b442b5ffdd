import { test } from 'node:test';
import assert from 'node:assert/strict';
import { testSeed } from '../../test/seed.ts';
import { createRng } from '../random.ts';
import { parseLengthDistribution, drawLength, mirroredUniformLengths } from '../length-distribution.ts';
import { generateWorkload } from '../scenarios.ts';
import { WorkloadError, formatWorkload, groupSessions, hasTimestamps, parseWorkload } from '../workload.ts';

test('every scenario round-trips through its JSONL file', () => {
  const scenarios = [
    { name: 'fixed', inputTokens: 32, outputTokens: 16 },
    { name: 'shared-prefix', numGroups: 3, systemPromptTokens: 256, inputTokens: 32, outputTokens: 16 },
    { name: 'multi-turn', numTurns: 3, inputTokens: 32, outputTokens: 16 },
    { name: 'multi-turn', numTurns: 3, inputTokens: 32, outputTokens: 16, thinkTimeMs: 2500 },
    { name: 'multi-turn', numTurns: 3, inputTokens: 32, outputTokens: 16, contextTokens: 200 },
    { name: 'distribution', input: parseLengthDistribution('uniform:10:50'), output: parseLengthDistribution('normal:20:5') },
  ] as const;
  for (const scenario of scenarios) {
    const entries = generateWorkload(scenario, 12, createRng(7));
    assert.equal(entries.length, 12);
    assert.deepEqual(parseWorkload(formatWorkload(entries), 'x.jsonl'), entries, scenario.name);
  }
});

test('scenario shapes: shared prefixes per group, conversations of N turns', () => {
  const shared = generateWorkload({ name: 'shared-prefix', numGroups: 4, systemPromptTokens: 64, inputTokens: 8, outputTokens: 4 }, 16, createRng(1));
  assert.deepEqual(new Set(shared.map((entry) => entry.prefix!.id)).size, 4);
  const conversations = groupSessions(generateWorkload({ name: 'multi-turn', numTurns: 3, inputTokens: 8, outputTokens: 4 }, 7, createRng(1)));
  assert.deepEqual(conversations.map((session) => session.turns.length), [3, 3, 1]);
  const thinking = groupSessions(generateWorkload({ name: 'multi-turn', numTurns: 3, inputTokens: 8, outputTokens: 4, thinkTimeMs: 900 }, 6, createRng(1)));
  assert.deepEqual(thinking.map((session) => session.turns.map((turn) => turn.think_time_ms)), [[undefined, 900, 900], [undefined, 900, 900]]);
  assert.ok(thinking.every((session) => session.turns.every((turn) => turn.prefix === undefined)), 'no context unless asked for');
  const documented = groupSessions(generateWorkload({ name: 'multi-turn', numTurns: 2, inputTokens: 8, outputTokens: 4, contextTokens: 96 }, 4, createRng(1)));
  assert.deepEqual(
    documented.map((session) => session.turns.map((turn) => turn.prefix)),
    [[{ id: 'context-0', tokens: 96 }, { id: 'context-0', tokens: 96 }], [{ id: 'context-1', tokens: 96 }, { id: 'context-1', tokens: 96 }]],
  );
});

test('length distributions stay positive and near their parameters', () => {
  const rng = createRng(3);
  const uniform = parseLengthDistribution('uniform:5:9');
  const normal = parseLengthDistribution('lognormal:100:30');
  let sum = 0;
  for (let i = 0; i < 2000; i++) {
    const draw = drawLength(rng, uniform);
    assert.ok(draw >= 5 && draw <= 9);
    sum += drawLength(rng, normal);
  }
  assert.ok(Math.abs(sum / 2000 - 100) < 5, `lognormal mean ${sum / 2000}`);
  assert.throws(() => parseLengthDistribution('normal:abc'), /expected fixed:N/);
});

test('mirrored uniform lengths: in range, mean exact for an even count, spread, replayed from the seed', (t) => {
  const seed = testSeed(t);
  const lengths = mirroredUniformLengths(createRng(seed), 64, 128, 32);
  assert.equal(lengths.length, 64);
  for (const length of lengths) assert.ok(Number.isInteger(length) && length >= 96 && length <= 160, `seed ${seed}: ${length} outside 96..160`);
  assert.equal(lengths.reduce((a, b) => a + b, 0), 64 * 128, `seed ${seed}: the mean is not 128`);
  assert.ok(new Set(lengths).size > 8, `seed ${seed}: ${new Set(lengths).size} distinct lengths in 64 draws`);
  assert.deepEqual(mirroredUniformLengths(createRng(seed), 64, 128, 32), lengths);
  assert.equal(mirroredUniformLengths(createRng(seed), 5, 128, 32).length, 5);
  assert.deepEqual(mirroredUniformLengths(createRng(seed), 4, 10, 0), [10, 10, 10, 10]);
  assert.throws(() => mirroredUniformLengths(createRng(seed), 4, 10, 10), /mean - halfWidth >= 1/);
});

test('malformed workload lines are rejected with file, line and field', () => {
  const bad: [string, RegExp][] = [
    ['{"output_tokens": 4, "input_tokens": 8}\n{oops', /w\.jsonl:2: not valid JSON/],
    ['{"input_tokens": 8}', /w\.jsonl:1: expected a positive integer for output_tokens but received undefined/],
    ['{"output_tokens": 4}', /w\.jsonl:1: expected exactly one of input_tokens and text/],
    ['{"output_tokens": 4, "text": "hi", "colour": 1}', /w\.jsonl:1: unknown field "colour"/],
    ['{"output_tokens": 4, "input_tokens": -2}', /w\.jsonl:1: expected a positive integer for input_tokens but received -2 of type number/],
    ['[1, 2]', /w\.jsonl:1: expected a JSON object/],
    ['{"output_tokens": 4, "text": "a", "think_time_ms": -1}', /w\.jsonl:1: expected a number >= 0 for think_time_ms but received -1 of type number/],
    ['{"output_tokens": 4, "text": "a", "prefix": {"id": "p", "tokens": 8}}\n{"output_tokens": 4, "text": "b", "prefix": {"id": "p", "tokens": 9}}', /w\.jsonl:2: prefix "p" has 9 tokens here but 8 earlier/],
    ['\n\n', /w\.jsonl: no requests/],
  ];
  for (const [text, message] of bad) assert.throws(() => parseWorkload(text, 'w.jsonl'), (err: unknown) => err instanceof WorkloadError && message.test((err as Error).message));
});

test('timestamps mark a trace only when every line has one', () => {
  assert.equal(hasTimestamps(parseWorkload('{"output_tokens":1,"text":"a","timestamp_ms":0}\n{"output_tokens":1,"text":"b","timestamp_ms":5}', 't')), true);
  assert.equal(hasTimestamps(parseWorkload('{"output_tokens":1,"text":"a","timestamp_ms":0}\n{"output_tokens":1,"text":"b"}', 't')), false);
});
