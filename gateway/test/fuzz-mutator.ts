// The fuzz tests' mutations: seeded, so a failing seed replays (CONDUIT_TEST_SEED=<seed>).
import { MODEL_NAME } from './harness.ts';

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** Tiny deterministic PRNG, so a failing seed replays. */
export function rng(seed: number): () => number {
  let state = seed >>> 0 || 1;
  return () => {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    return (state >>> 0) / 2 ** 32;
  };
}

const oddValues: Json[] = [
  null, true, false, 0, -1, -0.5, 1.5, 2 ** 31, 2 ** 53 + 1, 1e308, -1e308, 5e-324,
  'NaN', 'Infinity', '-Infinity', '1e309', '-0', '', ' ', '\u0000', '\ud800', 'x\udfffy', '🎉', 'null', 'true',
  'x'.repeat(5000), [], {}, [null], [1, 2, 3], ['a', 1, null], { a: 1 }, { model: MODEL_NAME },
  [{ role: 'user', content: 'hi' }], { type: 'text', text: 'hi' },
];
/** What one mutation may grow a value to, in characters of JSON: far past any body limit, far below V8's longest string. */
const MAX_GROWN_CHARS = 32 * 2 ** 20;

const oddKeys = ['model', 'n', 'stream', 'logprobs', 'prompt', 'messages', 'input', 'tokens', '__proto__', 'constructor', '', 'x'.repeat(300)];

export class Mutator {
  private readonly random: () => number;

  constructor(random: () => number) {
    this.random = random;
  }

  int(max: number): number {
    return Math.floor(this.random() * max);
  }

  pick<T>(items: readonly T[]): T {
    return items[this.int(items.length)];
  }

  /** A structural mutation at a random place in the tree; returns the new tree. */
  mutate(value: Json): Json {
    const isContainer = value !== null && typeof value === 'object';
    // Descend into a child most of the time, so mutations land at every depth.
    if (isContainer && this.random() < 0.7) {
      const keys = Array.isArray(value) ? value.map((_, index) => index) : Object.keys(value);
      if (keys.length > 0) {
        const key = this.pick<string | number>(keys);
        const copy: any = Array.isArray(value) ? [...value] : { ...value };
        copy[key] = this.mutate(copy[key]);
        return copy;
      }
    }
    switch (this.int(isContainer ? 7 : 4)) {
      case 0:
        return this.pick(oddValues);
      case 1:
        return this.nest(value);
      case 2:
        return typeof value === 'number' ? this.pick([-value, value * 1e9, value + 0.5, -1, 1e21]) : this.pick(oddValues);
      case 3:
        return typeof value === 'string' ? value.repeat(this.copiesWithin(1 + this.int(50), value.length)) + this.pick(['\ud800', '\u0000', '"', '\\']) : [value];
      case 4: {
        // Delete a child.
        const copy: any = Array.isArray(value) ? [...(value as Json[])] : { ...(value as object) };
        const keys = Object.keys(copy);
        if (keys.length === 0) return copy;
        if (Array.isArray(copy)) copy.splice(this.int(copy.length), 1);
        else delete copy[this.pick(keys)];
        return copy;
      }
      case 5: {
        // Add a child.
        if (Array.isArray(value)) return [...value, ...Array(1 + this.int(3)).fill(this.pick(oddValues))];
        return { ...(value as object), [this.pick(oddKeys)]: this.pick(oddValues) };
      }
      default:
        // Many copies of a child: long arrays.
        return Array.isArray(value) && value.length > 0 ? Array(this.copiesWithin(1 + this.int(3000), JSON.stringify(value[0]).length)).fill(value[0]) : this.pick(oddValues);
    }
  }

  /**
   * At most numCopies, and few enough that the copies' copyChars each stay under MAX_GROWN_CHARS: growth
   * compounds over a case's mutations (3,000 copies of 3,000 copies of a 5,000-character string),
   * and a body past V8's longest string cannot be serialized at all.
   */
  private copiesWithin(numCopies: number, copyChars: number): number {
    return Math.max(1, Math.min(numCopies, Math.floor(MAX_GROWN_CHARS / Math.max(1, copyChars))));
  }

  /** The value wrapped in arrays or objects, a few deep to as deep as JSON.stringify goes (deeper: damage). */
  private nest(value: Json): Json {
    const depth = this.pick([2, 30, 1000]);
    const inObjects = this.random() < 0.5;
    let nested = value;
    for (let level = 0; level < depth; level++) nested = inObjects ? { a: nested } : [nested];
    return nested;
  }

  /** Byte-level damage to the serialized body: truncation, random bytes, a JS-only literal, nesting far too deep. */
  damage(bytes: Buffer): Buffer {
    switch (this.int(5)) {
      case 0:
        return bytes.subarray(0, this.int(bytes.length));
      case 1: {
        const damaged = Buffer.from(bytes);
        for (let count = 1 + this.int(4); count > 0; count--) damaged[this.int(damaged.length)] = this.int(256);
        return damaged;
      }
      case 2: {
        const at = this.int(bytes.length);
        const noise = Buffer.from(Array.from({ length: 1 + this.int(16) }, () => this.int(256)));
        return Buffer.concat([bytes.subarray(0, at), noise, bytes.subarray(at)]);
      }
      case 3: {
        const text = bytes.toString('utf8');
        return Buffer.from(text.replace(/\d+(\.\d+)?/, this.pick(['NaN', 'Infinity', '-Infinity', '0x10', '1e999', '+1', '01'])));
      }
      default: {
        // A field's value becomes arrays or objects nested deeper than any recursive walk survives.
        const depth = this.pick([20_000, 100_000, 400_000]);
        const [open, close] = this.random() < 0.5 ? ['[', ']'] : ['{"a":', '}'];
        const text = bytes.toString('utf8');
        const colons = [...text.matchAll(/":/g)].map((match) => match.index + 2);
        if (colons.length === 0) return bytes;
        const at = this.pick(colons);
        return Buffer.from(`${text.slice(0, at)}${open.repeat(depth)}0${close.repeat(depth)},"pad":${text.slice(at)}`);
      }
    }
  }
}

export function serialize(value: Json): Buffer {
  return Buffer.from(JSON.stringify(value));
}
