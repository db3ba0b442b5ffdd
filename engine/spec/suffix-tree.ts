// A suffix tree cut at a fixed depth, with counts: every suffix of the indexed text, up to
// maxDepth tokens long, is a path from the root, and each node counts the suffixes (start
// positions) whose path passes through it. A node's children, with their counts, are then the
// frequencies of what followed that node's path in the text (SuffixDecoding, Oliaro et al. 2024,
// arXiv 2411.04975). Cut at depth d the tree holds at most d nodes per indexed token, and a token
// appended extends the d paths still short of d by one node each.
//
// Nodes live in flat typed arrays (counts, token, parent and child links) reused through a free
// list, and child lookup goes through one hash table of typed arrays keyed by parent and token
// (child-table.ts): a tree is a handful of objects however many nodes it holds, and indexing a
// token allocates nothing.
import { ChildTable } from './child-table.ts';

/** Token ids below this. */
const TOKEN_SPACE = 2 ** 24;
const NONE = -1;

export interface Speculation {
  /** The proposal, most likely continuation first. */
  tokenIds: number[];
  /** Expected accepted tokens: the sum over the proposal of each prefix's estimated probability. */
  score: number;
  /** Each proposed token's evidence class, SPECULATION_CLASSES of them (evidenceClass). */
  classes: number[];
}

/** Evidence classes of a proposed token: its share of what followed, and how often that was seen. */
export const SPECULATION_CLASSES = 4;

/**
 * A token that always followed, seen three times or more (0), or less (1); one that followed at
 * least 3 times in 5 (2); less often (3). A probability alone does not tell one occurrence from
 * many, and the first is a guess where the second is a habit.
 */
function evidenceClass(childCount: number, parentCount: number): number {
  if (childCount === parentCount) return parentCount >= 3 ? 0 : 1;
  return 5 * childCount >= 3 * parentCount ? 2 : 3;
}

export class SuffixTree {
  private counts: Int32Array;
  private tokens: Int32Array;
  private parents: Int32Array;
  private firstChildren: Int32Array;
  private nextSiblings: Int32Array;
  private previousSiblings: Int32Array;
  /** The node of the path one token shorter at its start (a suffix of the path is indexed whenever the path is). */
  private suffixLinks: Int32Array;
  private readonly childByKey = new ChildTable();
  private readonly freeNodes: number[] = [];
  private numAllocated = 1;
  /** Nodes that end the paths of the latest suffixes still shorter than maxDepth, for append. */
  private readonly openPaths: Int32Array;
  private numOpenPaths = 0;
  /** speculate's scratch. */
  private readonly candidate: number[] = [];
  private readonly candidateClasses: number[] = [];

  constructor(readonly maxDepth: number) {
    const capacity = 64;
    this.counts = new Int32Array(capacity);
    this.tokens = new Int32Array(capacity);
    this.parents = new Int32Array(capacity).fill(NONE);
    this.firstChildren = new Int32Array(capacity).fill(NONE);
    this.nextSiblings = new Int32Array(capacity).fill(NONE);
    this.previousSiblings = new Int32Array(capacity).fill(NONE);
    this.suffixLinks = new Int32Array(capacity);
    this.openPaths = new Int32Array(maxDepth);
  }

  /** Nodes in use, the root included: memory is proportional to it. */
  get numNodes(): number {
    return this.numAllocated - this.freeNodes.length;
  }

  /** Starts indexing a new text: what is appended next begins new suffixes only. */
  beginText(): void {
    this.numOpenPaths = 0;
  }

  /** Appends a token to the text being indexed: every open suffix, and a new one, grows by it. */
  append(tokenId: number): void {
    // Open paths hold the suffixes shorter than maxDepth, oldest (longest) first: slot i's is
    // numOpenPaths - i tokens long. The new suffix starts at the root; the oldest, once it
    // reaches maxDepth, is complete and closes.
    const open = this.openPaths;
    const numOpen = this.numOpenPaths;
    open[numOpen] = 0;
    let numKept = 0;
    let longer = NONE;
    for (let i = 0; i <= numOpen; i++) {
      const child = this.childOrCreate(open[i], tokenId);
      this.counts[child]++;
      // Slot i + 1's path is slot i's without its first token: so are their children.
      if (longer !== NONE) this.suffixLinks[longer] = child;
      longer = child;
      if (numOpen - i + 1 < this.maxDepth) open[numKept++] = child;
    }
    this.suffixLinks[longer] = 0;
    this.numOpenPaths = numKept;
  }

