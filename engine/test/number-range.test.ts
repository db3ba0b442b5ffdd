// Numeric bounds (minimum, maximum, exclusiveMinimum, exclusiveMaximum on numbers and integers):
// random walks through the grammar a bounded schema compiles to, over a vocabulary of the 256
// bytes, on fresh random bounds every run. Every text a walk ends with must be JSON that ajv
// finds valid against the original schema; the bounds themselves (inclusive) and the values just
// inside them (exclusive) must be reachable, and the values just outside must not.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import Ajv2020 from 'ajv/dist/2020.js';
import type { CompiledGrammar, GrammarCompiler } from '@mlc-ai/web-xgrammar';
import { prepareJsonSchema } from '../grammar/json-schema.ts';
import { replaceRangeMarkers } from '../grammar/number-range.ts';
import { byteLevelAlphabet } from '../grammar/vocabulary.ts';
import { loadXgrammar } from '../grammar/xgrammar.ts';
import { uniformSource } from '../../native/test/helpers.ts';
import { testSeed } from '../../test/seed.ts';

const xgrammar = loadXgrammar();
const STOP = 256;
const ajv = new Ajv2020.default({ strict: false });
let compiler: GrammarCompiler | null = null;

async function compile(schema: unknown): Promise<CompiledGrammar> {
  const prepared = prepareJsonSchema(JSON.stringify(schema));
  if ('code' in prepared) throw new Error(prepared.message);
  if (compiler === null) {
    const bytes = byteLevelAlphabet();
    const info = await xgrammar.TokenizerInfo.createTokenizerInfo([...bytes, ''], 'byte_level', false, 257, [STOP]);
    compiler = await xgrammar.GrammarCompiler.createGrammarCompiler(info, false);
  }
  const ebnf = replaceRangeMarkers(await xgrammar.Testings._jsonSchemaToEBNF(prepared.schema, false, -1, [', ', ': '], true));
  return compiler.compileGrammar(ebnf);
}

/** One random walk: a uniformly drawn allowed byte each step, the end (when allowed) a quarter of the time. */
async function walk(grammar: CompiledGrammar, random: () => number): Promise<string> {
  const matcher = await xgrammar.GrammarMatcher.createGrammarMatcher(grammar, [STOP]);
  const bytes: number[] = [];
  try {
    for (;;) {
      const bitmask = await matcher.getNextTokenBitmask();
      const allowed = [];
      for (let id = 0; id <= STOP; id++) if ((bitmask[id >> 5] >>> (id & 31)) & 1) allowed.push(id);
      assert.ok(allowed.length > 0, `dead end after ${JSON.stringify(Buffer.from(bytes).toString())}`);
      const canStop = allowed.includes(STOP);
      const id = canStop && (random() < 0.25 || bytes.length > 40 || allowed.length === 1) ? STOP : allowed.filter((b) => b !== STOP)[Math.floor(random() * (allowed.length - (canStop ? 1 : 0)))];
      assert.ok(matcher.acceptToken(id));
      if (id === STOP) return Buffer.from(bytes).toString();
      bytes.push(id);
    }
  } finally {
    matcher.dispose();
  }
}

async function accepts(grammar: CompiledGrammar, text: string): Promise<boolean> {
  const matcher = await xgrammar.GrammarMatcher.createGrammarMatcher(grammar, [STOP]);
  try {
    for (const byte of Buffer.from(text)) if (!matcher.acceptToken(byte)) return false;
    return matcher.acceptToken(STOP);
  } finally {
    matcher.dispose();
  }
}


/** A bound: an integer, or a decimal of 1-3 digits after the point, of magnitude up to 10^4. */
function randomBound(random: () => number, integer: boolean): number {
  const magnitude = 10 ** Math.floor(random() * 5);
  const value = (random() * 2 - 1) * magnitude;
  const digits = integer && random() < 0.7 ? 0 : 1 + Math.floor(random() * 3);
  return Number(value.toFixed(digits));
}

test('xgrammar\'s wrong ranges are right: 10.62 is not under maximum 10, exclusive integer bounds hold on both sides', async () => {
  const number = await compile({ type: 'number', minimum: 1.5, maximum: 10 });
  for (const text of ['1.5', '1.50', '2', '9.999999', '10', '10.0', '7.25']) assert.ok(await accepts(number, text), text);
  for (const text of ['10.62', '1.4', '1x5', '1', '10.000001', '-2', '01.5', '1.', '1e1']) assert.ok(!(await accepts(number, text)), text);
  const integer = await compile({ type: 'integer', exclusiveMinimum: -10, exclusiveMaximum: 10 });
  for (const text of ['-9', '0', '9']) assert.ok(await accepts(integer, text), text);
  for (const text of ['-10', '10', '100', '-0', '1.0', '-']) assert.ok(!(await accepts(integer, text)), text);
  const fractional = await compile({ type: 'integer', minimum: 1.5, maximum: 7.5 });
  for (const text of ['2', '7']) assert.ok(await accepts(fractional, text), text);
  for (const text of ['1', '8']) assert.ok(!(await accepts(fractional, text)), text);
});

