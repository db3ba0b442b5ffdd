// KV-cache groups, vLLM's hybrid allocator: layers that see the same span of past tokens (every
// position, or one sliding window) share a block table, so the blocks a window has left can be
// freed for its layers while full-attention layers keep theirs. All groups draw from one pool of
// equal blocks: a block holds `layersPerBlock` layers of one group, the size of the smallest kind,
// and larger kinds split into several groups of that many layers (the last may hold fewer; its
// blocks keep the same size). A model whose layers all see the same span has one group.

export interface KvGroupPlan {
  /** Per group: its layers' window (0 = unlimited) and its layers, in order. */
  groups: Array<{ slidingWindowTokens: number; layers: number[] }>;
  layersPerBlock: number;
  /** Per layer: its group and its slot within the group. */
  layerGroups: number[];
  layerSlots: number[];
}

export function planKvGroups(layerWindows: readonly number[]): KvGroupPlan {
  const kinds = new Map<number, number[]>();
  layerWindows.forEach((window, layer) => {
    const layers = kinds.get(window) ?? [];
    layers.push(layer);
    kinds.set(window, layers);
  });
  const layersPerBlock = Math.min(...[...kinds.values()].map((layers) => layers.length));
  // Full attention first, then windows in increasing order: group 0 is the one whose blocks a
  // prefix-cache hit must cover from the start, if the model has it.
  const windows = [...kinds.keys()].sort((a, b) => (a === 0 ? -1 : b === 0 ? 1 : a - b));
  const plan: KvGroupPlan = { groups: [], layersPerBlock, layerGroups: [], layerSlots: [] };
  for (const window of windows) {
    const layers = kinds.get(window)!;
    for (let first = 0; first < layers.length; first += layersPerBlock) {
      const groupLayers = layers.slice(first, first + layersPerBlock);
      groupLayers.forEach((layer, slot) => {
        plan.layerGroups[layer] = plan.groups.length;
        plan.layerSlots[layer] = slot;
      });
      plan.groups.push({ slidingWindowTokens: window, layers: groupLayers });
    }
  }
  return plan;
}
