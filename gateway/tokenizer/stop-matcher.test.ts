import assert from 'node:assert/strict';
import { test } from 'node:test';
import { createRng } from '../../loadtest/random.ts';
import { StopMatcher } from './stop-matcher.ts';

test('a stop string split across deltas never leaks', () => {
  const matcher = new StopMatcher(['</end>']);
  assert.deepEqual(matcher.push('Hello </'), { text: 'Hello ', stop: null });
  assert.deepEqual(matcher.push('en'), { text: '', stop: null });
  assert.deepEqual(matcher.push('d> more'), { text: '', stop: '</end>' });
});

test('a held-back prefix that turns out not to be a stop is released', () => {
  const matcher = new StopMatcher(['STOP']);
  assert.deepEqual(matcher.push('ST'), { text: '', stop: null });
  assert.deepEqual(matcher.push('AR'), { text: 'STAR', stop: null });
  assert.deepEqual(matcher.push('S'), { text: '', stop: null });
  assert.equal(matcher.flush(), 'S');
});

test('the stop that completes first wins, however the text was split', () => {
  assert.deepEqual(new StopMatcher(['world', 'lo']).push('hello world'), { text: 'hel', stop: 'lo' });
  assert.deepEqual(new StopMatcher(['abcd', 'bc']).push('xabcd'), { text: 'xa', stop: 'bc' });
  const matcher = new StopMatcher(['abcd', 'bc']);
  assert.deepEqual(matcher.push('xab'), { text: 'x', stop: null });
  assert.deepEqual(matcher.push('cd'), { text: 'a', stop: 'bc' });
});

test('without stop strings text passes straight through', () => {
  const matcher = new StopMatcher([]);
  assert.deepEqual(matcher.push('abc'), { text: 'abc', stop: null });
  assert.equal(matcher.flush(), '');
});

test('a partial match is held back only as long as it can still grow into a stop', () => {
  const matcher = new StopMatcher(['abcd']);
  assert.deepEqual(matcher.push('xxabc'), { text: 'xx', stop: null });
  assert.deepEqual(matcher.push('abc'), { text: 'abc', stop: null });
  assert.deepEqual(matcher.push('d'), { text: '', stop: 'abcd' });
});

test('multi-byte stop strings match whole characters', () => {
  const matcher = new StopMatcher(['👋🏽']);
  assert.deepEqual(matcher.push('hi 👋'), { text: 'hi ', stop: null });
  assert.deepEqual(matcher.push('🏽 there'), { text: '', stop: '👋🏽' });
});

/** Where generation must stop: at the stop string that completes first in the whole text. */
function expectedOutput(text: string, stops: readonly string[]): string {
  let best: { index: number; end: number } | null = null;
  for (const stop of stops) {
    const index = text.indexOf(stop);
    if (index === -1) continue;
    const end = index + stop.length;
    if (best === null || end < best.end || (end === best.end && index < best.index)) best = { index, end };
  }
  return best === null ? text : text.slice(0, best.index);
}

test('property: for any split, the output is the text up to the first stop, and never more at any step', () => {
  const next = createRng(42);
  const alphabet = ['a', 'b', ' ', 'é', '👋', '東'];
  const pick = <T>(items: readonly T[]) => items[Math.floor(next() * items.length)];
  const randomText = (numChars: number) => Array.from({ length: numChars }, () => pick(alphabet)).join('');
  for (let trial = 0; trial < 500; trial++) {
    const text = randomText(1 + Math.floor(next() * 30));
    const stops = Array.from({ length: 1 + Math.floor(next() * 3) }, () => randomText(1 + Math.floor(next() * 3)));
    const expected = expectedOutput(text, stops);
    const chars = [...text];
    const matcher = new StopMatcher(stops);
    let output = '';
    let stopped = false;
    for (let i = 0; i < chars.length && !stopped; ) {
      const numChars = 1 + Math.floor(next() * 4);
      const match = matcher.push(chars.slice(i, i + numChars).join(''));
      i += numChars;
      output += match.text;
      stopped = match.stop !== null;
      assert.ok(expected.startsWith(output), `trial ${trial}: ${JSON.stringify(output)} leaks past ${JSON.stringify(expected)} (stops ${JSON.stringify(stops)})`);
    }
    if (!stopped) output += matcher.flush();
    assert.equal(output, expected, `trial ${trial}: text ${JSON.stringify(text)}, stops ${JSON.stringify(stops)}`);
  }
});
