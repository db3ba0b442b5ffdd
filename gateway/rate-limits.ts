// Per-key quotas and caps on requests in flight, as plain logic over an injected clock; the
// admission hook (admission.ts) asks `admit()` and renders its answer.
//
// Requests and tokens per minute are token buckets: a bucket of `limit` per minute holds at most
// `limit` and refills evenly at limit / 60 s, so a key may spend a whole minute's worth at once
// and then runs at the steady rate. Tokens are charged twice: an estimate when the request is
// admitted (its prompt is not tokenized yet), replaced by the actual usage when it ends. So a
// bucket may go into debt (a request larger than its estimate), which the next requests wait out.
import type { UsageAccount } from './generation.ts';

export interface KeyLimits {
  requestsPerMinute?: number;
  tokensPerMinute?: number;
  maxConcurrentRequests?: number;
}

const MS_PER_MINUTE = 60_000;
/** A cap on requests in flight frees when some request ends, which nobody can predict. */
const CONCURRENCY_RETRY_AFTER_MS = 1000;

export class TokenBucket {
  readonly capacity: number;
  // Kept in amount × 60 000 (token-milliseconds per minute), so that a clock in whole
  // milliseconds keeps every sum and every wait exact.
  private scaledLevel: number;
  private lastRefillMs: number;

  constructor(capacityPerMinute: number, nowMs: number) {
    this.capacity = capacityPerMinute;
    this.scaledLevel = capacityPerMinute * MS_PER_MINUTE;
    this.lastRefillMs = nowMs;
  }

  /** The level after refilling up to nowMs; negative while in debt. */
  levelAt(nowMs: number): number {
    this.refill(nowMs);
    return this.scaledLevel / MS_PER_MINUTE;
  }

  /** How long until the bucket holds `amount`, or its capacity if less: a full bucket admits anything. */
  msUntilAvailable(amount: number, nowMs: number): number {
    this.refill(nowMs);
    const scaledDeficit = Math.min(amount, this.capacity) * MS_PER_MINUTE - this.scaledLevel;
    return scaledDeficit <= 0 ? 0 : scaledDeficit / this.capacity;
  }

  msUntilFull(nowMs: number): number {
    this.refill(nowMs);
    return (this.capacity * MS_PER_MINUTE - this.scaledLevel) / this.capacity;
  }

  /** Takes `amount` (gives it back when negative); the level never rises above the capacity. */
  take(amount: number, nowMs: number): void {
    this.refill(nowMs);
    this.scaledLevel = Math.min(this.capacity * MS_PER_MINUTE, this.scaledLevel - amount * MS_PER_MINUTE);
  }

  private refill(nowMs: number) {
    const elapsedMs = Math.max(0, nowMs - this.lastRefillMs);
    this.scaledLevel = Math.min(this.capacity * MS_PER_MINUTE, this.scaledLevel + elapsedMs * this.capacity);
    this.lastRefillMs = nowMs;
  }
}

/** One caller's buckets and requests in flight: a key, or the anonymous caller of a server without keys. */
export class KeyQuota {
  /** How messages name the caller: the key's name, never the key. */
  readonly subject: string;
  readonly requests: TokenBucket | null;
  readonly tokens: TokenBucket | null;
  readonly maxConcurrentRequests: number | null;
  numInFlight = 0;

  constructor(subject: string, limits: KeyLimits, nowMs: number) {
    this.subject = subject;
    this.requests = limits.requestsPerMinute === undefined ? null : new TokenBucket(limits.requestsPerMinute, nowMs);
    this.tokens = limits.tokensPerMinute === undefined ? null : new TokenBucket(limits.tokensPerMinute, nowMs);
    this.maxConcurrentRequests = limits.maxConcurrentRequests ?? null;
  }

  get isLimited(): boolean {
    return this.requests !== null || this.tokens !== null || this.maxConcurrentRequests !== null;
  }
}

export interface Refusal {
  code: 'rate_limit_requests' | 'rate_limit_tokens' | 'server_overloaded';
  message: string;
  retryAfterMs: number;
}

/** Go's duration format, which OpenAI's x-ratelimit-reset-* headers use: `20ms`, `1s`, `1.5s`, `6m0s`. */
export function formatDuration(ms: number): string {
  const roundedMs = Math.ceil(ms);
  if (roundedMs === 0) return '0s';
  if (roundedMs < 1000) return `${roundedMs}ms`;
  const hours = Math.floor(roundedMs / 3_600_000);
  const minutes = Math.floor((roundedMs % 3_600_000) / 60_000);
  const seconds = `${(roundedMs % 60_000) / 1000}s`;
  if (hours > 0) return `${hours}h${minutes}m${seconds}`;
  return minutes > 0 ? `${minutes}m${seconds}` : seconds;
}

/**
 * A request let in: it holds its concurrency slots and its token estimate until end(). As a
 * UsageAccount it learns each generation's actual usage; whatever arrives, before or after
 * end(), the bucket ends up charged exactly that (nothing, if nothing was generated).
 */
export class Admission implements UsageAccount {
  private numChargedTokens: number;
  private numPromptTokens = 0;
  private numOutputTokens = 0;
  private hasUsage = false;
  private hasEnded = false;

