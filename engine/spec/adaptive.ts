// How many proposals each sequence verifies this step. A proposal costs its step one more query
// token; it pays off with the probability that it and every proposal before it are accepted.
// With the step's time modelled as fixedMs + perTokenMs × tokens (weights read once, then work
// per token: memory-bound at batch 1, compute-bound at large batches), a proposal is worth its
// token while it adds more expected output per millisecond than the step already yields. The
// model's two numbers are fitted online to the steps' measured times, and each sequence's
// acceptance is an exponentially decaying ratio of accepted to verified proposals, so nothing
// is tuned to one machine.

/** Each sequence's acceptance of its proposals, position by position. */
export interface AcceptanceStats {
  /** Decaying counts: proposals accepted, and proposals verified (each that had all before it accepted). */
  numAccepted: number;
  numVerified: number;
}

/** Weight of the past against one new verification. */
const ACCEPTANCE_DECAY = 0.9;
/** A new sequence's prior: one accepted of two verified. */
export function newAcceptanceStats(): AcceptanceStats {
  return { numAccepted: 1, numVerified: 2 };
}

export function acceptanceRate(stats: AcceptanceStats): number {
  return stats.numAccepted / stats.numVerified;
}

/** Records one verification: numProposed tokens proposed, numAccepted of them accepted in order. */
export function recordVerification(stats: AcceptanceStats, numProposed: number, numAccepted: number): void {
  if (numProposed === 0) return;
  const numVerified = Math.min(numAccepted + 1, numProposed);
  stats.numAccepted = stats.numAccepted * ACCEPTANCE_DECAY + numAccepted;
  stats.numVerified = stats.numVerified * ACCEPTANCE_DECAY + numVerified;
}

/** Step time against tokens per step: a least-squares line over recent steps (older ones weigh less). */
export class StepCostModel {
  private sumWeights = 0;
  private sumTokens = 0;
  private sumMs = 0;
  private sumTokensSquared = 0;
  private sumTokensMs = 0;
  /** Before the steps spread enough to fit a slope: a step of this many extra tokens costs twice a decode's. */
  private static readonly PRIOR_TOKENS_PER_FIXED = 16;
  private static readonly DECAY = 0.98;

  observe(numTokens: number, forwardMs: number): void {
    const decay = StepCostModel.DECAY;
    this.sumWeights = this.sumWeights * decay + 1;
    this.sumTokens = this.sumTokens * decay + numTokens;
    this.sumMs = this.sumMs * decay + forwardMs;
    this.sumTokensSquared = this.sumTokensSquared * decay + numTokens * numTokens;
    this.sumTokensMs = this.sumTokensMs * decay + numTokens * forwardMs;
  }

  /** perTokenMs / fixedMs: what one more token costs, in units of a step's fixed cost. */
  get perTokenRatio(): number {
    const prior = 1 / StepCostModel.PRIOR_TOKENS_PER_FIXED;
    if (this.sumWeights < 2) return prior;
    const meanTokens = this.sumTokens / this.sumWeights;
    const meanMs = this.sumMs / this.sumWeights;
    const variance = this.sumTokensSquared / this.sumWeights - meanTokens * meanTokens;
    // Steps all alike say nothing of the slope.
    if (variance < 0.5) return prior;
    const perTokenMs = Math.max(0, (this.sumTokensMs / this.sumWeights - meanTokens * meanMs) / variance);
    const fixedMs = meanMs - perTokenMs * meanTokens;
    // A fit whose fixed part vanishes (noise, or a compute-bound machine): every token costs alike.
    if (fixedMs <= perTokenMs) return 1;
    return perTokenMs / fixedMs;
  }
}

/** One decoding sequence's candidates: its acceptance rate and how many proposals it has. */
export interface DraftCandidate {
  acceptanceRate: number;
  numAvailable: number;
}

/**
 * Fills numChosen[i] with the proposals candidate i verifies: greedily, the proposal with the
 * best chance of acceptance (acceptance^position) next, while its expected tokens per unit of
 * cost beat the step's (baseTokens decode and prefill tokens already in it), up to budget tokens.
 */
export function chooseDraftCounts(candidates: readonly DraftCandidate[], perTokenRatio: number, baseTokens: number, budget: number, numChosen: Int32Array): void {
  numChosen.fill(0, 0, candidates.length);
  let expectedTokens = candidates.length;
  let cost = 1 + perTokenRatio * baseTokens;
  for (let remaining = budget; remaining > 0; remaining--) {
    let best = -1;
    let bestGain = 0;
    for (let i = 0; i < candidates.length; i++) {
      const { acceptanceRate, numAvailable } = candidates[i];
      if (numChosen[i] >= numAvailable) continue;
      const gain = acceptanceRate ** (numChosen[i] + 1);
      if (gain > bestGain) {
        best = i;
        bestGain = gain;
      }
    }
    // Worth it when (E + g) / (C + c) > E / C, i.e. g × C > c × E.
    if (best < 0 || bestGain * cost <= perTokenRatio * expectedTokens) return;
    numChosen[best]++;
    expectedTokens += bestGain;
    cost += perTokenRatio;
  }
}
