// A worker's side of the shared routing state (shared-state.ts): it registers in Redis with
// a heartbeat that expires, and publishes its engine's KV events to its stream, opening the
// stream with a snapshot of its cache. When Redis goes away, events are dropped, not queued: on
// its return the worker registers again and publishes a fresh snapshot, trimming the stream
// before it, so readers recover the exact cache whatever they missed.
//
// The heartbeat runs from start to close whatever the connection does (a beat while Redis is
// away fails at once), so no sequence of connection events can stop it. A new snapshot is only
// ever taken after Redis answered: on 'ready', or on a heartbeat's reply once an entry was lost.
// A failed entry never resubscribes by itself: between a dropped socket and ioredis's 'close'
// the client still reads 'ready' while every command fails at once, and a snapshot taken from
// the failure would fail the same way, in a loop of microtasks that starves the event loop.
import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import {
  encodeKvEvents, isSnapshot, KV_ENTRY, kvStreamKey, REDIS_CLIENT_OPTIONS, workerKey, WORKERS_KEY, type WorkerRegistration,
} from './shared-state.ts';
import type { StepReport, WorkerModelInfo } from './types.ts';

/** What the publisher reads of an engine: its reports, the first of each subscription a snapshot. */
export interface ReportSource {
  onReport(listener: (report: StepReport) => void): () => void;
}

export interface PublisherSettings {
  redisUrl: string;
  /** Where gateways reach this worker. */
  address: string;
  model: WorkerModelInfo;
  numKvBlocks: number;
  maxNumSeqs: number;
  heartbeatIntervalMs: number;
  heartbeatTtlMs: number;
  /**
   * A new snapshot once the hashes published since the last exceed this many plus twice the
   * cache's blocks, so a stream stays within a few times the cache's size (1024 by default).
   */
  minHashesBetweenSnapshots?: number;
}

/** How long a worker's stream outlives its last heartbeat (a crashed worker's is left behind). */
const STREAM_TTL_HEARTBEATS = 20;

export class RedisPublisher {
  readonly registration: WorkerRegistration;
  private readonly redis: Redis;
  private readonly settings: PublisherSettings;
  private readonly source: ReportSource;
  /** The subscription to the engine's reports; null while nothing is published (an entry was lost, or Redis is away). */
  private unsubscribe: (() => void) | null = null;
  private readonly heartbeatTimer: NodeJS.Timeout;
  /** Counts subscriptions, so that a lost entry stops only the one it belonged to. */
  private subscriptionId = 0;
  private numHashesSinceSnapshot = 0;
  private isClosed = false;

  constructor(source: ReportSource, settings: PublisherSettings) {
    this.source = source;
    this.settings = settings;
    this.registration = {
      workerId: randomUUID(),
      address: settings.address,
      model: settings.model,
      numKvBlocks: settings.numKvBlocks,
      maxNumSeqs: settings.maxNumSeqs,
      startedAtMs: Date.now(),
    };
    this.redis = new Redis(settings.redisUrl, REDIS_CLIENT_OPTIONS);
    this.redis.on('error', () => {}); // reconnects on its own; 'ready' resumes publishing
    // Whatever was published before may be lost (Redis restarted empty): register and snapshot anew.
    this.redis.on('ready', () => {
      this.stopPublishing();
      this.heartbeat();
    });
    this.redis.on('close', () => this.stopPublishing());
    this.heartbeatTimer = setInterval(() => this.heartbeat(), settings.heartbeatIntervalMs);
    this.heartbeatTimer.unref();
  }

  get workerId(): string {
    return this.registration.workerId;
  }

  /** Leaves the registry and deletes the stream (gateways drop the worker at once), then disconnects. */
  async close(): Promise<void> {
    if (this.isClosed) return;
    this.isClosed = true;
    clearInterval(this.heartbeatTimer);
    this.stopPublishing();
    if (this.redis.status === 'ready') {
      const { workerId } = this.registration;
      await this.redis.multi().srem(WORKERS_KEY, workerId).del(workerKey(workerId), kvStreamKey(workerId)).exec().catch(() => {});
    }
    this.redis.disconnect();
  }

  private stopPublishing(): void {
    this.unsubscribe?.();
    this.unsubscribe = null;
  }

  private heartbeat(): void {
    if (this.isClosed) return;
    const { workerId } = this.registration;
    this.redis
      .multi()
      .set(workerKey(workerId), JSON.stringify(this.registration), 'PX', this.settings.heartbeatTtlMs)
      .sadd(WORKERS_KEY, workerId)
      .pexpire(kvStreamKey(workerId), STREAM_TTL_HEARTBEATS * this.settings.heartbeatTtlMs)
      .exec()
      .then(
        // Redis answered: a stream that lost an entry (or was never opened) restarts from a snapshot.
        () => {
          if (this.unsubscribe === null && !this.isClosed) this.resubscribe();
        },
        () => {}, // a missed beat: the next one, or the next 'ready', registers again
      );
  }

  /** A new subscription's first report is a snapshot of the cache: the stream restarts from it. */
  private resubscribe(): void {
    this.unsubscribe?.();
    this.numHashesSinceSnapshot = 0;
    const subscriptionId = ++this.subscriptionId;
    this.unsubscribe = this.source.onReport((report) => this.publish(report, subscriptionId));
  }

  private publish(report: StepReport, subscriptionId: number): void {
    if (report.events.length === 0) return;
    const key = kvStreamKey(this.registration.workerId);
    const snapshot = isSnapshot(report.events);
    const written = this.redis.xadd(
      key, '*',
      KV_ENTRY.events, encodeKvEvents(report.events),
      KV_ENTRY.numCachedBlocks, String(report.load.numCachedBlocks),
      KV_ENTRY.publishedAtMs, String(Date.now()),
    );
    written.then(
      (entryId) => {
        // Everything before a snapshot is superseded: readers start from it.
        if (snapshot && entryId !== null) this.redis.xtrim(key, 'MINID', entryId).catch(() => {});
      },
      // A lost entry leaves a gap only a snapshot closes: publishing stops until a heartbeat's
      // reply takes one (a later subscription's gap is not this one's).
      () => {
        if (this.subscriptionId === subscriptionId) this.stopPublishing();
      },
    );
    if (snapshot) return;
    for (const event of report.events) if (event.kind !== 'cleared') this.numHashesSinceSnapshot += event.blockHashes.length;
    const minHashes = this.settings.minHashesBetweenSnapshots ?? 1024;
    if (this.numHashesSinceSnapshot > minHashes + 2 * report.load.numCachedBlocks) this.resubscribe();
  }
}
