// The suffix proposer (SuffixDecoding): its depth-cut suffix tree against a slow count of
// occurrences over the texts it indexes, through insertions, appends and evictions (its node
// count exactly the distinct indexed paths: nothing leaks), and the proposer's choice between a
// sequence's own tokens and recent outputs, within its memory bounds.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SPECULATION_CLASSES, SuffixTree, type Speculation } from '../spec/suffix-tree.ts';
import { LOCAL_WINDOW_TOKENS, SHARED_TOKENS_PER_PROPOSAL, SUFFIX_DEFAULTS, SuffixProposer } from '../spec/suffix.ts';
import { seeded } from './spec-harness.ts';

/** Occurrences of pattern starting in texts, each counted where the pattern fits in maxDepth. */
function countOf(texts: number[][], pattern: number[], maxDepth: number): number {
  if (pattern.length > maxDepth) return 0;
  let count = 0;
  for (const text of texts) {
    for (let start = 0; start + pattern.length <= text.length; start++) {
      if (pattern.every((token, i) => text[start + i] === token)) count++;
    }
  }
  return count;
}

/** Distinct non-empty paths of at most maxDepth tokens in texts: the tree's nodes, root aside. */
function numDistinctPaths(texts: number[][], maxDepth: number): number {
  const paths = new Set<string>();
  for (const text of texts) {
    for (let start = 0; start < text.length; start++) {
      for (let end = start + 1; end <= Math.min(text.length, start + maxDepth); end++) paths.add(text.slice(start, end).join(','));
    }
  }
  return paths.size;
}

/** SuffixDecoding's greedy continuation, from counts of occurrences; selfIndexed: context is the last text, its own occurrence not counted. */
function referenceSpeculate(texts: number[][], maxDepth: number, context: number[], maxNumTokens: number, maxSpecFactor: number, minTokenProb: number, selfIndexed = false): Speculation {
  const alphabet = [...new Set(texts.flat())].sort((a, b) => a - b);
  const best: Speculation = { tokenIds: [], score: 0, classes: [] };
  for (let matchLength = 1; matchLength <= Math.min(maxDepth, context.length); matchLength++) {
    const path = context.slice(context.length - matchLength);
    if (countOf(texts, path, maxDepth) === 0) break;
    const limit = Math.min(maxNumTokens, Math.floor(matchLength * maxSpecFactor));
    const tokenIds: number[] = [];
    let score = 0;
    let probability = 1;
    while (tokenIds.length < limit) {
      const parentCount = countOf(texts, path, maxDepth) - (selfIndexed && tokenIds.length === 0 ? 1 : 0);
      if (parentCount === 0) break;
      let bestToken = -1;
      let bestCount = 0;
      for (const token of alphabet) {
        const count = countOf(texts, [...path, token], maxDepth);
        if (count > bestCount) [bestToken, bestCount] = [token, count];
      }
      if (bestToken < 0) break;
      probability *= bestCount / parentCount;
      if (probability < minTokenProb) break;
      tokenIds.push(bestToken);
      path.push(bestToken);
      score += probability;
    }
    if (tokenIds.length > 0 && score >= best.score) Object.assign(best, { tokenIds, score });
  }
  return best;
}

test('the suffix tree counts continuations as a slow count of occurrences does, through evictions', (t) => {
  const { seed, random } = seeded(t);
  const out: Speculation = { tokenIds: [], score: 0, classes: [] };
  for (let trial = 0; trial < 60; trial++) {
    const maxDepth = 1 + Math.floor(random() * 8);
    const alphabet = 2 + Math.floor(random() * 5);
    const tree = new SuffixTree(maxDepth);
    const texts: number[][] = [];
    for (let step = 0; step < 12; step++) {
      if (texts.length > 0 && random() < 0.3) {
        // Oldest out first, as the proposer evicts.
        const oldest = texts.shift()!;
        tree.remove(oldest, 0, oldest.length);
      } else {
        const text = Array.from({ length: Math.floor(random() * 30) }, () => Math.floor(random() * alphabet));
        // Indexed whole, or token by token as a sequence grows: the same tree.
        if (random() < 0.5) tree.insert(text);
        else {
          tree.beginText();
          for (const token of text) tree.append(token);
          // The text's own continuation, as a sequence's own tree proposes it.
          const maxNumTokens = 1 + Math.floor(random() * 8);
          tree.speculateText(maxNumTokens, 2, 0.1, out);
          const expected = referenceSpeculate([...texts, text], maxDepth, text, maxNumTokens, 2, 0.1, true);
          assert.deepEqual(out.tokenIds, expected.tokenIds, `seed ${seed}: own continuation of ${JSON.stringify({ maxDepth, texts, text, maxNumTokens })}`);
          assert.ok(Math.abs(out.score - expected.score) < 1e-9);
        }
        texts.push(text);
      }
      const context = `seed ${seed}, trial ${trial}, step ${step}: ${JSON.stringify({ maxDepth, texts })}`;
      assert.equal(tree.numNodes, 1 + numDistinctPaths(texts, maxDepth), `nodes are the distinct paths: ${context}`);
      const query = Array.from({ length: 1 + Math.floor(random() * 10) }, () => Math.floor(random() * alphabet));
      const maxNumTokens = 1 + Math.floor(random() * 8);
      const maxSpecFactor = [0.5, 1, 2, 4][Math.floor(random() * 4)];
      const minTokenProb = random() * 0.5;
      tree.speculate(query, maxNumTokens, maxSpecFactor, minTokenProb, out);
      const expected = referenceSpeculate(texts, maxDepth, query, maxNumTokens, maxSpecFactor, minTokenProb);
      assert.deepEqual(out.tokenIds, expected.tokenIds, `${context}, ${JSON.stringify({ query, maxNumTokens, maxSpecFactor, minTokenProb })}`);
      assert.ok(Math.abs(out.score - expected.score) < 1e-9, context);
      assert.ok(out.classes.length === out.tokenIds.length && out.classes.every((c) => Number.isInteger(c) && c >= 0 && c < SPECULATION_CLASSES), context);
    }
    while (texts.length > 0) {
      const oldest = texts.shift()!;
      tree.remove(oldest, 0, oldest.length);
    }
    assert.equal(tree.numNodes, 1, 'every node freed once every text is out');
  }
});

