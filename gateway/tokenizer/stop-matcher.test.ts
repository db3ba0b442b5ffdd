import assert from 'node:assert/strict';
import { test } from 'node:test';
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

test('the earliest of several stop strings wins', () => {
  const matcher = new StopMatcher(['world', 'lo']);
  assert.deepEqual(matcher.push('hello world'), { text: 'hel', stop: 'lo' });
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
