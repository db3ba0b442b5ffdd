// Session affinity: the worker that served a conversation's previous turn, by a key the gateway
// reads from the request (gateway/generation-request.ts: the `x-session-id` header, or a
// Responses request's `previous_response_id`). Entries expire after a quiet spell and the oldest
// go first past a bound, so the table stays small whatever clients send.

interface Entry {
  address: string;
  expiresAtMs: number;
}

export class AffinityTable {
  private readonly entries = new Map<string, Entry>();

  constructor(
    private readonly ttlMs: number,
    private readonly maxEntries: number,
    private readonly now: () => number = Date.now,
  ) {}

  get size(): number {
    return this.entries.size;
  }

  /** The worker that last served key, unless the entry expired. */
  get(key: string): string | undefined {
    const entry = this.entries.get(key);
    if (entry === undefined) return undefined;
    if (entry.expiresAtMs <= this.now()) {
      this.entries.delete(key);
      return undefined;
    }
    return entry.address;
  }

  set(key: string, address: string): void {
    // Re-inserted, so the map's order stays least recently used first.
    this.entries.delete(key);
    this.entries.set(key, { address, expiresAtMs: this.now() + this.ttlMs });
    if (this.entries.size > this.maxEntries) this.entries.delete(this.entries.keys().next().value!);
  }

  /** Forgets every key pinned to a worker that left. */
  forgetWorker(address: string): void {
    for (const [key, entry] of this.entries) if (entry.address === address) this.entries.delete(key);
  }
}
