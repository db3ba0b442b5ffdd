import assert from 'node:assert/strict';
import { test } from 'node:test';
import { IncrementalDetokenizer } from './incremental-detokenizer.ts';

/** A byte-level vocabulary: each token id stands for the bytes listed here. */
function byteLevelDecoder(bytesById: readonly number[][]) {
  const utf8 = new TextDecoder();
  return (tokenIds: readonly number[]) => utf8.decode(new Uint8Array(tokenIds.flatMap((id) => bytesById[id])));
}

const waveBytes = [...new TextEncoder().encode('👋')]; // f0 9f 91 8b

test('an emoji split across three tokens is held back until its last byte arrives', () => {
  const vocab = [[0x48, 0x69], [waveBytes[0]], [waveBytes[1], waveBytes[2]], [waveBytes[3]], [0x21]];
  const detokenizer = new IncrementalDetokenizer(byteLevelDecoder(vocab));
  assert.equal(detokenizer.push([0]), 'Hi');
  assert.equal(detokenizer.push([1]), '');
  assert.equal(detokenizer.push([2]), '');
  assert.equal(detokenizer.push([3]), '👋');
  assert.equal(detokenizer.push([4]), '!');
  assert.equal(detokenizer.flush(), '');
});

test('text before an incomplete character in the same step is sent at once', () => {
  const vocab = [[0x61, waveBytes[0], waveBytes[1]], [waveBytes[2], waveBytes[3], 0x62]];
  const detokenizer = new IncrementalDetokenizer(byteLevelDecoder(vocab));
  assert.equal(detokenizer.push([0]), 'a');
  assert.equal(detokenizer.push([1]), '👋b');
});

test('flush releases bytes that never completed a character', () => {
  const detokenizer = new IncrementalDetokenizer(byteLevelDecoder([[0x61], [waveBytes[0]]]));
  assert.equal(detokenizer.push([0, 1]), 'a');
  assert.equal(detokenizer.flush(), '\uFFFD');
});

test('an invalid byte followed by more text is passed on as U+FFFD, not held forever', () => {
  const detokenizer = new IncrementalDetokenizer(byteLevelDecoder([[0x80], [0x61]]));
  assert.equal(detokenizer.push([0]), '');
  assert.equal(detokenizer.push([1]), '\uFFFDa');
});

test('the decoded stream equals decoding all tokens at once, across many window slides', () => {
  const text = 'naïve café — 東京 👋🏽 done. '.repeat(6);
  const bytes = [...new TextEncoder().encode(text)];
  // One or two bytes per token, so multi-byte characters straddle tokens everywhere.
  const vocab: number[][] = [];
  for (let i = 0; i < bytes.length; i += 1 + (i % 2)) vocab.push(bytes.slice(i, i + 1 + (i % 2)));
  const detokenizer = new IncrementalDetokenizer(byteLevelDecoder(vocab));
  let streamed = '';
  for (let id = 0; id < vocab.length; id++) {
    const delta = detokenizer.push([id]);
    assert.ok(!delta.includes('\uFFFD'), `delta ${JSON.stringify(delta)} splits a character`);
    streamed += delta;
  }
  streamed += detokenizer.flush();
  assert.equal(streamed, text);
});
