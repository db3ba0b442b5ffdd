// The suffix tree's child table against a Map, over random links and unlinks.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ChildTable } from '../spec/child-table.ts';
import { seeded } from './spec-harness.ts';

test('child table: get, add and delete agree with a Map through growth and backward-shift deletes', (t) => {
  const { seed, random } = seeded(t);
  const table = new ChildTable(16);
  const reference = new Map<string, number>();
  // Few parents and tokens, so that keys collide, probe runs form and deletes shift entries.
  const numParents = 1 + Math.floor(random() * 300);
  const numTokens = 1 + Math.floor(random() * 40);
  for (let op = 0; op < 20_000; op++) {
    const parent = Math.floor(random() * numParents);
    const tokenId = Math.floor(random() * numTokens) * 4099;
    const key = `${parent},${tokenId}`;
    const linked = reference.get(key);
    if (linked === undefined && random() < 0.6) {
      table.add(parent, tokenId, op);
      reference.set(key, op);
    } else if (linked !== undefined && random() < 0.5) {
      table.delete(parent, tokenId);
      reference.delete(key);
    }
    assert.equal(table.get(parent, tokenId), reference.get(key) ?? -1, `seed ${seed}: op ${op}, ${key}`);
    assert.equal(table.size, reference.size, `seed ${seed}: op ${op}`);
  }
  for (const [key, child] of reference) {
    const [parent, tokenId] = key.split(',').map(Number);
    assert.equal(table.get(parent, tokenId), child, `seed ${seed}: ${key} after every op`);
  }
});
