// Admission: each authenticated request passes its caller's limits (rate-limits.ts) once its
// body is parsed, or is answered 429 with Retry-After. The limits are an AccessControl, which the
// KServe gRPC service shares, so a key's quota counts its calls on every protocol. A request let in holds its concurrency
// slots until its response is over, a stream to its end or until the client leaves. Every
// response of a limited caller carries OpenAI's x-ratelimit-* headers, and route handlers pass
// `request.account` on with their generations so the tokens charged become the tokens used.
// A WebSocket upgrade is not a request against the limits: each turn on it is, admitted by the
// connection through `request.admitTurn` (which also refuses turns unless the gateway is ready,
// and lets a drain wait for the turn) and holding its slot while the turn runs.
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { ApiKeyRing, isPublicRequest, type ApiKeySpec } from './auth.ts';
import { ApiError } from './errors.ts';
import type { UsageAccount } from './generation.ts';
import { Admission, KeyQuota, RateLimiter, type KeyLimits } from './rate-limits.ts';
import { notReadyError, type Readiness } from './readiness.ts';
import { refuse } from './refusal.ts';

declare module 'fastify' {
  interface FastifyRequest {
    /** Charged with the tokens the request's generations use; undefined when nothing is limited. */
    account: UsageAccount | undefined;
    /** On a WebSocket upgrade: admits one turn (its event and size), or says why not. */
    admitTurn: TurnAdmitter | null;
  }
}

export interface TurnAdmission {
  /** Charged with the turn's tokens; undefined when its caller has no limits. */
  account: UsageAccount | undefined;
  /** The turn is over: its slot is free, a drain stops waiting for it. Idempotent. */
  end(): void;
}

/** A refused turn is answered with the error. */
export type TurnAdmitter = (event: Record<string, unknown>, numEventBytes: number) => TurnAdmission | ApiError;

export interface AccessOptions {
  /** The keys clients must present; none: no auth, and every caller is one anonymous caller. */
  apiKeys: readonly ApiKeySpec[];
  /** The anonymous caller's limits, on a server without keys. */
  anonymousLimits?: KeyLimits;
  /** Requests in flight at once, over all callers. */
  maxConcurrentRequests?: number;
  /** The limits' clock in ms (tests drive it); performance.now by default. */
  nowMs?: () => number;
}

/** Prompt tokens are not known before tokenizing: OpenAI's rule of thumb is four bytes each. */
const BYTES_PER_TOKEN_ESTIMATE = 4;
/** The most choices the API accepts; a larger `n` is refused by validation, after admission. */
const MAX_CHOICES = 128;

function positiveIntegerOr(value: unknown, fallback: number): number {
  return typeof value === 'number' && Number.isSafeInteger(value) && value > 0 ? value : fallback;
}

/** What is known before tokenizing: the body's size for the prompt, plus the most output asked for. */
export function estimateTokens(body: unknown, numBodyBytes: number): number {
  const numPromptTokens = Math.ceil(numBodyBytes / BYTES_PER_TOKEN_ESTIMATE);
  if (typeof body !== 'object' || body === null) return numPromptTokens;
  const fields = body as Record<string, unknown>;
  const maxOutputTokens = positiveIntegerOr(fields.max_completion_tokens ?? fields.max_tokens ?? fields.max_output_tokens, 0);
  const numChoices = Math.min(positiveIntegerOr(fields.n, 1), MAX_CHOICES);
  return numPromptTokens + maxOutputTokens * numChoices;
}

/**
 * The keys and limits one server applies on every protocol: the key ring that authenticates and
 * one quota per key (and one for the anonymous caller), shared by HTTP, WebSocket and gRPC, so a
 * key's requests per minute and concurrency count wherever its requests come from.
 */
export class AccessControl {
  readonly ring: ApiKeyRing;
  private readonly quotas: Map<string, KeyQuota>;
  private readonly anonymousQuota: KeyQuota;
  /** Null when nothing is limited: requests are then admitted without bookkeeping. */
  private readonly limiter: RateLimiter | null;

