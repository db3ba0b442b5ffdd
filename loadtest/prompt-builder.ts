// Builds prompt text of a requested token length. With the server's tokenizer the length is
// exact: take a window of a tokenized corpus, detokenize it, and correct the window until the
// text re-tokenizes to the target. Without one, a word stands in for a token (common short
// English words are one token in the usual BPE vocabularies).

import { type Rng, randomInt } from './random.ts';
import type { ServerTokenizer } from './server-tokenizer.ts';

const WORDS = (
  'the of and to in is was for on that with as by at from his her it an be this which or are ' +
  'had not but were they their have one all been has when who will more no if out so said what ' +
  'up its about into than them can only other new some could time these two may then do first ' +
  'any my now such like our over man me even most made after also did many before must through ' +
  'back years where much your way well down should because each just those people how too little ' +
  'state good very make world still own see men work long get here between both life being under ' +
  'never day same another know while last might us great old year off come since against go came ' +
  'right used take three small large house water room city river story night light stone green'
).split(' ');

const CORPUS_WORDS = 4096;
const MAX_CORRECTIONS = 6;

export interface PromptBuilder {
  /** True when lengths are measured by the server's tokenizer rather than estimated. */
  readonly exact: boolean;
  build(numTokens: number, rng: Rng): Promise<string>;
}

function randomWords(rng: Rng, numWords: number): string {
  const words = new Array<string>(numWords);
  for (let i = 0; i < numWords; i++) words[i] = WORDS[randomInt(rng, 0, WORDS.length - 1)];
  return words.join(' ');
}

export class WordPromptBuilder implements PromptBuilder {
  readonly exact = false;

  async build(numTokens: number, rng: Rng): Promise<string> {
    return randomWords(rng, numTokens);
  }
}

export class TokenizedPromptBuilder implements PromptBuilder {
  readonly exact = true;

  private constructor(
    private readonly tokenizer: ServerTokenizer,
    private readonly corpusIds: readonly number[],
  ) {}

  static async create(tokenizer: ServerTokenizer, rng: Rng): Promise<TokenizedPromptBuilder> {
    const corpusIds = await tokenizer.tokenize(randomWords(rng, CORPUS_WORDS));
    if (corpusIds.length === 0) throw new Error('the server tokenized the prompt corpus to no tokens');
    return new TokenizedPromptBuilder(tokenizer, corpusIds);
  }

  async build(numTokens: number, rng: Rng): Promise<string> {
    const start = randomInt(rng, 0, this.corpusIds.length - 1);
    let windowLength = numTokens;
    let best = { text: '', error: Infinity };
    for (let attempt = 0; attempt < MAX_CORRECTIONS && best.error !== 0; attempt++) {
      const text = await this.tokenizer.detokenize(this.window(start, windowLength));
      const numActual = await this.tokenizer.countTokens(text);
      const error = Math.abs(numActual - numTokens);
      if (error < best.error) best = { text, error };
      // Token merges across the window's edges shift the count; move the window edge by the miss.
      windowLength = Math.max(1, windowLength + numTokens - numActual);
    }
    return best.text;
  }

  private window(start: number, length: number): number[] {
    const ids = new Array<number>(length);
    const corpusLength = this.corpusIds.length;
    for (let i = 0; i < length; i++) ids[i] = this.corpusIds[(start + i) % corpusLength];
    return ids;
  }
}
