// The scheduler's side of speculative decoding: per step, which decoding sequences verify how
// many proposals (adaptive.ts), and what came of it (acceptance per sequence, vLLM's spec_decode
// counters). Proposals ride in the step as extra query tokens of the sequence's decode chunk.
import { anyProposalPays, ClassAcceptance, chooseDraftCounts, firstProposalMayPay, shortenToMeasuredCosts, StepCostModel, acceptanceRate, continuationRate, newAcceptanceStats, recordVerification, type AcceptanceStats, type DraftCandidate } from './adaptive.ts';
import type { SpecDecodeCounters } from '../types.ts';
import { createProposer, MAX_SPECULATIVE_TOKENS, speculativeConfigErrors, type Proposer, type ProposerInput, type SpeculativeConfig } from './proposer.ts';

/** A decoding sequence as the speculator sees it. */
export interface SpeculatingSequence extends ProposerInput {
  /** Most proposals it may verify this step (its request's limit, max_tokens, min_tokens, the context). */
  readonly maxDraftTokens: number;
  /** This step's proposals; what it verifies is the first numChosen of them. */
  readonly proposal: number[];
  /** Null: it never speculates. */
  readonly acceptance: AcceptanceStats | null;
}

/** A sequence a proposer may work ahead for: its limit, which adaptivity may lower, and its acceptance. */
export interface PreparingSequence extends ProposerInput {
  maxDraftTokens: number;
  readonly acceptance: AcceptanceStats | null;
}

/** A sequence whose proposal could not be chosen is still looked up one step in this many. */
const UNPROMISING_LOOKUP_ROTATION = 4;

/**
 * Whether a sequence whose proposal could not be chosen is looked up (or guessed for, by a draft)
 * this step: by its length, which prepare and choose see alike within a step, and which such a
 * sequence (verifying nothing) grows by one a step.
 */
function isTurnOf(sequence: ProposerInput): boolean {
  return sequence.tokenIds.length % UNPROMISING_LOOKUP_ROTATION === 0;
}

export class Speculator {
  readonly config: SpeculativeConfig;
  private readonly proposer: Proposer;
  private readonly costModel = new StepCostModel();
  private readonly candidates: DraftCandidate[] = [];
  /** Each candidate's reach, where its proposals have classes (reused step to step). */
  private readonly reaches: Float64Array[] = [];
  /** Where the proposer sorts its guesses into confidence classes: their acceptance, which prices them. */
  private readonly classAcceptance: ClassAcceptance | null;
  private numChosen = new Int32Array(0);
  private counters: SpecDecodeCounters;

  constructor(config: SpeculativeConfig, proposer?: Proposer) {
    const errors = speculativeConfigErrors(config);
    if (errors.length > 0) throw new Error(`speculative_config: ${errors.join('; ')}`);
    this.config = config;
    proposer ??= createProposer(config);
    this.proposer = proposer;
    this.classAcceptance = proposer.numConfidenceClasses === undefined ? null : new ClassAcceptance(proposer.numConfidenceClasses);
    this.counters = emptyCounters(config.numSpeculativeTokens);
  }

  newAcceptanceStats(): AcceptanceStats {
    return newAcceptanceStats();
  }