test('random bounds: every walk ends in a value within them, and the values at them are reachable', async (t) => {
  const seed = testSeed(t);
  const random = uniformSource(seed);
  let numCases = 0;
  for (let attempt = 0; numCases < 24 && attempt < 200; attempt++) {
    const integer = random() < 0.5;
    const schema: Record<string, unknown> = { type: integer ? 'integer' : 'number' };
    const low = random() < 0.8 ? randomBound(random, integer) : undefined;
    const high = random() < 0.8 ? randomBound(random, integer) : undefined;
    // Unbounded is xgrammar's own number (exponents included), not this grammar.
    if (low === undefined && high === undefined) continue;
    if (low !== undefined) schema[random() < 0.5 ? 'minimum' : 'exclusiveMinimum'] = low;
    if (high !== undefined) schema[random() < 0.5 ? 'maximum' : 'exclusiveMaximum'] = high;
    const where = `seed ${seed}, schema ${JSON.stringify(schema)}`;
    const prepared = prepareJsonSchema(JSON.stringify(schema));
    const validate = ajv.compile(schema);
    const step = integer ? 1 : 1e-6;
    const candidates = [low, high, low === undefined ? undefined : low + step, high === undefined ? undefined : high - step]
      .filter((value): value is number => value !== undefined && (!integer || Number.isInteger(value)))
      .map((value) => Number(value.toFixed(integer ? 0 : 6)));
    if ('code' in prepared) {
      // Refused only where no value fits (or the bounds cannot be held exactly).
      assert.match(prepared.message, /no (integer|number) lies within the bounds|cannot be honoured/, where);
      assert.ok(!candidates.some((value) => validate(value)), `${where}: refused, yet ${candidates.filter((value) => validate(value))} fit`);
      continue;
    }
    numCases++;
    const grammar = await compile(schema);
    try {
      for (let i = 0; i < 25; i++) {
        const text = await walk(grammar, random);
        assert.match(text, /^-?(0|[1-9][0-9]*)(\.[0-9]+)?$/, `${where}: ${text}`);
        assert.ok(validate(JSON.parse(text)), `${where}: ${text} is outside the bounds`);
      }
      for (const value of candidates) {
        const text = value.toFixed(integer ? 0 : 6).replace(/^-0$/, '0');
        assert.equal(await accepts(grammar, text), validate(value), `${where}: ${text} ${validate(value) ? 'is within the bounds, yet forbidden' : 'is outside, yet allowed'}`);
      }
    } finally {
      grammar.dispose();
    }
  }
  assert.ok(numCases >= 24, `only ${numCases} satisfiable cases (seed ${seed})`);
});

test('a bounded number beside other types, and inside an object, keeps the other branches', async (t) => {
  const schema = {
    type: 'object',
    properties: { price: { type: ['number', 'null'], exclusiveMinimum: 0, maximum: 99.99 }, count: { type: 'integer', minimum: 1, maximum: 12 } },
    required: ['price', 'count'],
    additionalProperties: false,
  };
  const grammar = await compile(schema);
  const validate = ajv.compile(schema);
  for (const text of ['{"price": null, "count": 1}', '{"price": 99.99, "count": 12}', '{"price": 0.000001, "count": 5}']) {
    assert.ok(await accepts(grammar, text), text);
    assert.ok(validate(JSON.parse(text)), text);
  }
  for (const text of ['{"price": 0, "count": 1}', '{"price": 100, "count": 1}', '{"price": 5, "count": 13}', '{"price": 5, "count": 0}']) {
    assert.ok(!(await accepts(grammar, text)), text);
  }
  const random = uniformSource(testSeed(t));
  for (let i = 0; i < 20; i++) {
    const text = await walk(grammar, random);
    assert.ok(validate(JSON.parse(text)), text);
  }
});

test('bounds the grammar cannot hold exactly are refused by name and place', () => {
  const refusal = (schema: unknown) => {
    const prepared = prepareJsonSchema(JSON.stringify(schema));
    return 'code' in prepared ? prepared.message : null;
  };
  assert.match(refusal({ type: 'integer', minimum: 5, maximum: 4.5 })!, /no integer lies within the bounds \(at #\)/);
  assert.match(refusal({ properties: { a: { minimum: 1 } } })!, /supported with "type" number or integer \(at #\/properties\/a\)/);
  assert.match(refusal({ type: 'number', minimum: 1e-30 })!, /finer than/);
  assert.match(refusal({ type: 'number', exclusiveMaximum: 1e12 })!, /"exclusiveMaximum" beyond/);
  assert.match(refusal({ type: 'number', minimum: 1, enum: [1, 2] })!, /"enum"/);
  assert.equal(refusal({ type: 'number', maximum: 1e12 }), null);
});
