// A gateway's side of the shared routing state (engine/shared-state.ts): it discovers the workers
// registered in Redis for the models it serves, adds them to their routers and drops them when
// their heartbeat expires, and reads their KV event streams into the routers' prefix indexes.
//
// A worker's index entries come from its Redis stream once the first entry is read (the stream
// opens with a snapshot, so reading it from the start rebuilds the worker's cache exactly, as a
// restarted gateway does); until then, and whenever Redis is unreachable, from the worker's
// engine stream. Without Redis routing goes on over the workers last known, fed by their engine
// streams; when Redis returns each stream is read again from its start.
import { Redis } from 'ioredis';
import {
  decodeKvEvents, isSnapshot, KV_ENTRY, kvStreamKey, MAX_RECONNECT_DELAY_MS, parseRegistration, REDIS_CLIENT_OPTIONS, workerKey, WORKERS_KEY,
  type WorkerRegistration,
} from '../engine/shared-state.ts';
import type { Logger } from 'pino';
import { silentLogger, type ModelRouter, type RoutableWorker } from './model-router.ts';

/** A worker the gateway can close once its requests are done. */
export interface ClosableWorker extends RoutableWorker {
  readonly numInFlight: number;
  close(): void;
}

export interface SharedStateOptions<W extends ClosableWorker> {
  redisUrl: string;
  /** The routers of the models this gateway serves, by served name. */
  routers: ReadonlyMap<string, ModelRouter<W>>;
  /** A client for a discovered worker. */
  connect(registration: WorkerRegistration): W;
  /** How often to read the registry. */
  heartbeatIntervalMs: number;
  /** How long a registration lives without a heartbeat (the grace after Redis returns is this plus a reconnect's delay). */
  heartbeatTtlMs: number;
  /** The gateway's log (component `router`); silent when omitted. */
  log?: Logger;
}

interface Discovered<W extends ClosableWorker> {
  registration: WorkerRegistration;
  router: ModelRouter<W>;
  worker: W;
  streamKey: string;
  /** The last stream entry applied; '0' reads the stream from its start. */
  lastEntryId: string;
}

/** How long one XREAD waits for new entries before it looks at the set of workers again. */
const READ_BLOCK_MS = 250;
const ENTRIES_PER_READ = 512;

export class RedisSharedState<W extends ClosableWorker> {
  private readonly options: SharedStateOptions<W>;
  private readonly log: Logger;
  private readonly commands: Redis;
  /** XREAD BLOCK holds its connection: it gets one of its own. */
  private readonly reader: Redis;
  private readonly discovered = new Map<string, Discovered<W>>();
  /** Removed from routing, closed once their requests in flight are done. */
  private readonly retiring = new Set<W>();
  private readonly waiters: { modelName: string; resolve: (registration: WorkerRegistration) => void }[] = [];
  /** When registrations missing from the registry may be dropped; null while Redis is away. */
  private dropsMissingFromMs: number | null = null;
  private hasConnected = false;
  /** Counts connections lost: a read sent before the last loss (ioredis resends it) is not applied. */
  private numConnectionsLost = 0;
  private readonly pollTimer: NodeJS.Timeout;
  private isPolling = false;
  private isClosed = false;
  private readonly readLoop: Promise<void>;
  /**
   * Settles on close: a read in flight when the connection dropped may wait for a reconnect
   * that close cancels (ioredis keeps it to resend), so the loop stops waiting on it.
   */
  private readonly closing: Promise<null>;
  private signalClosing: () => void = () => {};

