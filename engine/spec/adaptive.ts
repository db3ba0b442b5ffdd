// How many proposals each sequence verifies this step. A proposal costs its step one more query
// token; it pays off with the probability that it and every proposal before it are accepted.
// With the step's time modelled as a line in its tokens (weights read once, then work per
// token: memory-bound at batch 1, compute-bound at large batches), a proposal is worth its
// token while it adds more expected output per millisecond than the step already yields. The
// line is fitted online to the decode steps' measured times, and each sequence's
// acceptance is an exponentially decaying ratio of accepted to verified proposals, so nothing
// is tuned to one machine.

/**
 * Each sequence's acceptance of its proposals: of the first proposal of a step, and of each later
 * one given that all before it were accepted. They differ: a sequence that copies a span goes on
 * copying it, so a proposal that follows accepted ones is likelier accepted than a first one.
 */
export interface AcceptanceStats {
  /** Decaying counts: first proposals accepted, and first proposals verified. */
  numAccepted: number;
  numVerified: number;
  /** Decaying counts: later proposals accepted, and later proposals verified (each that had all before it accepted). */
  numContinuedAccepted: number;
  numContinuedVerified: number;
  /** The confidence class of each of the sequence's current proposals, where its proposer sorts them (Proposer.numConfidenceClasses). */
  readonly proposalClasses: number[];
}

/** Weight of the past against one new verification. */
const ACCEPTANCE_DECAY = 0.9;
/** A new sequence's prior: one accepted of two verified, at either kind of position. */
export function newAcceptanceStats(): AcceptanceStats {
  return { numAccepted: 1, numVerified: 2, numContinuedAccepted: 1, numContinuedVerified: 2, proposalClasses: [] };
}

/** The chance that a step's first proposal is accepted. */
export function acceptanceRate(stats: AcceptanceStats): number {
  return stats.numAccepted / stats.numVerified;
}

/** The chance that a later proposal is accepted once all before it were. */
export function continuationRate(stats: AcceptanceStats): number {
  return stats.numContinuedAccepted / stats.numContinuedVerified;
}

/** Records one verification: numProposed tokens proposed, numAccepted of them accepted in order. */
export function recordVerification(stats: AcceptanceStats, numProposed: number, numAccepted: number): void {
  if (numProposed === 0) return;
  stats.numAccepted = stats.numAccepted * ACCEPTANCE_DECAY + (numAccepted > 0 ? 1 : 0);
  stats.numVerified = stats.numVerified * ACCEPTANCE_DECAY + 1;
  if (numAccepted === 0 || numProposed === 1) return;
  // Later positions verified: up to the first rejected one, or all of them.
  const numContinuedVerified = Math.min(numAccepted + 1, numProposed) - 1;
  stats.numContinuedAccepted = stats.numContinuedAccepted * ACCEPTANCE_DECAY + (numAccepted - 1);
  stats.numContinuedVerified = stats.numContinuedVerified * ACCEPTANCE_DECAY + numContinuedVerified;
}

/** Weight of the past against one new guess of a class: classes pool every sequence's guesses, so they keep more of it. */
const CLASS_ACCEPTANCE_DECAY = 0.99;

/**
 * Acceptance per confidence class of guesses, across all sequences: decaying counts of accepted
 * and verified guesses from the prior one of two. A guess is judged only where every guess before
 * it in its proposal was accepted (as a sequence's continuation rate), so a class's rate is the
 * chance that such a guess is accepted.
 */
export class ClassAcceptance {
  private readonly numAccepted: Float64Array;
  private readonly numVerified: Float64Array;

  constructor(readonly numClasses: number) {
    this.numAccepted = new Float64Array(numClasses).fill(1);
    this.numVerified = new Float64Array(numClasses).fill(2);
  }

  rate(classIndex: number): number {
    return this.numAccepted[classIndex] / this.numVerified[classIndex];
  }

  record(classIndex: number, accepted: boolean): void {
    this.numAccepted[classIndex] = this.numAccepted[classIndex] * CLASS_ACCEPTANCE_DECAY + (accepted ? 1 : 0);
    this.numVerified[classIndex] = this.numVerified[classIndex] * CLASS_ACCEPTANCE_DECAY + 1;
  }
}

/** A step's cost as the model predicts it: the time of the step as it stands, and of each token more. */
export interface StepCost {
  baseMs: number;
  perTokenMs: number;
}

/** Steps of up to this many tokens are also measured per token count (a batch-1 step's 1 + k). */
const MAX_MEASURED_TOKENS = 16;