test('suffix sorts each guess by its evidence: always followed, how often seen, its share; which tree; first or later', () => {
  const tree = new SuffixTree(8);
  const out: Speculation = { tokenIds: [], score: 0, classes: [] };
  // 1 2 was followed by 3 three times of three (class 0); 1 2 3 by 6, 7 and 8 once each (a third: class 3).
  tree.insert([5, 1, 2, 3, 6, 1, 2, 3, 7, 1, 2, 3, 8]);
  tree.speculate([1, 2], 2, 1, 0.1, out);
  assert.deepEqual([out.tokenIds, out.classes], [[3, 6], [0, 3]]);
  // Seen twice and always (class 1).
  const twice = new SuffixTree(8);
  twice.insert([7, 8, 0, 7, 8]);
  twice.speculate([7], 2, 1, 0.1, out);
  assert.deepEqual([out.tokenIds, out.classes], [[8], [1]]);
  // Three of four (class 2), then always, three times (class 0).
  const small = new SuffixTree(8);
  small.insert([4, 9, 1, 4, 9, 1, 4, 9, 1, 4, 9, 2]);
  small.speculate([4, 9], 2, 1, 0.1, out);
  assert.deepEqual([out.tokenIds, out.classes], [[1, 4], [2, 0]]);
  // From the sequence's own tree (the latest occurrence, its own, not counted): first 0 + 0, later 8 + 3.
  const proposer = new SuffixProposer({ ...SUFFIX_DEFAULTS, maxSpecFactor: 1 });
  const guesses: number[] = [];
  const classes: number[] = [];
  proposer.propose({ tokenIds: [5, 1, 2, 3, 6, 1, 2, 3, 7, 1, 2, 3, 8, 1, 2], numPromptTokens: 1 }, 2, guesses, classes);
  assert.deepEqual([guesses, classes], [[3, 6], [0, 11]]);
  assert.equal(proposer.numConfidenceClasses, 16);
});

test('suffix proposes from the sequence itself and from recent outputs, the likelier one', () => {
  const proposer = new SuffixProposer({ ...SUFFIX_DEFAULTS, maxSpecFactor: 4 });
  const out: number[] = [];
  // Its own text: after 1 2 came 3 4 5 twice.
  proposer.propose({ tokenIds: [1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 5, 8, 1, 2], numPromptTokens: 3 }, 3, out);
  assert.deepEqual(out, [3, 4, 5]);
  // Nothing known: nothing proposed.
  const fresh = { tokenIds: [40, 41], numPromptTokens: 2 };
  proposer.propose(fresh, 4, out);
  assert.deepEqual(out, []);
  // A finished request's output teaches the next one, which never saw it.
  proposer.finish({ tokenIds: [7, 40, 41, 42, 43, 44], numPromptTokens: 1 });
  proposer.propose(fresh, 4, out);
  assert.deepEqual(out, [42, 43, 44]);
  assert.equal(proposer.numCachedRequests, 1);
  // maxNumTokens caps it, and a matched token proposes at most maxSpecFactor tokens.
  proposer.propose(fresh, 2, out);
  assert.deepEqual(out, [42, 43]);
  proposer.propose({ tokenIds: [41], numPromptTokens: 1 }, 8, out);
  assert.deepEqual(out, [42, 43, 44]);
  const strict = new SuffixProposer({ ...SUFFIX_DEFAULTS, maxSpecFactor: 1 });
  strict.finish({ tokenIds: [7, 40, 41, 42, 43, 44], numPromptTokens: 1 });
  strict.propose({ tokenIds: [41], numPromptTokens: 1 }, 8, out);
  assert.deepEqual(out, [42]);
  // An unlikely continuation is not proposed: after 5 came 1, 2, 3, 4, each once.
  const unsure = new SuffixProposer({ ...SUFFIX_DEFAULTS, minTokenProb: 0.3 });
  unsure.propose({ tokenIds: [5, 1, 5, 2, 5, 3, 5, 4, 5], numPromptTokens: 9 }, 4, out);
  assert.deepEqual(out, []);
});