  constructor(options: SharedStateOptions<W>) {
    this.options = options;
    this.log = options.log ?? silentLogger;
    this.commands = new Redis(options.redisUrl, REDIS_CLIENT_OPTIONS);
    this.reader = new Redis(options.redisUrl, REDIS_CLIENT_OPTIONS);
    for (const client of [this.commands, this.reader]) client.on('error', () => {}); // they reconnect on their own
    this.commands.on('ready', () => {
      // After Redis returns (empty, perhaps), a worker needs one TTL to register again, counted
      // from its own reconnect, which may come up to a reconnect's delay after this gateway's.
      const graceMs = this.hasConnected ? options.heartbeatTtlMs + MAX_RECONNECT_DELAY_MS : 0;
      this.dropsMissingFromMs = Date.now() + graceMs;
      this.hasConnected = true;
      void this.poll();
    });
    this.commands.on('close', () => {
      this.dropsMissingFromMs = null;
      this.onConnectionLost();
    });
    this.reader.on('close', () => this.onConnectionLost());
    this.pollTimer = setInterval(() => void this.poll(), options.heartbeatIntervalMs);
    this.pollTimer.unref();
    this.closing = new Promise((resolve) => (this.signalClosing = () => resolve(null)));
    this.readLoop = this.readStreams();
  }

  /** Connected to Redis now (routing goes on without it). */
  get isConnected(): boolean {
    return this.commands.status === 'ready';
  }

  /** The first registration of a worker of modelName, once one is discovered. */
  waitForWorker(modelName: string, timeoutMs: number): Promise<WorkerRegistration> {
    for (const entry of this.discovered.values()) if (entry.registration.model.modelName === modelName) return Promise.resolve(entry.registration);
    return new Promise((resolve, reject) => {
      const waiter = { modelName, resolve: (registration: WorkerRegistration) => {
        clearTimeout(timer);
        resolve(registration);
      } };
      const timer = setTimeout(() => {
        this.waiters.splice(this.waiters.indexOf(waiter), 1);
        reject(new Error(`no worker of ${modelName} registered in Redis within ${timeoutMs / 1000} s`));
      }, timeoutMs);
      this.waiters.push(waiter);
    });
  }

  /** Stops reading Redis and closes the clients of every discovered worker. */
  async close(): Promise<void> {
    if (this.isClosed) return;
    this.isClosed = true;
    this.signalClosing();
    clearInterval(this.pollTimer);
    this.commands.disconnect();
    this.reader.disconnect();
    await this.readLoop;
    for (const entry of this.discovered.values()) entry.router.removeWorker(entry.registration.address)?.close();
    this.discovered.clear();
    for (const worker of this.retiring) worker.close();
    this.retiring.clear();
  }

  /** Reads the registry: workers join and leave their routers. */
  private async poll(): Promise<void> {
    this.closeRetired();
    if (this.isPolling || this.isClosed || this.commands.status !== 'ready') return;
    this.isPolling = true;
    try {
      const workerIds = await this.commands.smembers(WORKERS_KEY);
      const values = workerIds.length === 0 ? [] : await this.commands.mget(workerIds.map(workerKey));
      const live = new Map<string, WorkerRegistration>();
      const expiredIds: string[] = [];
      for (const [i, workerId] of workerIds.entries()) {
        const value = values[i];
        if (value === null) {
          expiredIds.push(workerId);
          continue;
        }
        let registration: WorkerRegistration;
        try {
          registration = parseRegistration(value);
        } catch (err) {
          this.log.warn({ err }, 'a worker registration in Redis is unreadable; skipped');
          continue;
        }
        if (this.options.routers.has(registration.model.modelName)) live.set(workerId, registration);
      }
      // Any gateway may tidy the set: its members' keys expired.
      if (expiredIds.length > 0) await this.commands.srem(WORKERS_KEY, ...expiredIds);
      if (this.isClosed) return;
      for (const registration of live.values()) if (!this.discovered.has(registration.workerId)) this.join(registration);
      if (this.dropsMissingFromMs !== null && Date.now() >= this.dropsMissingFromMs) {
        for (const workerId of [...this.discovered.keys()]) if (!live.has(workerId)) this.leave(workerId);
      }
    } catch {
      // Redis went away mid-poll: the next 'ready' polls again.
    } finally {
      this.isPolling = false;
    }
  }