  /**
   * Fills each sequence's proposal and returns, in numChosen[i], how many of them sequence i
   * verifies (0 included), within budget tokens; the step already holds baseTokens tokens.
   */
  choose(sequences: readonly SpeculatingSequence[], baseTokens: number, budget: number): Int32Array {
    if (this.numChosen.length < sequences.length) this.numChosen = new Int32Array(Math.max(sequences.length, 2 * this.numChosen.length));
    const adaptive = this.config.adaptive !== false;
    const stepCost = this.costModel.costAt(baseTokens);
    // Compute-bound: nothing is proposed, and the step costs no more than plain decoding's.
    if (adaptive && !anyProposalPays(stepCost, baseTokens)) {
      // (An empty array's truncation is still a runtime call.)
      for (const sequence of sequences) if (sequence.proposal.length !== 0) sequence.proposal.length = 0;
      this.numChosen.fill(0, 0, sequences.length);
      return this.numChosen;
    }
    const candidates = this.candidates;
    while (candidates.length < sequences.length) candidates.push({ acceptanceRate: 0, continuationRate: 0, numAvailable: 0, reach: null });
    // (prepare fills candidates too: the reaches keep their own count.)
    while (this.reaches.length < sequences.length) this.reaches.push(new Float64Array(MAX_SPECULATIVE_TOKENS));
    candidates.length = sequences.length;
    const classAcceptance = this.classAcceptance;
    const numStepSeqs = Math.max(baseTokens, sequences.length);
    for (let i = 0; i < sequences.length; i++) {
      const sequence = sequences[i];
      const candidate = candidates[i];
      const { acceptance } = sequence;
      const rate = acceptance === null ? 0 : acceptanceRate(acceptance);
      candidate.acceptanceRate = rate;
      candidate.continuationRate = acceptance === null ? 0 : continuationRate(acceptance);
      // A sequence whose first proposal could not be chosen this step is looked up only in its
      // turn, so that its acceptance keeps being measured (recordUnverifiedGuess) at a fraction
      // of the lookups: at 32 streams nearly every step is like this, and the lookups were most
      // of speculation's cost there.
      const skip = acceptance === null || (adaptive && !isTurnOf(sequence) && !firstProposalMayPay(rate, stepCost, numStepSeqs));
      candidate.reach = null;
      if (skip) {
        if (sequence.proposal.length !== 0) sequence.proposal.length = 0;
      } else if (classAcceptance === null) {
        this.proposer.propose(sequence, sequence.maxDraftTokens, sequence.proposal);
      } else {
        // Priced by its guesses' classes: each one's rate across all sequences, multiplied.
        const classes = acceptance.proposalClasses;
        this.proposer.propose(sequence, sequence.maxDraftTokens, sequence.proposal, classes);
        const reach = this.reaches[i];
        let chance = 1;
        for (let j = 0; j < classes.length; j++) reach[j] = chance *= classAcceptance.rate(classes[j]);
        if (classes.length === sequence.proposal.length) candidate.reach = reach;
      }
      candidate.numAvailable = acceptance === null ? 0 : sequence.proposal.length;
    }
    if (!adaptive) {
      let remaining = budget;
      candidates.forEach((candidate, i) => {
        this.numChosen[i] = Math.min(candidate.numAvailable, remaining);
        remaining -= this.numChosen[i];
      });
    } else {
      chooseDraftCounts(candidates, stepCost, budget, this.numChosen, numStepSeqs);
      if (candidates.length === 1) this.numChosen[0] = shortenToMeasuredCosts(candidates[0], this.numChosen[0], baseTokens, this.costModel);
    }
    return this.numChosen;
  }

  /**
   * Whether any proposal could be verified in a step of baseTokens decodes: false where the step
   * is compute-bound (adaptive), and then the step's choice is all zeros without looking at its
   * sequences (choose would return that too).
   */
  mayPropose(baseTokens: number): boolean {
    return this.config.adaptive === false || anyProposalPays(this.costModel.costAt(baseTokens), baseTokens);
  }

  /** Whether the proposer works ahead of the step (prepare, before the step is scheduled). */
  get prepares(): boolean {
    return this.proposer.prepare !== undefined;
  }

  /**
   * The proposer's work ahead of the step for the sequences that may speculate in it; none where
   * adaptivity knows no proposal would be verified (a compute-bound step). Adaptive, each
   * sequence's maxDraftTokens is first lowered to what the step's choice would verify (at least
   * one, so that acceptance keeps being measured), each guess costing its share of a draft pass;
   * a sequence whose first guess the step could not choose gets none except in its turn (as
   * choose looks it up): at 32 streams that is nearly every sequence, and a draft pass for all of
   * them every step cost more than plain decoding's step.
   */
  async prepare(candidates: readonly PreparingSequence[]): Promise<void> {
    if (this.proposer.prepare === undefined || candidates.length === 0) return;
    if (this.config.adaptive !== false) {
      const numDecodes = candidates.length;
      const stepCost = this.costModel.costAt(numDecodes);
      if (!anyProposalPays(stepCost, numDecodes)) return;
      const choices = this.candidates;
      choices.length = 0;
      let budget = 0;
      for (const { acceptance, maxDraftTokens } of candidates) {
        choices.push(
          acceptance === null
            ? { acceptanceRate: 0, continuationRate: 0, numAvailable: 0, reach: null }
            : { acceptanceRate: acceptanceRate(acceptance), continuationRate: continuationRate(acceptance), numAvailable: maxDraftTokens, reach: null },
        );
        budget += maxDraftTokens;
      }
      if (this.numChosen.length < candidates.length) this.numChosen = new Int32Array(Math.max(candidates.length, 2 * this.numChosen.length));
      // A guess costs its verification and its share of a draft pass.
      const guessCost = { baseMs: stepCost.baseMs, perTokenMs: stepCost.perTokenMs + (this.proposer.passMs ?? 0) / numDecodes };
      chooseDraftCounts(choices, guessCost, budget, this.numChosen, numDecodes);
      candidates.forEach((candidate, i) => {
        const promising = candidate.acceptance !== null && (isTurnOf(candidate) || firstProposalMayPay(choices[i].acceptanceRate, stepCost, numDecodes));
        candidate.maxDraftTokens = promising ? Math.min(candidate.maxDraftTokens, Math.max(1, this.numChosen[i])) : 0;
      });
    }
    await this.proposer.prepare(candidates);
  }