test('suffix keeps its recent outputs within its bounds, oldest out first', (t) => {
  const { random } = seeded(t);
  const settings = { ...SUFFIX_DEFAULTS, maxTreeDepth: 8, maxCachedRequests: 20, maxCachedTokens: 500 };
  const proposer = new SuffixProposer(settings);
  const out: number[] = [];
  for (let i = 0; i < 300; i++) {
    const sequence = { tokenIds: Array.from({ length: 4 + Math.floor(random() * 60) }, () => Math.floor(random() * 50)), numPromptTokens: 3 };
    proposer.propose(sequence, 4, out);
    proposer.finish(sequence);
    assert.ok(proposer.numCachedRequests <= settings.maxCachedRequests);
    assert.ok(proposer.numSharedNodes <= 1 + settings.maxCachedTokens * settings.maxTreeDepth, `${proposer.numSharedNodes} nodes`);
  }
  // The oldest outputs are gone: a continuation only they held is not proposed any more.
  const early = new SuffixProposer(settings);
  early.finish({ tokenIds: [0, 900, 901, 902, 903], numPromptTokens: 1 });
  early.propose({ tokenIds: [900, 901], numPromptTokens: 2 }, 2, out);
  assert.deepEqual(out, [902, 903]);
  for (let i = 0; i < 30; i++) early.finish({ tokenIds: [0, 1000 + i, 2000 + i], numPromptTokens: 1 });
  early.propose({ tokenIds: [900, 901], numPromptTokens: 2 }, 2, out);
  assert.deepEqual(out, []);
  // A sequence's own index slides past its oldest tokens, however long it grows.
  const long = { tokenIds: [] as number[], numPromptTokens: 0 };
  for (let i = 0; i < 10_000; i++) {
    long.tokenIds.push(Math.floor(random() * 1000));
    if (i % 97 === 0) proposer.propose(long, 4, out);
  }
  proposer.propose(long, 4, out);
  const numOwnNodes = proposer.numOwnNodes(long);
  assert.ok(numOwnNodes > LOCAL_WINDOW_TOKENS && numOwnNodes <= 1 + LOCAL_WINDOW_TOKENS * settings.maxTreeDepth, `${numOwnNodes} nodes`);
  // Its own index is kept no longer than the sequence.
  proposer.finish(long);
  assert.equal(proposer.numOwnNodes(long), 0);
});

test('suffix indexes a finished output into the shared tree a slice per proposal, ending where one insert would', (t) => {
  const { random } = seeded(t);
  const settings = { ...SUFFIX_DEFAULTS, maxTreeDepth: 12 };
  const proposer = new SuffixProposer(settings);
  const output = Array.from({ length: 5_000 }, () => Math.floor(random() * 40));
  proposer.finish({ tokenIds: [1, ...output], numPromptTokens: 1 });
  assert.equal(proposer.numSharedNodes, 1, 'nothing indexed on the finishing step');
  assert.equal(proposer.numPendingSharedTokens, output.length);
  const asking = { tokenIds: [1, 2, 3], numPromptTokens: 3 };
  const out: number[] = [];
  proposer.propose(asking, 4, out);
  const whole = new SuffixTree(settings.maxTreeDepth);
  whole.insert(output.slice(0, SHARED_TOKENS_PER_PROPOSAL));
  assert.equal(proposer.numSharedNodes, whole.numNodes, 'one slice indexed per proposal');
  for (let i = 1; i < Math.ceil(output.length / SHARED_TOKENS_PER_PROPOSAL); i++) proposer.propose(asking, 4, out);
  assert.equal(proposer.numPendingSharedTokens, 0);
  assert.equal(proposer.numCachedRequests, 1);
  const reference = new SuffixTree(settings.maxTreeDepth);
  reference.insert(output);
  assert.equal(proposer.numSharedNodes, reference.numNodes, 'the slices index the text as one insert does');
  // And it proposes what one insert would (from a context whose own tree, of distinct tokens, has nothing to say).
  let at = 1000;
  while (new Set(output.slice(at, at + 6)).size < 6) at++;
  const context = output.slice(at, at + 6);
  const expected: Speculation = { tokenIds: [], score: 0, classes: [] };
  reference.speculate(context, 6, settings.maxSpecFactor, settings.minTokenProb, expected);
  const recentOnly = { tokenIds: context, numPromptTokens: context.length };
  proposer.propose(recentOnly, 6, out);
  assert.deepEqual(out, expected.tokenIds);
});