  /** Indexes a whole text: its suffixes from each position, up to maxDepth tokens. */
  insert(tokenIds: readonly number[]): void {
    this.beginText();
    for (const tokenId of tokenIds) this.append(tokenId);
  }

  /**
   * Takes out the suffixes starting at positions [start, end) of a text indexed whole (insert),
   * each as far as the text went: nodes no suffix passes through any more are freed.
   */
  remove(tokenIds: readonly number[], start: number, end: number): void {
    for (let i = start; i < end; i++) {
      let node = 0;
      const pathEnd = Math.min(i + this.maxDepth, tokenIds.length);
      for (let j = i; j < pathEnd; j++) {
        const child = this.childByKey.get(node, tokenIds[j]);
        if (child === NONE) throw new Error('suffix tree: removing a suffix that was never indexed');
        node = child;
        // A node this suffix alone passed through has nothing below but this suffix's rest.
        if (--this.counts[node] === 0) {
          this.freeSubpath(node, tokenIds, j + 1, pathEnd);
          break;
        }
      }
    }
  }

  /**
   * The most likely continuation of context: for each length of the context's suffix found in
   * the tree, the path down from it that takes the most frequent child each time, while the
   * product of the children's shares (the continuation's estimated probability) stays at least
   * minTokenProb, at most maxSpecFactor tokens per token matched and maxNumTokens in all; the
   * one with the highest score (expected accepted tokens) wins, the longer match on a tie.
   */
  speculate(context: readonly number[], maxNumTokens: number, maxSpecFactor: number, minTokenProb: number, out: Speculation): void {
    const end = context.length;
    // The longest match, by bisection: a suffix not found has no longer one found either.
    let longest = 0;
    let notFound = Math.min(this.maxDepth, end) + 1;
    while (notFound - longest > 1) {
      const middle = (longest + notFound) >> 1;
      if (this.find(context, end - middle, end) === NONE) notFound = middle;
      else longest = middle;
    }
    this.speculateFrom(longest === 0 ? 0 : this.find(context, end - longest, end), longest, 0, maxNumTokens, maxSpecFactor, minTokenProb, out);
  }

  /**
   * speculate for the text being indexed (a sequence's own tree, brought up to its last token):
   * its open paths are its suffixes' nodes already, and its own latest occurrence, which has no
   * continuation yet, is not counted against the earlier ones.
   */
  speculateText(maxNumTokens: number, maxSpecFactor: number, minTokenProb: number, out: Speculation): void {
    const numOpen = this.numOpenPaths;
    this.speculateFrom(numOpen === 0 ? 0 : this.openPaths[0], numOpen, 1, maxNumTokens, maxSpecFactor, minTokenProb, out);
  }

  /** speculate from the node of the longest match, shorter matches along suffix links; selfCount: occurrences of the match not to count. */
  private speculateFrom(longestNode: number, longest: number, selfCount: number, maxNumTokens: number, maxSpecFactor: number, minTokenProb: number, out: Speculation): void {
    out.tokenIds.length = 0;
    out.classes.length = 0;
    out.score = 0;
    // Longest first: a score can only be beaten by a strictly higher one, and a proposal scores
    // at most its length, so shorter matches stop paying once their limit is at most the best.
    const candidate = this.candidate;
    const candidateClasses = this.candidateClasses;
    let node = longestNode;
    for (let matchLength = longest; matchLength >= 1; matchLength--, node = this.suffixLinks[node]) {
      const limit = Math.min(maxNumTokens, Math.floor(matchLength * maxSpecFactor));
      if (limit <= out.score) break;
      candidate.length = 0;
      candidateClasses.length = 0;
      let score = 0;
      let probability = 1;
      let at = node;
      let parentCount = this.counts[node] - selfCount;
      while (candidate.length < limit && parentCount > 0) {
        const child = this.mostFrequentChild(at);
        if (child === NONE) break;
        probability *= this.counts[child] / parentCount;
        if (probability < minTokenProb) break;
        candidate.push(this.tokens[child]);
        candidateClasses.push(evidenceClass(this.counts[child], parentCount));
        score += probability;
        at = child;
        parentCount = this.counts[child];
      }
      if (candidate.length > 0 && score > out.score) {
        out.score = score;
        out.tokenIds.length = 0;
        out.classes.length = 0;
        for (const tokenId of candidate) out.tokenIds.push(tokenId);
        for (const evidence of candidateClasses) out.classes.push(evidence);
      }
    }
  }