/**
 * Step time against tokens per step: a least-squares line over recent decode steps (older ones
 * weigh less; prompt chunks, whose tokens cost differently, are not observed), read near the
 * step at hand as the predicted time of that step and the slope there. Made robust to a busy
 * machine two ways: a step far slower than the line predicts (the cores taken by another
 * process, a pause) is clipped before it is fitted, and the slope is shrunk toward the prior's
 * (ridge regression), so that a few tokens' spread over noisy steps cannot swing it.
 */
export class StepCostModel {
  /** Per token count up to MAX_MEASURED_TOKENS: decaying sums of the steps' times and weights. */
  private readonly measuredMs = new Float64Array(MAX_MEASURED_TOKENS + 1);
  private readonly measuredWeights = new Float64Array(MAX_MEASURED_TOKENS + 1);
  private sumWeights = 0;
  private sumTokens = 0;
  private sumMs = 0;
  private sumTokensSquared = 0;
  private sumTokensMs = 0;
  /** The prior: this many tokens more cost a step's time again. */
  private static readonly PRIOR_TOKENS_PER_STEP = 16;
  /** The prior slope's weight, as squared token deviations of observed steps (four steps two tokens off the mean). */
  private static readonly PRIOR_WEIGHT = 16;
  /** A step observed slower than this many times the line's prediction counts as that many. */
  private static readonly MAX_MS_OVER_PREDICTED = 1.5;
  /** Steps' weight before predictions are trusted enough to clip by. */
  private static readonly MIN_WEIGHT_TO_CLIP = 4;
  private static readonly DECAY = 0.98;
  /** A token count's steps' weight before their mean is trusted over the line. */
  private static readonly MIN_MEASURED_WEIGHT = 3;

  observe(numTokens: number, forwardMs: number): void {
    if (this.sumWeights >= StepCostModel.MIN_WEIGHT_TO_CLIP) forwardMs = Math.min(forwardMs, StepCostModel.MAX_MS_OVER_PREDICTED * this.costAt(numTokens).baseMs);
    const decay = StepCostModel.DECAY;
    // Every count's weight decays with each step, so that a count no longer chosen (its mean
    // perhaps taken on a busy stretch) stops being trusted and the line judges it again.
    for (let count = 1; count <= MAX_MEASURED_TOKENS; count++) {
      this.measuredMs[count] *= decay;
      this.measuredWeights[count] *= decay;
    }
    if (numTokens <= MAX_MEASURED_TOKENS) {
      this.measuredMs[numTokens] += forwardMs;
      this.measuredWeights[numTokens] += 1;
    }
    this.sumWeights = this.sumWeights * decay + 1;
    this.sumTokens = this.sumTokens * decay + numTokens;
    this.sumMs = this.sumMs * decay + forwardMs;
    this.sumTokensSquared = this.sumTokensSquared * decay + numTokens * numTokens;
    this.sumTokensMs = this.sumTokensMs * decay + numTokens * forwardMs;
  }

  /** The mean time of recent steps of numTokens tokens, in milliseconds; null where too few were seen. */
  measuredCost(numTokens: number): number | null {
    if (numTokens > MAX_MEASURED_TOKENS || this.measuredWeights[numTokens] < StepCostModel.MIN_MEASURED_WEIGHT) return null;
    return this.measuredMs[numTokens] / this.measuredWeights[numTokens];
  }

  /** The predicted cost of a step of numTokens tokens, in milliseconds (in prior units before any step). */
  costAt(numTokens: number): StepCost {
    const prior = StepCostModel.PRIOR_TOKENS_PER_STEP;
    if (this.sumWeights === 0) return { baseMs: 1, perTokenMs: 1 / (prior + numTokens) };
    const meanTokens = this.sumTokens / this.sumWeights;
    const meanMs = this.sumMs / this.sumWeights;
    // Sums of squared and crossed deviations from the means; steps all alike leave the prior's slope, scaled to them.
    const squaredDeviations = Math.max(0, this.sumTokensSquared - this.sumWeights * meanTokens * meanTokens);
    const crossedDeviations = this.sumTokensMs - this.sumWeights * meanTokens * meanMs;
    const priorPerTokenMs = meanMs / (prior + meanTokens);
    const weight = StepCostModel.PRIOR_WEIGHT;
    const perTokenMs = Math.max(0, (crossedDeviations + weight * priorPerTokenMs) / (squaredDeviations + weight));
    // A line through noise may cross zero: a step costs at least its tokens' share.
    const baseMs = Math.max(meanMs + perTokenMs * (numTokens - meanTokens), perTokenMs * numTokens, 1e-9);
    return { baseMs, perTokenMs };
  }
}

