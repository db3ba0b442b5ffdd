// The sliced copies against the one-shot ones they replace, on fresh random text each run: the
// same bytes and ids whatever falls on a slice boundary, with the loop given turns meanwhile.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { numbersOf, utf8Of } from './sliced-copy.ts';

/** utf8Of's slice, as the boundaries the tests aim at. */
const TEXT_SLICE_CHARS = 262_144;

/** ASCII, two- and three-byte characters, surrogate pairs and lone surrogates of both halves. */
const PIECES = ['a', ' ', 'ü', 'ß', '東', '€', '🎉', '𝄞', '\ud800', '\udfff', '\u0000', '\uffff'];

function randomText(numPieces: number): string {
  const pieces: string[] = [];
  for (let i = 0; i < numPieces; i++) pieces.push(PIECES[Math.floor(Math.random() * PIECES.length)]);
  return pieces.join('');
}

const encoder = new TextEncoder();

test('utf8Of is TextEncoder.encode on random text of every kind of character', async () => {
  for (const numPieces of [0, 1, 1000, 3 * TEXT_SLICE_CHARS]) {
    const text = randomText(numPieces);
    assert.deepEqual(await utf8Of(text), encoder.encode(text));
  }
});

test('utf8Of keeps a surrogate pair whole where a slice would split it, and lone surrogates as U+FFFD', async () => {
  for (const end of [TEXT_SLICE_CHARS, 2 * TEXT_SLICE_CHARS]) {
    for (const tail of ['🎉', '\ud800x', 'x\udfff', '\ud800\ud800']) {
      // The tail's first code unit is the last of a slice (each piece is one or two units).
      const text = randomText(end - 1).slice(0, end - 1) + tail + randomText(10);
      assert.deepEqual(await utf8Of(text), encoder.encode(text), `tail ${JSON.stringify(tail)} at ${end - 1}`);
    }
  }
});

test('numbersOf is Array.from on random ids, whatever their count', async () => {
  for (const length of [0, 1, 65_535, 65_536, 65_537, 300_000]) {
    const tokenIds = new Uint32Array(length).map(() => Math.floor(Math.random() * 2 ** 32));
    assert.deepEqual(await numbersOf(tokenIds), Array.from(tokenIds));
  }
});

test('a long copy gives the event loop turns before it is done', async () => {
  let numTurns = 0;
  let isCounting = true;
  const countTurn = () => {
    numTurns++;
    if (isCounting) setImmediate(countTurn);
  };
  setImmediate(countTurn);
  const text = randomText(8 * TEXT_SLICE_CHARS);
  const turnsBefore = numTurns;
  await utf8Of(text);
  const textTurns = numTurns - turnsBefore;
  const idsBefore = numTurns;
  await numbersOf(new Uint32Array(16 * 65_536));
  const idsTurns = numTurns - idsBefore;
  isCounting = false;
  assert.ok(textTurns > 0, 'utf8Of held the loop from start to end');
  assert.ok(idsTurns > 0, 'numbersOf held the loop from start to end');
});
