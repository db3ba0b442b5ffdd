// SuffixDecoding (vLLM's `suffix` method, Snowflake's ArcticInference): two suffix trees of
// counted continuations (suffix-tree.ts), one over the sequence's own prompt and output, one over
// the outputs of the model's recent requests, and the proposal is the more likely of their
// continuations of the sequence's latest tokens, as long as it stays likely enough. Agent loops,
// which send the same tool calls and the same answers again and again, are its home ground; its
// proposal's length follows the evidence (longer matches, more frequent continuations) instead of
// being fixed.
import type { Proposer, ProposerInput } from './proposer.ts';
import { SPECULATION_CLASSES, SuffixTree, type Speculation } from './suffix-tree.ts';

export interface SuffixSettings {
  /** Longest suffix indexed, and so longest match plus proposal (vLLM: suffix_decoding_max_tree_depth). */
  maxTreeDepth: number;
  /** Recent requests' outputs kept (vLLM: suffix_decoding_max_cached_requests); oldest out first. */
  maxCachedRequests: number;
  /** And at most this many of their tokens, which bounds the shared tree at maxTreeDepth nodes each. */
  maxCachedTokens: number;
  /** Most tokens proposed per token matched (vLLM: suffix_decoding_max_spec_factor). */
  maxSpecFactor: number;
  /** A continuation stops where its estimated probability falls below this (vLLM: suffix_decoding_min_token_prob). */
  minTokenProb: number;
}

/** vLLM's defaults, and a bound on the shared tree's tokens of our own. */
export const SUFFIX_DEFAULTS: SuffixSettings = { maxTreeDepth: 24, maxCachedRequests: 10_000, maxCachedTokens: 1 << 17, maxSpecFactor: 1, minTokenProb: 0.1 };

/**
 * Finished outputs join the shared tree at most this many tokens per proposal asked for: an
 * 8,000-token output indexed at once held the engine loop ~10-20 ms (maxTreeDepth nodes a token).
 */
export const SHARED_TOKENS_PER_PROPOSAL = 64;

/** A sequence's own tree over its last LOCAL_WINDOW_TOKENS tokens: older ones are taken out as it grows. */
export const LOCAL_WINDOW_TOKENS = 4096;

interface LocalIndex {
  tree: SuffixTree;
  /** Tokens of the sequence indexed so far, and the first of them still in the tree. */
  numIndexed: number;
  windowStart: number;
}

export class SuffixProposer implements Proposer {
  private readonly shared: SuffixTree;
  /** The shared tree's texts, oldest first, as a queue from cachedStart on. */
  private readonly cached: number[][] = [];
  private cachedStart = 0;
  private numCachedTokens = 0;
  /** Finished outputs on their way into the shared tree, oldest first; the first numPendingIndexed tokens of the head are in. */
  private readonly pending: number[][] = [];
  private numPendingIndexed = 0;
  private numPendingTokens = 0;
  private readonly locals = new WeakMap<ProposerInput, LocalIndex>();
  private readonly own: Speculation = { tokenIds: [], score: 0, classes: [] };
  private readonly recent: Speculation = { tokenIds: [], score: 0, classes: [] };
  /**
   * A guess's confidence class: its evidence in its tree (suffix-tree.ts), which tree, first guess
   * or later; the speculator measures each class's acceptance across sequences and prices guesses by it.
   */
  readonly numConfidenceClasses = 2 * 2 * SPECULATION_CLASSES;

  constructor(private readonly settings: SuffixSettings = SUFFIX_DEFAULTS) {
    this.shared = new SuffixTree(settings.maxTreeDepth);
  }

  /** Nodes in the shared tree (the recent outputs'), for its memory bound. */
  get numSharedNodes(): number {
    return this.shared.numNodes;
  }

  get numCachedRequests(): number {
    return this.cached.length - this.cachedStart;
  }

  /** Nodes in the sequence's own tree (0 before its first proposal), for its memory bound. */
  numOwnNodes(sequence: ProposerInput): number {
    return this.locals.get(sequence)?.tree.numNodes ?? 0;
  }