  constructor(
    private readonly limiter: RateLimiter,
    private readonly quota: KeyQuota,
    numEstimatedTokens: number,
  ) {
    this.numChargedTokens = numEstimatedTokens;
  }

  /** Choices of one request share its prompt: it counts once. */
  settle(numPromptTokens: number, numOutputTokens: number): void {
    this.numPromptTokens = numPromptTokens;
    this.numOutputTokens += numOutputTokens;
    this.hasUsage = true;
    if (this.hasEnded) this.reconcile();
  }

  /** The response is over (sent, streamed to its end, or abandoned by the client). Idempotent. */
  end(): void {
    if (this.hasEnded) return;
    this.hasEnded = true;
    this.limiter.release(this.quota);
    this.reconcile();
  }

  private reconcile() {
    const numActualTokens = this.hasUsage ? this.numPromptTokens + this.numOutputTokens : 0;
    this.quota.tokens?.take(numActualTokens - this.numChargedTokens, this.limiter.nowMs());
    this.numChargedTokens = numActualTokens;
  }
}

export class RateLimiter {
  private numInFlight = 0;

  constructor(
    private readonly maxConcurrentRequests: number | null,
    readonly nowMs: () => number,
  ) {}

  /** Lets the request in, charging its quota, or says why not and for how long; the longest wait wins. */
  admit(quota: KeyQuota, numEstimatedTokens: number): Admission | Refusal {
    const nowMs = this.nowMs();
    const refusal = longerWait(
      longerWait(this.globalConcurrencyRefusal(), concurrencyRefusal(quota)),
      longerWait(
        bucketRefusal(quota.subject, quota.requests, 'requests', 1, nowMs),
        bucketRefusal(quota.subject, quota.tokens, 'tokens', numEstimatedTokens, nowMs),
      ),
    );
    if (refusal !== null) return refusal;
    this.numInFlight++;
    quota.numInFlight++;
    quota.requests?.take(1, nowMs);
    quota.tokens?.take(numEstimatedTokens, nowMs);
    return new Admission(this, quota, quota.tokens === null ? 0 : numEstimatedTokens);
  }

  private globalConcurrencyRefusal(): Refusal | null {
    if (this.maxConcurrentRequests === null || this.numInFlight < this.maxConcurrentRequests) return null;
    return {
      code: 'server_overloaded',
      message: `The server is at its limit of ${this.maxConcurrentRequests} concurrent requests. Please try again shortly.`,
      retryAfterMs: CONCURRENCY_RETRY_AFTER_MS,
    };
  }

  release(quota: KeyQuota): void {
    this.numInFlight--;
    quota.numInFlight--;
  }

  /** OpenAI's x-ratelimit-* headers for the quota's buckets, as they stand now. */
  headersOf(quota: KeyQuota): [string, string][] {
    const nowMs = this.nowMs();
    const headers: [string, string][] = [];
    if (quota.requests !== null) pushBucketHeaders(headers, quota.requests, 'requests', nowMs);
    if (quota.tokens !== null) pushBucketHeaders(headers, quota.tokens, 'tokens', nowMs);
    return headers;
  }
}

function pushBucketHeaders(headers: [string, string][], bucket: TokenBucket, quantity: 'requests' | 'tokens', nowMs: number) {
  headers.push(
    [`x-ratelimit-limit-${quantity}`, String(bucket.capacity)],
    [`x-ratelimit-remaining-${quantity}`, String(Math.max(0, Math.floor(bucket.levelAt(nowMs))))],
    [`x-ratelimit-reset-${quantity}`, formatDuration(bucket.msUntilFull(nowMs))],
  );
}

function longerWait(a: Refusal | null, b: Refusal | null): Refusal | null {
  if (a === null) return b;
  return b === null || a.retryAfterMs >= b.retryAfterMs ? a : b;
}

function concurrencyRefusal(quota: KeyQuota): Refusal | null {
  if (quota.maxConcurrentRequests === null || quota.numInFlight < quota.maxConcurrentRequests) return null;
  return {
    code: 'rate_limit_requests',
    message: `Too many concurrent requests for ${quota.subject}: limit ${quota.maxConcurrentRequests}. ` +
      'Please try again when one of them has finished.',
    retryAfterMs: CONCURRENCY_RETRY_AFTER_MS,
  };
}

/** OpenAI's wording: "Rate limit reached for ... on tokens per min (TPM): Limit 10000, Used 9800, Requested 500. ..." */
function bucketRefusal(
  subject: string,
  bucket: TokenBucket | null,
  quantity: 'requests' | 'tokens',
  numRequested: number,
  nowMs: number,
): Refusal | null {
  if (bucket === null) return null;
  const waitMs = bucket.msUntilAvailable(numRequested, nowMs);
  if (waitMs === 0) return null;
  const numUsed = Math.ceil(bucket.capacity - bucket.levelAt(nowMs));
  const label = quantity === 'requests' ? 'requests per min (RPM)' : 'tokens per min (TPM)';
  return {
    code: quantity === 'requests' ? 'rate_limit_requests' : 'rate_limit_tokens',
    message: `Rate limit reached for ${subject} on ${label}: Limit ${bucket.capacity}, Used ${numUsed}, ` +
      `Requested ${numRequested}. Please try again in ${formatDuration(waitMs)}.`,
    retryAfterMs: waitMs,
  };
}