  /**
   * A verification's outcome: numProposed proposals, of which the first numAccepted were accepted;
   * when all were, nextGuessAccepted says whether the proposal after them (not verified) equals
   * the token sampled after them (null: there was none). Acceptance counts that guess as a
   * verified proposal, since the sampled token is what plain decoding emits there; the
   * spec_decode counters count only what was verified.
   */
  recordVerification(acceptance: AcceptanceStats, numProposed: number, numAccepted: number, nextGuessAccepted: boolean | null = null): void {
    if (nextGuessAccepted === null) recordVerification(acceptance, numProposed, numAccepted);
    else recordVerification(acceptance, numProposed + 1, numAccepted + (nextGuessAccepted ? 1 : 0));
    const classes = acceptance.proposalClasses;
    const classAcceptance = this.classAcceptance;
    if (classAcceptance !== null && classes.length !== 0) {
      // Each guess judged: the accepted ones, then the first rejected one or the unverified next guess.
      for (let j = 0; j < numAccepted; j++) classAcceptance.record(classes[j], true);
      if (numAccepted < numProposed) classAcceptance.record(classes[numAccepted], false);
      else if (nextGuessAccepted !== null && numProposed < classes.length) classAcceptance.record(classes[numProposed], nextGuessAccepted);
    }
    const counters = this.counters;
    counters.numDrafts++;
    counters.numDraftTokens += numProposed;
    counters.numAcceptedTokens += numAccepted;
    for (let position = 0; position < numAccepted; position++) counters.numAcceptedTokensPerPosition[position]++;
  }

  /**
   * A proposal that was not verified (adaptivity chose 0), checked against the token plain
   * decoding emitted: acceptance keeps being measured, so a sequence that starts to repeat
   * itself is noticed without paying for it.
   */
  recordUnverifiedGuess(acceptance: AcceptanceStats, guessTokenId: number, emittedTokenId: number): void {
    recordVerification(acceptance, 1, guessTokenId === emittedTokenId ? 1 : 0);
    if (this.classAcceptance !== null && acceptance.proposalClasses.length !== 0) this.classAcceptance.record(acceptance.proposalClasses[0], guessTokenId === emittedTokenId);
  }

  /** A decode step's measured time, scheduling to outputs (its tokens are decodes and proposals only), for the cost model. */
  observeStep(numTokens: number, forwardMs: number): void {
    this.costModel.observe(numTokens, forwardMs);
  }

  /** The sequence left the scheduler: its proposer may learn from its output (suffix) and forgets it. */
  finish(sequence: ProposerInput): void {
    this.proposer.finish?.(sequence);
  }

  /** The counters since the last call; null when no proposal was verified since (nothing to count, nothing allocated). */
  takeCounters(): SpecDecodeCounters | null {
    const counters = this.counters;
    if (counters.numDrafts === 0) return null;
    this.counters = emptyCounters(this.config.numSpeculativeTokens);
    return counters;
  }
}

function emptyCounters(numPositions: number): SpecDecodeCounters {
  return { numDrafts: 0, numDraftTokens: 0, numAcceptedTokens: 0, numAcceptedTokensPerPosition: new Array<number>(numPositions).fill(0) };
}
