// Prompt-lookup decoding (vLLM's `ngram` method): the sequence's last n tokens, n from
// promptLookupMax down to promptLookupMin, are looked up earlier in its own prompt and output;
// the tokens that followed the match are the proposal. Text that quotes its input (summaries,
// code edits, multi-turn chat) or repeats itself continues the way it went before. Past the
// sequence's end, the proposal repeats itself with the match's period.
//
// Where the suffix occurs several times, the latest few occurrences vote: each position of the
// proposal takes the token that most of them continue with (the latest's where they tie), an
// occurrence that continues otherwise stops voting, and the proposal ends where no token has a
// majority of the voters left. A model copying a passage it has quoted more than once follows
// what the quotes agree on; the latest alone is one sample of them, and where they part the
// guess is worth less than the row that verifies it. Replayed on bench:spec's own greedy outputs
// through the real chooser with a measured step-cost curve (conduit-tiny, one thread, CPU time),
// four voters against the latest alone: input-grounded 1.678 -> 1.702 x plain (adaptive) and
// 1.589 -> 1.661 x (k = 4), corpus 1.812 -> 1.832 and 1.774 -> 1.820, random prompts 2.054 ->
// 2.049 and 2.128 -> 2.152.
//
// Each guess is sorted into a confidence class by what stood behind it: the match's length, and
// whether one occurrence, all voters, a majority of them or a split gave it, the first guess apart
// from later ones. The classes' acceptance differs far more than sequences' does (input-grounded,
// first guesses: four voters agreeing on a three-token match 0.86, two of four 0.45, one of four
// 0.22; a one-token match 0.54, a three-token one 0.79), and the speculator measures each across
// all sequences, so that a guess is priced by evidence about guesses like it rather than by its
// sequence's last ten verifications.
import type { Proposer, ProposerInput } from './proposer.ts';

/** Latest occurrences of the matched suffix that vote on the proposal (1: the latest alone, as vLLM). */
export const NGRAM_VOTING_MATCHES = 4;

/** Match lengths told apart by the classes: 1, 2, and 3 or more. */
const NUM_MATCH_LENGTH_CLASSES = 3;
/** How the voters gave a guess: one occurrence alone, all of several, a majority, a split (first guess only). */
const NUM_VOTE_CLASSES = 4;
const CLASSES_PER_POSITION = NUM_MATCH_LENGTH_CLASSES * NUM_VOTE_CLASSES;

export class NgramProposer implements Proposer {
  /** First guesses' classes, then later guesses'. */
  readonly numConfidenceClasses = 2 * CLASSES_PER_POSITION;
  /** The voters' first continuation positions, latest first, and whether each still votes. */
  private readonly voterStarts: number[] = [];
  private readonly voting: Uint8Array;

  constructor(
    private readonly minLength: number,
    private readonly maxLength: number,
    private readonly numVotingMatches = NGRAM_VOTING_MATCHES,
  ) {
    this.voting = new Uint8Array(numVotingMatches);
  }

  propose(sequence: ProposerInput, maxNumTokens: number, out: number[], classes?: number[]): void {
    out.length = 0;
    if (classes !== undefined && classes.length !== 0) classes.length = 0;
    const tokens = sequence.tokenIds;
    const numTokens = tokens.length;
    const starts = this.voterStarts;
    starts.length = 0;
    let matchLength = 0;
    for (let length = Math.min(this.maxLength, numTokens - 1); length >= this.minLength && starts.length === 0; length--) {
      matchLength = length;
      const suffixStart = numTokens - length;
      // Latest first: a sequence that repeats itself repeats its latest turn most faithfully.
      for (let start = suffixStart - 1; start >= 0 && starts.length < this.numVotingMatches; start--) {
        if (matchesAt(tokens, start, suffixStart, length)) starts.push(start + length);
      }
    }
    if (starts.length === 0) return;
    const voting = this.voting;
    voting.fill(1, 0, starts.length);
    for (let i = 0; i < maxNumTokens; i++) {
      let chosen = -1;
      let chosenVotes = 0;
      let numVoting = 0;
      for (let a = 0; a < starts.length; a++) {
        if (voting[a] === 0) continue;
        numVoting++;
        const candidate = continuation(tokens, out, starts[a], i);
        let votes = 0;
        for (let b = a; b < starts.length; b++) if (voting[b] === 1 && continuation(tokens, out, starts[b], i) === candidate) votes++;
        if (votes > chosenVotes) {
          chosen = candidate;
          chosenVotes = votes;
        }
      }
      // Voters split with no majority: past here the proposal is one guess among several, and
      // verifying it costs its row whatever it is (the first token is always proposed, so that
      // acceptance keeps being measured).
      if (i > 0 && 2 * chosenVotes <= numVoting) return;
      out.push(chosen);
      if (classes !== undefined) {
        const votes = numVoting === 1 ? 0 : chosenVotes === numVoting ? 1 : 2 * chosenVotes > numVoting ? 2 : 3;
        classes.push((i === 0 ? 0 : CLASSES_PER_POSITION) + (Math.min(matchLength, NUM_MATCH_LENGTH_CLASSES) - 1) * NUM_VOTE_CLASSES + votes);
      }
      for (let a = 0; a < starts.length; a++) if (voting[a] === 1 && continuation(tokens, out, starts[a], i) !== chosen) voting[a] = 0;
    }
  }
}

/**
 * The i-th token after an occurrence whose continuation starts at first: the sequence goes on as
 * it did first - numTokens tokens back; where that reaches its end, the repetition goes on with
 * the proposal's own tokens (a loop shorter than k proposes k tokens, not one turn of it).
 */
function continuation(tokens: readonly number[], out: readonly number[], first: number, i: number): number {
  return first + i < tokens.length ? tokens[first + i] : out[first + i - tokens.length];
}

function matchesAt(tokens: readonly number[], start: number, suffixStart: number, length: number): boolean {
  for (let i = 0; i < length; i++) if (tokens[start + i] !== tokens[suffixStart + i]) return false;
  return true;
}
