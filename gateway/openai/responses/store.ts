// The bounded in-memory store of responses made with store: true, for GET, DELETE and
// previous_response_id. An entry leaves when its time is up or, past the most responses, oldest
// first. Every entry lives equally long and the Map keeps insertion order, so both evictions take
// from its front: no timers, amortized O(1) per call.
import type { ChatMessage } from '../../tokenizer/chat-template.ts';
import type { ResponseObject } from './objects.ts';

export interface StoredResponse {
  /** The Response object as its client last got it. */
  response: ResponseObject;
  /** The conversation after this response, without instructions: what a turn continuing it is prompted with. */
  messages: readonly ChatMessage[];
}

interface Entry {
  stored: StoredResponse;
  expiresAtMs: number;
}

export class ResponseStore {
  private readonly entries = new Map<string, Entry>();
  private readonly maxResponses: number;
  private readonly ttlMs: number;

  constructor(maxResponses: number, ttlMs: number) {
    this.maxResponses = maxResponses;
    this.ttlMs = ttlMs;
  }

  put(stored: StoredResponse) {
    this.evictExpired();
    this.entries.set(stored.response.id, { stored, expiresAtMs: Date.now() + this.ttlMs });
    if (this.entries.size > this.maxResponses) this.entries.delete(this.entries.keys().next().value!);
  }

  get(id: string): StoredResponse | undefined {
    this.evictExpired();
    return this.entries.get(id)?.stored;
  }

  /** False when the store does not hold the id. */
  delete(id: string): boolean {
    this.evictExpired();
    return this.entries.delete(id);
  }

  private evictExpired() {
    const nowMs = Date.now();
    for (const [id, entry] of this.entries) {
      if (entry.expiresAtMs > nowMs) return;
      this.entries.delete(id);
    }
  }
}