  private join(registration: WorkerRegistration): void {
    const router = this.options.routers.get(registration.model.modelName)!;
    const { address } = registration;
    if (router.workers.some((worker) => worker.address === address)) {
      const previous = [...this.discovered.values()].find((entry) => entry.registration.address === address);
      // Configured by address: routed from its engine stream, never dropped by the registry.
      if (previous === undefined) return;
      // A worker restarted on the same address registers anew: the later process wins.
      if (previous.registration.startedAtMs > registration.startedAtMs) return;
      this.leave(previous.registration.workerId);
    }
    const worker = this.options.connect(registration);
    // Fed by its engine stream until the first entry of its Redis stream is read.
    router.addWorker(worker, registration.model);
    this.discovered.set(registration.workerId, {
      registration, router, worker, streamKey: kvStreamKey(registration.workerId), lastEntryId: '0',
    });
    for (const waiter of this.waiters.filter((w) => w.modelName === registration.model.modelName)) {
      this.waiters.splice(this.waiters.indexOf(waiter), 1);
      waiter.resolve(registration);
    }
  }

  private leave(workerId: string): void {
    const entry = this.discovered.get(workerId)!;
    this.discovered.delete(workerId);
    entry.router.removeWorker(entry.registration.address);
    // Requests in flight finish (a dead worker's fail at once); new ones go elsewhere.
    this.retiring.add(entry.worker);
    this.closeRetired();
  }

  private closeRetired(): void {
    for (const worker of this.retiring) {
      if (worker.numInFlight > 0) continue;
      worker.close();
      this.retiring.delete(worker);
    }
  }

  private onConnectionLost(): void {
    this.numConnectionsLost++;
    // The last known state goes on, kept up to date by the engine streams; on Redis's return
    // each stream is read again from its snapshot.
    for (const entry of this.discovered.values()) {
      entry.router.setFedExternally(entry.registration.address, false);
      entry.lastEntryId = '0';
    }
  }

  private async readStreams(): Promise<void> {
    while (!this.isClosed) {
      const entries = [...this.discovered.values()];
      if (entries.length === 0 || this.reader.status !== 'ready') {
        await new Promise((resolve) => setTimeout(resolve, 50));
        continue;
      }
      let reply: unknown;
      const numLostBefore = this.numConnectionsLost;
      try {
        const read = this.reader.call(
          'XREAD', 'COUNT', ENTRIES_PER_READ, 'BLOCK', READ_BLOCK_MS, 'STREAMS',
          ...entries.map((entry) => entry.streamKey), ...entries.map((entry) => entry.lastEntryId),
        );
        read.catch(() => {}); // once closing wins the race, its rejection has no reader
        reply = await Promise.race([read, this.closing]);
      } catch {
        if (!this.isClosed) await new Promise((resolve) => setTimeout(resolve, 50));
        continue;
      }
      // A read in flight when a connection dropped comes back from after the reconnect with the
      // positions of before: the streams are read again from their start instead.
      if (reply === null || this.isClosed || this.commands.status !== 'ready' || this.numConnectionsLost !== numLostBefore) continue;
      for (const [streamKey, streamEntries] of reply as [string, [string, string[]][]][]) {
        const entry = entries.find((candidate) => candidate.streamKey === streamKey);
        // Gone while the read was in flight, or reset to re-read from the start.
        if (entry === undefined || this.discovered.get(entry.registration.workerId) !== entry) continue;
        for (const [entryId, fields] of streamEntries) this.apply(entry, entryId, fields);
      }
    }
  }

  private apply(entry: Discovered<W>, entryId: string, fields: string[]): void {
    const values = new Map<string, string>();
    for (let i = 0; i + 1 < fields.length; i += 2) values.set(fields[i], fields[i + 1]);
    let events;
    try {
      events = decodeKvEvents(values.get(KV_ENTRY.events) ?? '');
    } catch (err) {
      this.log.warn({ worker: entry.registration.address, err }, 'unreadable KV events in Redis; skipped');
      entry.lastEntryId = entryId;
      return;
    }
    const { address } = entry.registration;
    // From its first entry read (a snapshot) on, the worker's index is Redis's.
    if (entry.lastEntryId === '0' || isSnapshot(events)) entry.router.setFedExternally(address, true);
    entry.lastEntryId = entryId;
    entry.router.applyExternalEvents(
      address, events, Number(values.get(KV_ENTRY.numCachedBlocks) ?? 0), Number(values.get(KV_ENTRY.publishedAtMs) ?? Date.now()),
    );
  }
}
