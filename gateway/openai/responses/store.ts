// The bounded in-memory store of responses made with store: true, for GET, DELETE and
// previous_response_id. It is bounded in bytes (what each response costs: its text, its
// conversation, its log-probabilities as typed arrays) and in count; past either bound the least
// recently used responses leave first, and every response leaves when its time is up. Two maps
// give both orders without timers: one in order of use (a get moves its entry to the end), one in
// order of storing, which is the order of expiry since every response lives equally long.
import type { ChatMessage } from '../../tokenizer/chat-template.ts';
import { compactLogprobsBytes, logprobsJsonOf, type CompactLogprobs } from './compact-logprobs.ts';
import type { ResponseObject } from './objects.ts';

export interface StoredResponse {
  /**
   * The Response object as its client last got it, but for its output text's log-probabilities,
   * which `logprobs` holds compactly (responseObjectOf puts them back).
   */
  response: ResponseObject;
  /** The conversation after this response, without instructions: what a turn continuing it is prompted with. */
  messages: readonly ChatMessage[];
  /** The output tokens' log-probabilities; null when the request did not ask for them. */
  logprobs: CompactLogprobs | null;
}

/** The whole Response object, log-probabilities included. */
export function responseObjectOf(stored: StoredResponse): ResponseObject {
  if (stored.logprobs === null) return stored.response;
  const logprobs = logprobsJsonOf(stored.logprobs);
  return {
    ...stored.response,
    output: stored.response.output.map((item) =>
      item.type === 'message' ? { ...item, content: item.content.map((part) => ({ ...part, logprobs })) } : item),
  };
}

/** Bookkeeping per object and per message, beside their strings (JavaScript strings take up to 2 bytes a character). */
const RESPONSE_OVERHEAD_BYTES = 2048;
const MESSAGE_OVERHEAD_BYTES = 96;

/**
 * What keeping a response costs, counted high: its strings at 2 bytes a character, and its whole
 * conversation, although a chain of responses shares its earlier messages.
 */
export function storedBytesOf(stored: StoredResponse): number {
  const { response } = stored;
  let numChars = response.id.length + (response.instructions?.length ?? 0) + (response.user?.length ?? 0);
  for (const [key, value] of Object.entries(response.metadata)) numChars += key.length + value.length;
  for (const item of response.output) {
    if (item.type === 'function_call') numChars += item.call_id.length + item.name.length + item.arguments.length;
    else for (const part of item.content) numChars += part.text.length;
  }
  let numBytes = RESPONSE_OVERHEAD_BYTES + 2 * numChars;
  for (const message of stored.messages) numBytes += MESSAGE_OVERHEAD_BYTES + 2 * JSON.stringify(message).length;
  if (stored.logprobs !== null) numBytes += compactLogprobsBytes(stored.logprobs);
  return numBytes;
}

interface Entry {
  stored: StoredResponse;
  numBytes: number;
}

export interface ResponseStoreLimits {
  maxResponses: number;
  maxBytes: number;
  ttlMs: number;
}

export class ResponseStore {
  /** In order of use: the first is the least recently used. */
  private readonly byUse = new Map<string, Entry>();
  /** In order of storing, with each response's expiry. */
  private readonly expiryById = new Map<string, number>();
  private numBytes = 0;

  constructor(private readonly limits: ResponseStoreLimits, private readonly nowMs: () => number = Date.now) {}

  /** The bytes the stored responses are counted at. */
  get numStoredBytes(): number {
    return this.numBytes;
  }

  get size(): number {
    return this.byUse.size;
  }

  /** Keeps a response; one larger than the whole store is not kept (a later GET of it is a 404). */
  put(stored: StoredResponse) {
    this.evictExpired();
    const id = stored.response.id;
    this.remove(id);
    const numBytes = storedBytesOf(stored);
    if (numBytes > this.limits.maxBytes) return;
    this.byUse.set(id, { stored, numBytes });
    this.expiryById.set(id, this.nowMs() + this.limits.ttlMs);
    this.numBytes += numBytes;
    while (this.numBytes > this.limits.maxBytes || this.byUse.size > this.limits.maxResponses) {
      this.remove(this.byUse.keys().next().value!);
    }
  }

  get(id: string): StoredResponse | undefined {
    this.evictExpired();
    const entry = this.byUse.get(id);
    if (entry === undefined) return undefined;
    // Used: it moves to the end, the last to leave for room.
    this.byUse.delete(id);
    this.byUse.set(id, entry);
    return entry.stored;
  }

  /** False when the store does not hold the id. */
  delete(id: string): boolean {
    this.evictExpired();
    return this.remove(id);
  }

  private remove(id: string): boolean {
    const entry = this.byUse.get(id);
    if (entry === undefined) return false;
    this.byUse.delete(id);
    this.expiryById.delete(id);
    this.numBytes -= entry.numBytes;
    return true;
  }

  private evictExpired() {
    const nowMs = this.nowMs();
    for (const [id, expiresAtMs] of this.expiryById) {
      if (expiresAtMs > nowMs) return;
      this.remove(id);
    }
  }
}
