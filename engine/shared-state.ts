// The Redis layout of the routing state that engine workers share with gateways: what workers
// write (redis-publisher.ts) and gateways read (router/redis-state.ts), as engine.proto is for
// the gRPC stream between them. The engine owns it because it writes it; the router imports it
// as it imports block-hash.ts and types.ts.
//
//   conduit:workers         SET     the ids of registered workers
//   conduit:worker:{id}     STRING  its registration (JSON), expiring heartbeatTtlMs after the
//                                   last heartbeat: a worker that stops heartbeating leaves
//   conduit:kv:{id}         STREAM  its KV events, in the order its engine made them
//
// A KV stream always begins with a snapshot, an entry whose events start with `cleared` and
// store every block the worker's cache holds: the worker writes one when it (re)connects and
// whenever the deltas since the last outgrow its cache, trimming everything before it. A reader
// that starts at the beginning of a stream, or at any entry it has not missed since, holds the
// worker's exact cache once it reaches the end.
import type { RedisOptions } from 'ioredis';
import type { KvEvent, WorkerModelInfo } from './types.ts';

export const WORKERS_KEY = 'conduit:workers';

/**
 * The longest pause between two attempts to reconnect: after Redis returns, a client (a worker's
 * or a gateway's) is connected again within this long, so workers have re-registered one
 * heartbeat TTL plus this after a gateway reconnected.
 */
export const MAX_RECONNECT_DELAY_MS = 1_000;

/**
 * How workers and gateways connect. Commands fail at once while Redis is away instead of
 * queueing (what they carried is superseded once it returns: a new registration, a new
 * snapshot, a new read from the start); a command in flight when the connection drops fails
 * at the second attempt to reconnect, or is sent again if the first succeeds.
 */
export const REDIS_CLIENT_OPTIONS: RedisOptions = {
  protocol: 2,
  enableOfflineQueue: false,
  maxRetriesPerRequest: 1,
  retryStrategy: (times) => Math.min(100 * times, MAX_RECONNECT_DELAY_MS),
};

export function workerKey(workerId: string): string {
  return `conduit:worker:${workerId}`;
}

export function kvStreamKey(workerId: string): string {
  return `conduit:kv:${workerId}`;
}

/** What a worker registers: where to reach it and what it serves. */
export interface WorkerRegistration {
  /** Unique per worker process (a restarted worker registers anew). */
  workerId: string;
  /** HOST:PORT (or unix:PATH) where it serves engine.proto. */
  address: string;
  /** Its model as Health reports it: name, block size, hash scheme, context length. */
  model: WorkerModelInfo;
  /** Capacity: KV blocks, and the most sequences in one batch. */
  numKvBlocks: number;
  maxNumSeqs: number;
  /** When the process registered first (ms since the epoch): of two ids on one address, the later wins. */
  startedAtMs: number;
}

/** Fields of one KV stream entry. */
export const KV_ENTRY = {
  /** The events, encoded by encodeKvEvents. */
  events: 'events',
  /** The worker's cached-block count after them, for the reader's drift check. */
  numCachedBlocks: 'cached',
  /** When the worker published them (ms since the epoch), for the event lag. */
  publishedAtMs: 'at',
} as const;

/** `c` (cleared), `+h1,h2` (stored), `-h3` (removed), separated by spaces. */
export function encodeKvEvents(events: readonly KvEvent[]): string {
  return events
    .filter((event) => event.kind === 'cleared' || event.blockHashes.length > 0)
    .map((event) => (event.kind === 'cleared' ? 'c' : `${event.kind === 'stored' ? '+' : '-'}${event.blockHashes.join(',')}`))
    .join(' ');
}

export function decodeKvEvents(text: string): KvEvent[] {
  const events: KvEvent[] = [];
  for (const part of text.split(' ')) {
    if (part === 'c') events.push({ kind: 'cleared' });
    else if (part.length > 1 && (part[0] === '+' || part[0] === '-')) {
      events.push({ kind: part[0] === '+' ? 'stored' : 'removed', blockHashes: part.slice(1).split(',') });
    } else if (part !== '') {
      throw new Error(`malformed KV event "${part.slice(0, 40)}"`);
    }
  }
  return events;
}

/** True when the entry's events open with `cleared`: everything before it is superseded. */
export function isSnapshot(events: readonly KvEvent[]): boolean {
  return events.length > 0 && events[0].kind === 'cleared';
}

export function parseRegistration(json: string): WorkerRegistration {
  const value = JSON.parse(json) as Partial<WorkerRegistration>;
  const model = value.model as Partial<WorkerModelInfo> | undefined;
  const isValid = typeof value.workerId === 'string' && typeof value.address === 'string'
    && typeof value.numKvBlocks === 'number' && typeof value.maxNumSeqs === 'number' && typeof value.startedAtMs === 'number'
    && typeof model === 'object' && model !== null && typeof model.modelName === 'string'
    && typeof model.blockSizeTokens === 'number' && typeof model.blockHashScheme === 'string' && typeof model.maxModelLen === 'number';
  if (!isValid) throw new Error(`malformed worker registration ${json.slice(0, 200)}`);
  return value as WorkerRegistration;
}
