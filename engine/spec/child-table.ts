// A suffix tree's child links: (parent node, token id) -> child node, in an open-addressing hash
// table of typed arrays (linear probing, deletion by backward shift, so no tombstones). A Map
// keyed by parent * 2^24 + token held its keys as heap numbers once parents passed 128: every
// insert allocated, and a proposer that indexes ~100 suffix nodes a step spent as much time in
// the garbage collector as in the tree.

const EMPTY = -1;
/** Kept at most half full, so that probe runs stay short. */
const MAX_LOAD = 0.5;

export class ChildTable {
  private parents: Int32Array;
  private tokens: Int32Array;
  private children: Int32Array;
  private mask: number;
  private numEntries = 0;

  constructor(initialCapacity = 64) {
    let capacity = 16;
    while (capacity < initialCapacity) capacity *= 2;
    this.parents = new Int32Array(capacity).fill(EMPTY);
    this.tokens = new Int32Array(capacity);
    this.children = new Int32Array(capacity);
    this.mask = capacity - 1;
  }

  get size(): number {
    return this.numEntries;
  }

  /** The child of parent along tokenId, or -1. */
  get(parent: number, tokenId: number): number {
    const { parents, tokens, mask } = this;
    for (let slot = slotOf(parent, tokenId, mask); ; slot = (slot + 1) & mask) {
      const slotParent = parents[slot];
      if (slotParent === EMPTY) return EMPTY;
      if (slotParent === parent && tokens[slot] === tokenId) return this.children[slot];
    }
  }

  /** Links a child that is not linked yet. */
  add(parent: number, tokenId: number, child: number): void {
    if (this.numEntries + 1 > MAX_LOAD * this.parents.length) this.grow();
    this.insert(parent, tokenId, child);
    this.numEntries++;
  }

  delete(parent: number, tokenId: number): void {
    const { parents, tokens, children, mask } = this;
    let slot = slotOf(parent, tokenId, mask);
    while (parents[slot] !== parent || tokens[slot] !== tokenId) {
      if (parents[slot] === EMPTY) return;
      slot = (slot + 1) & mask;
    }
    // Backward shift: each later entry of the run moves into the hole if its home slot does not
    // lie (cyclically) between the hole and it, so that every lookup's probe still reaches it.
    let hole = slot;
    for (let next = (hole + 1) & mask; parents[next] !== EMPTY; next = (next + 1) & mask) {
      const home = slotOf(parents[next], tokens[next], mask);
      if (((next - home) & mask) >= ((next - hole) & mask)) {
        parents[hole] = parents[next];
        tokens[hole] = tokens[next];
        children[hole] = children[next];
        hole = next;
      }
    }
    parents[hole] = EMPTY;
    this.numEntries--;
  }

  private insert(parent: number, tokenId: number, child: number): void {
    const { parents, mask } = this;
    let slot = slotOf(parent, tokenId, mask);
    while (parents[slot] !== EMPTY) slot = (slot + 1) & mask;
    parents[slot] = parent;
    this.tokens[slot] = tokenId;
    this.children[slot] = child;
  }

  private grow(): void {
    const { parents, tokens, children } = this;
    const capacity = 2 * parents.length;
    this.parents = new Int32Array(capacity).fill(EMPTY);
    this.tokens = new Int32Array(capacity);
    this.children = new Int32Array(capacity);
    this.mask = capacity - 1;
    for (let slot = 0; slot < parents.length; slot++) if (parents[slot] !== EMPTY) this.insert(parents[slot], tokens[slot], children[slot]);
  }
}

function slotOf(parent: number, tokenId: number, mask: number): number {
  let hash = Math.imul(parent, 0x9e3779b1) ^ Math.imul(tokenId, 0x85ebca77);
  hash ^= hash >>> 15;
  hash = Math.imul(hash, 0x2c1b3c6d);
  hash ^= hash >>> 13;
  return hash & mask;
}
