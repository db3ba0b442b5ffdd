// A tensor-parallel group inside one test process: rank 0 as the model the test drives, ranks > 0
// serving its passes, each a model of its own joined through the group's shared-memory segment.
import { randomUUID } from 'node:crypto';
import type { LoadOptions } from '../api.ts';
import { loadModel, type LoadedModel } from '../index.ts';

export interface TpGroup {
  model: LoadedModel;
  ranks: LoadedModel[];
  /** Settles when every rank > 0 has stopped serving: after close(), or once the group failed. */
  served: Promise<PromiseSettledResult<void>[]>;
  close(): Promise<void>;
}

export function groupName(): string {
  return `conduit-test-${randomUUID()}`;
}

export async function startGroup(options: LoadOptions, size: number, connectTimeoutMs = 60_000): Promise<TpGroup> {
  const group = groupName();
  const loads = Array.from({ length: size }, (_, rank) =>
    loadModel({ ...options, numThreads: 1, tensorParallel: { size, rank, group, connectTimeoutMs } }),
  );
  const [model, ...ranks] = await Promise.all(loads);
  const served = Promise.allSettled(ranks.map((rank) => rank.serveRank()));
  return {
    model,
    ranks,
    served,
    async close() {
      model.close();
      await served;
      for (const rank of ranks) rank.close();
    },
  };
}

export async function withGroup<T>(options: LoadOptions, size: number, fn: (group: TpGroup) => Promise<T>): Promise<T> {
  const group = await startGroup(options, size);
  try {
    return await fn(group);
  } finally {
    await group.close();
  }
}