  /** The node of the path tokens[start, end) from the root, or NONE. */
  private find(tokenIds: readonly number[], start: number, end: number): number {
    let node = 0;
    for (let i = start; i < end && node !== NONE; i++) node = this.childByKey.get(node, tokenIds[i]);
    return node;
  }

  /** The child with the highest count, the lowest token id on a tie (so that the choice does not depend on insertion order). */
  private mostFrequentChild(node: number): number {
    let best = NONE;
    for (let child = this.firstChildren[node]; child !== NONE; child = this.nextSiblings[child]) {
      if (best === NONE || this.counts[child] > this.counts[best] || (this.counts[child] === this.counts[best] && this.tokens[child] < this.tokens[best])) best = child;
    }
    return best;
  }

  private childOrCreate(parent: number, tokenId: number): number {
    if (!(tokenId >= 0 && tokenId < TOKEN_SPACE)) throw new RangeError(`suffix tree: token id ${tokenId} out of range`);
    const existing = this.childByKey.get(parent, tokenId);
    if (existing !== NONE) return existing;
    const node = this.allocate();
    this.tokens[node] = tokenId;
    this.counts[node] = 0;
    this.parents[node] = parent;
    this.firstChildren[node] = NONE;
    const next = this.firstChildren[parent];
    this.nextSiblings[node] = next;
    this.previousSiblings[node] = NONE;
    if (next !== NONE) this.previousSiblings[next] = node;
    this.firstChildren[parent] = node;
    this.childByKey.add(parent, tokenId, node);
    return node;
  }

  /** Frees node and the single path below it along tokenIds[from, pathEnd) (all at count 1, now 0). */
  private freeSubpath(node: number, tokenIds: readonly number[], from: number, pathEnd: number): void {
    let below = node;
    for (let j = from; j < pathEnd; j++) {
      const child = this.childByKey.get(below, tokenIds[j]);
      if (child === NONE) break;
      this.unlink(below);
      this.freeNodes.push(below);
      below = child;
    }
    this.unlink(below);
    this.freeNodes.push(below);
  }

  private unlink(node: number): void {
    const parent = this.parents[node];
    const previous = this.previousSiblings[node];
    const next = this.nextSiblings[node];
    if (previous === NONE) this.firstChildren[parent] = next;
    else this.nextSiblings[previous] = next;
    if (next !== NONE) this.previousSiblings[next] = previous;
    this.childByKey.delete(parent, this.tokens[node]);
    this.parents[node] = NONE;
  }

  private allocate(): number {
    const reused = this.freeNodes.pop();
    if (reused !== undefined) return reused;
    if (this.numAllocated === this.counts.length) this.grow();
    return this.numAllocated++;
  }

  private grow(): void {
    const capacity = 2 * this.counts.length;
    const grown = (array: Int32Array, fill: number): Int32Array => {
      const next = new Int32Array(capacity).fill(fill, array.length);
      next.set(array);
      return next;
    };
    this.counts = grown(this.counts, 0);
    this.tokens = grown(this.tokens, 0);
    this.parents = grown(this.parents, NONE);
    this.firstChildren = grown(this.firstChildren, NONE);
    this.nextSiblings = grown(this.nextSiblings, NONE);
    this.previousSiblings = grown(this.previousSiblings, NONE);
    this.suffixLinks = grown(this.suffixLinks, 0);
  }
}
