// Copies of a large prompt's text and token ids made a slice at a time, yielding to the event
// loop between slices: done whole, a 5 MB text's UTF-8 or its million token ids hold the loop
// for 10 to 50 ms each, and several such prompts at once stall every other request and stream.
import { setImmediate as nextTurn } from 'node:timers/promises';

/** About a millisecond of encoding each (2 to 6 ns per character, by the CPU). */
const TEXT_SLICE_CHARS = 262_144;
/** About a millisecond of copying each (15 to 40 ns per id). */
const IDS_SLICE_LENGTH = 65_536;
/** UTF-16 code units encode to at most 3 bytes each (a surrogate pair, 2 units, to 4). */
const MAX_UTF8_BYTES_PER_UNIT = 3;

const encoder = new TextEncoder();

/**
 * The text's UTF-8 in a buffer of its own, to transfer to a thread rather than copy the string
 * there (structured cloning a two-byte string costs about 7 ns per character on the loop). A lone
 * surrogate becomes U+FFFD, as it does on the way into any tokenizer.
 */
export async function utf8Of(text: string): Promise<Uint8Array> {
  const bytes = new Uint8Array(text.length * MAX_UTF8_BYTES_PER_UNIT);
  let numBytes = 0;
  for (let start = 0; start < text.length; ) {
    let end = Math.min(start + TEXT_SLICE_CHARS, text.length);
    // A slice must not split a surrogate pair: each half alone would encode as U+FFFD.
    if (end < text.length && isHighSurrogate(text.charCodeAt(end - 1))) end--;
    numBytes += encoder.encodeInto(text.slice(start, end), bytes.subarray(numBytes)).written;
    start = end;
    if (start < text.length) await nextTurn();
  }
  return bytes.subarray(0, numBytes);
}

/**
 * The ids as the plain array the engine takes. Allocating it stays one step (a fresh 10 MB for
 * a million ids, about 25 ms where page faults are slow, as in a VM): the engine takes no other.
 */
export async function numbersOf(tokenIds: Uint32Array): Promise<number[]> {
  const numbers = new Array<number>(tokenIds.length);
  for (let start = 0; start < tokenIds.length; ) {
    const end = Math.min(start + IDS_SLICE_LENGTH, tokenIds.length);
    // A plain loop: Array.from on a typed array is about six times slower.
    for (let index = start; index < end; index++) numbers[index] = tokenIds[index];
    start = end;
    if (start < tokenIds.length) await nextTurn();
  }
  return numbers;
}

function isHighSurrogate(codeUnit: number): boolean {
  return codeUnit >= 0xd800 && codeUnit <= 0xdbff;
}
