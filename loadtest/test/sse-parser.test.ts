import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SseParser } from '../sse-parser.ts';

function parseAll(pieces: string[]): [string, string][] {
  const events: [string, string][] = [];
  const parser = new SseParser((name, data) => events.push([name, data]));
  for (const piece of pieces) parser.push(piece);
  return events;
}

const STREAM = 'data: {"a":1}\n\n: keep-alive comment\n\nevent: error\ndata: {"error":"x"}\n\ndata: line one\ndata: line two\n\ndata:[DONE]\n\n';
const EXPECTED: [string, string][] = [
  ['message', '{"a":1}'],
  ['error', '{"error":"x"}'],
  ['message', 'line one\nline two'],
  ['message', '[DONE]'],
];

test('parses events, comments, named events and multi-line data', () => {
  assert.deepEqual(parseAll([STREAM]), EXPECTED);
});

test('gives the same events whatever the split points and with CRLF line ends', () => {
  for (let split = 1; split < STREAM.length; split++) {
    assert.deepEqual(parseAll([STREAM.slice(0, split), STREAM.slice(split)]), EXPECTED, `split at ${split}`);
  }
  assert.deepEqual(parseAll(STREAM.replace(/\n/g, '\r\n').split('')), EXPECTED);
});

test('an event without its closing blank line is not dispatched', () => {
  assert.deepEqual(parseAll(['data: partial\n']), []);
});
