// A worker's side of the shared routing state (proto/redis-state.ts): it registers in Redis with
// a heartbeat that expires, and publishes its engine's KV events to its stream, opening the
// stream with a snapshot of its cache. When Redis goes away, events are dropped, not queued: on
// its return the worker registers again and publishes a fresh snapshot, trimming the stream
// before it, so readers recover the exact cache whatever they missed.
import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import {
  encodeKvEvents, isSnapshot, KV_ENTRY, kvStreamKey, workerKey, WORKERS_KEY, type WorkerRegistration,
} from '../proto/redis-state.ts';
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
  private unsubscribe: (() => void) | null = null;
  private heartbeatTimer: NodeJS.Timeout | null = null;
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
    // Commands fail at once while Redis is away instead of queueing: what they carried is
    // superseded by the snapshot written on the next 'ready'.
    this.redis = new Redis(settings.redisUrl, {
      protocol: 2,
      enableOfflineQueue: false,
      maxRetriesPerRequest: 1,
      retryStrategy: (times) => Math.min(100 * times, 1_000),
    });
    this.redis.on('error', () => {}); // reconnects on its own; 'ready' resumes publishing
    this.redis.on('ready', () => this.onReady());
    this.redis.on('close', () => this.stopPublishing());
  }

  get workerId(): string {
    return this.registration.workerId;
  }

  /** Leaves the registry and deletes the stream (gateways drop the worker at once), then disconnects. */
  async close(): Promise<void> {
    if (this.isClosed) return;
    this.isClosed = true;
    this.stopPublishing();
    if (this.redis.status === 'ready') {
      const { workerId } = this.registration;
      await this.redis.multi().srem(WORKERS_KEY, workerId).del(workerKey(workerId), kvStreamKey(workerId)).exec().catch(() => {});
    }
    this.redis.disconnect();
  }

  private onReady(): void {
    if (this.isClosed) return;
    this.heartbeat();
    this.heartbeatTimer ??= setInterval(() => this.heartbeat(), this.settings.heartbeatIntervalMs);
    this.heartbeatTimer.unref();
    this.resubscribe();
  }

  private stopPublishing(): void {
    this.unsubscribe?.();
    this.unsubscribe = null;
    if (this.heartbeatTimer !== null) clearInterval(this.heartbeatTimer);
    this.heartbeatTimer = null;
  }

  private heartbeat(): void {
    const { workerId } = this.registration;
    this.redis
      .multi()
      .set(workerKey(workerId), JSON.stringify(this.registration), 'PX', this.settings.heartbeatTtlMs)
      .sadd(WORKERS_KEY, workerId)
      .pexpire(kvStreamKey(workerId), STREAM_TTL_HEARTBEATS * this.settings.heartbeatTtlMs)
      .exec()
      .catch(() => {}); // a missed beat: the next one, or the next 'ready', registers again
  }

  /** A new subscription's first report is a snapshot of the cache: the stream restarts from it. */
  private resubscribe(): void {
    this.unsubscribe?.();
    this.numHashesSinceSnapshot = 0;
    this.unsubscribe = this.source.onReport((report) => this.publish(report));
  }

  private publish(report: StepReport): void {
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
      // A lost entry leaves a gap only a snapshot closes: take one as soon as Redis is back.
      () => {
        if (this.redis.status === 'ready' && !this.isClosed) this.resubscribe();
      },
    );
    if (snapshot) return;
    for (const event of report.events) if (event.kind !== 'cleared') this.numHashesSinceSnapshot += event.blockHashes.length;
    const minHashes = this.settings.minHashesBetweenSnapshots ?? 1024;
    if (this.numHashesSinceSnapshot > minHashes + 2 * report.load.numCachedBlocks) this.resubscribe();
  }
}
