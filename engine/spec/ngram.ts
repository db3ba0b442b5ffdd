// Prompt-lookup decoding (vLLM's `ngram` method): the sequence's last n tokens, n from
// promptLookupMax down to promptLookupMin, are looked up earlier in its own prompt and output;
// the tokens that followed the latest match are the proposal. Text that quotes its input
// (summaries, code edits, multi-turn chat) or repeats itself continues the way it went before.
// Past the sequence's end, the proposal repeats itself with the match's period.
import type { Proposer, ProposerInput } from './proposer.ts';

export class NgramProposer implements Proposer {
  constructor(
    private readonly minLength: number,
    private readonly maxLength: number,
  ) {}

  propose(sequence: ProposerInput, maxNumTokens: number, out: number[]): void {
    out.length = 0;
    const tokens = sequence.tokenIds;
    const numTokens = tokens.length;
    for (let length = Math.min(this.maxLength, numTokens - 1); length >= this.minLength; length--) {
      const suffixStart = numTokens - length;
      // Latest first: a sequence that repeats itself repeats its latest turn most faithfully.
      for (let start = suffixStart - 1; start >= 0; start--) {
        if (!matchesAt(tokens, start, suffixStart, length)) continue;
        // The sequence repeats what it wrote suffixStart - start tokens back; where that reaches
        // its end, the repetition goes on with the proposal's own tokens (a loop shorter than k
        // proposes k tokens, not one turn of it).
        const first = start + length;
        for (let i = 0; i < maxNumTokens; i++) out.push(first + i < numTokens ? tokens[first + i] : out[first + i - numTokens]);
        return;
      }
    }
  }
}

function matchesAt(tokens: readonly number[], start: number, suffixStart: number, length: number): boolean {
  for (let i = 0; i < length; i++) if (tokens[start + i] !== tokens[suffixStart + i]) return false;
  return true;
}