/** One decoding sequence's candidates: its acceptance rates and how many proposals it has. */
export interface DraftCandidate {
  /** Of its first proposal. */
  acceptanceRate: number;
  /** Of each later one, given those before were accepted; acceptanceRate's when absent. */
  continuationRate?: number;
  numAvailable: number;
  /**
   * reach[j]: the chance that proposals 0 .. j are all accepted (its proposals' classes' rates
   * multiplied), in place of the rates above; null where its proposals have no classes.
   */
  reach: Float64Array | null;
}

/** The chance that candidate's proposals 0 .. position are all accepted. */
function reachOf(candidate: DraftCandidate, position: number): number {
  const { acceptanceRate, continuationRate = acceptanceRate, reach } = candidate;
  return reach !== null ? reach[position] : acceptanceRate * continuationRate ** position;
}

/** What the model's errors may cost: a proposal must promise this much more than it costs. */
const MARGIN = 1.1;

/**
 * Whether a proposal sure to be accepted would pay in a step of numSeqs decodes: when not (the
 * step is compute-bound), no proposal is worth making, or even looking up.
 */
export function anyProposalPays(stepCost: StepCost, numSeqs: number): boolean {
  return stepCost.baseMs > MARGIN * stepCost.perTokenMs * numSeqs;
}

/**
 * Whether a sequence whose first proposal is accepted at acceptanceRate could have one chosen in
 * a step of numStepSeqs decodes: chooseDraftCounts' test for the step's first pick, which every
 * later pick only makes harder (each raises the tokens per millisecond the next must beat).
 */
export function firstProposalMayPay(acceptanceRate: number, stepCost: StepCost, numStepSeqs: number): boolean {
  return acceptanceRate * stepCost.baseMs > MARGIN * stepCost.perTokenMs * numStepSeqs;
}

/**
 * Fills numChosen[i] with the proposals candidate i verifies: greedily, the proposal with the
 * best chance of acceptance (first rate × continuation rate^position) next, while its expected tokens per unit of
 * cost beat the step's (with a margin), up to budget tokens; the step decodes numStepSeqs sequences.
 */
export function chooseDraftCounts(candidates: readonly DraftCandidate[], stepCost: StepCost, budget: number, numChosen: Int32Array, numStepSeqs = candidates.length): void {
  numChosen.fill(0, 0, candidates.length);
  // Every decode of the step yields its token, whether it speculates or not.
  let expectedTokens = numStepSeqs;
  let cost = stepCost.baseMs;
  const perTokenRatio = stepCost.perTokenMs;
  for (let remaining = budget; remaining > 0; remaining--) {
    let best = -1;
    let bestGain = 0;
    for (let i = 0; i < candidates.length; i++) {
      if (numChosen[i] >= candidates[i].numAvailable) continue;
      // The chance that this proposal and every one before it are accepted.
      const gain = reachOf(candidates[i], numChosen[i]);
      if (gain > bestGain) {
        best = i;
        bestGain = gain;
      }
    }
    // Worth it when (E + g) / (C + c) > E / C, i.e. g × C > c × E.
    if (best < 0 || bestGain * cost <= MARGIN * perTokenRatio * expectedTokens) return;
    numChosen[best]++;
    expectedTokens += bestGain;
    cost += perTokenRatio;
  }
}

/** What noise in a count's measured mean may cost: a shorter choice must promise this much more. */
const SHORTENING_MARGIN = 1.03;

/**
 * A lone sequence's choice of numChosen proposals in a step of baseTokens more, shortened to the
 * count whose expected tokens per millisecond of measured step time is best. The line prices
 * every proposal alike, but a step's time is not a line in its tokens: where a matmul tile holds
 * six rows, a seventh costs a second pass over every weight panel. Counts never measured are not
 * judged, so a choice is only ever shortened on evidence.
 */
export function shortenToMeasuredCosts(candidate: DraftCandidate, numChosen: number, baseTokens: number, costModel: StepCostModel): number {
  const chosenMs = costModel.measuredCost(baseTokens + numChosen);
  if (numChosen === 0 || chosenMs === null) return numChosen;
  let shorter = -1;
  let shorterTokensPerMs = 0;
  // Expected tokens of a count: the sampled one, then each proposal with the chance that it and every one before it are accepted.
  let expectedTokens = 1;
  for (let count = 0; count < numChosen; count++) {
    const ms = costModel.measuredCost(baseTokens + count);
    if (ms !== null && expectedTokens / ms > shorterTokensPerMs) {
      shorter = count;
      shorterTokensPerMs = expectedTokens / ms;
    }
    expectedTokens += reachOf(candidate, count);
  }
  return shorter >= 0 && shorterTokensPerMs > SHORTENING_MARGIN * (expectedTokens / chosenMs) ? shorter : numChosen;
}