  propose(sequence: ProposerInput, maxNumTokens: number, out: number[], classes?: number[]): void {
    out.length = 0;
    if (classes !== undefined && classes.length !== 0) classes.length = 0;
    if (maxNumTokens <= 0) return;
    const { maxSpecFactor, minTokenProb } = this.settings;
    const tokens = sequence.tokenIds;
    this.indexPending(SHARED_TOKENS_PER_PROPOSAL);
    this.indexOwn(sequence).speculateText(maxNumTokens, maxSpecFactor, minTokenProb, this.own);
    // An empty shared tree (the root alone) has nothing to say.
    if (this.shared.numNodes > 1) this.shared.speculate(tokens, maxNumTokens, maxSpecFactor, minTokenProb, this.recent);
    else this.recent.score = 0;
    const best = this.recent.score > this.own.score ? this.recent : this.own;
    for (const tokenId of best.tokenIds) out.push(tokenId);
    if (classes === undefined) return;
    const treeOffset = best === this.own ? 0 : SPECULATION_CLASSES;
    for (let i = 0; i < best.classes.length; i++) classes.push((i === 0 ? 0 : 2 * SPECULATION_CLASSES) + treeOffset + best.classes[i]);
  }

  /** Finished outputs waiting to join the shared tree, in tokens (for its memory bound). */
  get numPendingSharedTokens(): number {
    return this.numPendingTokens;
  }

  /**
   * A finished request's output is queued to join the shared tree, a slice per proposal asked
   * for (indexPending); the oldest queued outputs not yet started give way past maxCachedTokens.
   */
  finish(sequence: ProposerInput): void {
    this.locals.delete(sequence);
    const { maxCachedRequests, maxCachedTokens } = this.settings;
    const output = sequence.tokenIds.slice(sequence.numPromptTokens, sequence.numPromptTokens + maxCachedTokens);
    if (output.length === 0 || maxCachedRequests === 0) return;
    this.pending.push(output);
    this.numPendingTokens += output.length;
    while (this.numPendingTokens > maxCachedTokens && this.pending.length > 1) this.numPendingTokens -= this.pending.splice(1, 1)[0].length;
  }

  /** Appends up to maxNumTokens queued tokens to the shared tree; an output complete there joins the cache. */
  private indexPending(maxNumTokens: number): void {
    const { shared, pending } = this;
    for (let budget = maxNumTokens; budget > 0 && pending.length > 0; ) {
      const output = pending[0];
      // The shared tree indexes one text at a time, and appends come only from here; room is
      // made first, so that the tree never holds more than its bounds.
      if (this.numPendingIndexed === 0) {
        this.evictFor(output.length);
        shared.beginText();
      }
      const end = Math.min(output.length, this.numPendingIndexed + budget);
      for (let i = this.numPendingIndexed; i < end; i++) shared.append(output[i]);
      budget -= end - this.numPendingIndexed;
      this.numPendingIndexed = end;
      if (end < output.length) return;
      pending.shift();
      this.numPendingIndexed = 0;
      this.numPendingTokens -= output.length;
      this.cached.push(output);
      this.numCachedTokens += output.length;
    }
  }

  /** Takes the oldest outputs out of the shared tree until one more of numTokens tokens fits its bounds. */
  private evictFor(numTokens: number): void {
    const { maxCachedRequests, maxCachedTokens } = this.settings;
    while (this.numCachedRequests > 0 && (this.numCachedRequests + 1 > maxCachedRequests || this.numCachedTokens + numTokens > maxCachedTokens)) {
      const oldest = this.cached[this.cachedStart];
      this.shared.remove(oldest, 0, oldest.length);
      this.numCachedTokens -= oldest.length;
      this.cachedStart++;
    }
    // The queue's head is dropped in bulk, not shifted one at a time.
    if (this.cachedStart > 1024 && this.cachedStart * 2 > this.cached.length) {
      this.cached.splice(0, this.cachedStart);
      this.cachedStart = 0;
    }
  }

  /** The sequence's own tree, brought up to its latest token (its oldest tokens out past the window). */
  private indexOwn(sequence: ProposerInput): SuffixTree {
    let local = this.locals.get(sequence);
    if (local === undefined) {
      local = { tree: new SuffixTree(this.settings.maxTreeDepth), numIndexed: 0, windowStart: 0 };
      this.locals.set(sequence, local);
    }
    const tokens = sequence.tokenIds;
    const { tree } = local;
    for (let i = local.numIndexed; i < tokens.length; i++) tree.append(tokens[i]);
    local.numIndexed = tokens.length;
    // Suffixes starting this far back are complete (maxTreeDepth long): they can be taken out.
    const windowStart = tokens.length - LOCAL_WINDOW_TOKENS;
    if (windowStart > local.windowStart) {
      tree.remove(tokens, local.windowStart, windowStart);
      local.windowStart = windowStart;
    }
    return tree;
  }
}