  constructor(options: AccessOptions) {
    this.ring = new ApiKeyRing(options.apiKeys);
    const nowMs = options.nowMs ?? (() => performance.now());
    const startMs = nowMs();
    this.quotas = new Map(options.apiKeys.map((spec) => [spec.name, new KeyQuota(`key \`${spec.name}\``, spec.limits, startMs)]));
    this.anonymousQuota = new KeyQuota('this server', options.anonymousLimits ?? {}, startMs);
    const maxConcurrentRequests = options.maxConcurrentRequests ?? null;
    const isAnythingLimited =
      maxConcurrentRequests !== null || this.anonymousQuota.isLimited || [...this.quotas.values()].some((quota) => quota.isLimited);
    this.limiter = isAnythingLimited ? new RateLimiter(maxConcurrentRequests, nowMs) : null;
  }

  get isLimited(): boolean {
    return this.limiter !== null;
  }

  private quotaOf(apiKey: ApiKeySpec | null): KeyQuota {
    return apiKey === null ? this.anonymousQuota : this.quotas.get(apiKey.name)!;
  }

  /**
   * Admits one request of the caller (its tokens estimated before anyone tokenized), or says why
   * not as the catalogue error to answer (429) with how long to wait; null when nothing is limited.
   */
  admit(apiKey: ApiKeySpec | null, numEstimatedTokens: number): Admission | { error: ApiError; retryAfterMs: number } | null {
    if (this.limiter === null) return null;
    const outcome = this.limiter.admit(this.quotaOf(apiKey), numEstimatedTokens);
    if (!('code' in outcome)) return outcome;
    return { error: new ApiError(outcome.code, outcome.message), retryAfterMs: outcome.retryAfterMs };
  }

  /** OpenAI's x-ratelimit-* headers of the caller's quota as it stands. */
  headersOf(apiKey: ApiKeySpec | null): [string, string][] {
    return this.limiter === null ? [] : this.limiter.headersOf(this.quotaOf(apiKey));
  }
}

export function installAdmission(app: FastifyInstance, access: AccessControl, readiness: Readiness): void {
  app.decorateRequest('account', undefined);
  app.decorateRequest('admitTurn', null);

  const logRefusal = (request: FastifyRequest, error: ApiError) => {
    request.log.info({ code: error.code, apiKey: request.apiKey?.name }, 'request refused');
    return error;
  };

  const turnAdmitterOf = (request: FastifyRequest): TurnAdmitter => (event, numEventBytes) => {
    const { state } = readiness;
    if (state !== 'ready') return notReadyError(state);
    const admission = access.admit(request.apiKey, estimateTokens(event, numEventBytes));
    if (admission !== null && !(admission instanceof Admission)) return logRefusal(request, admission.error);
    const leave = readiness.begin();
    return {
      account: admission ?? undefined,
      end() {
        admission?.end();
        leave();
      },
    };
  };

  app.addHook('preHandler', async (request, reply) => {
    if (request.ws) {
      request.admitTurn = turnAdmitterOf(request);
      return;
    }
    if (!access.isLimited || isPublicRequest(request)) return;
    const numBodyBytes = positiveIntegerOr(Number(request.headers['content-length']), 0);
    const outcome = access.admit(request.apiKey, estimateTokens(request.body, numBodyBytes))!;
    const raw = reply.raw;
    for (const [name, value] of access.headersOf(request.apiKey)) raw.setHeader(name, value);
    if (!(outcome instanceof Admission)) {
      return refuse(request, reply, logRefusal(request, outcome.error), {
        'retry-after': String(Math.max(1, Math.ceil(outcome.retryAfterMs / 1000))),
        'retry-after-ms': String(Math.ceil(outcome.retryAfterMs)),
      });
    }
    request.account = outcome;
    raw.once('close', () => outcome.end());
    // The client may have left while its body was read, before the listener existed.
    if (raw.socket === null || raw.socket.destroyed) outcome.end();
  });
}
