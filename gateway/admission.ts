// Admission: each authenticated request passes its caller's limits (rate-limits.ts) once its
// body is parsed, or is answered 429 with Retry-After. A request let in holds its concurrency
// slots until its response is over, a stream to its end or until the client leaves. Every
// response of a limited caller carries OpenAI's x-ratelimit-* headers, and route handlers pass
// `request.account` on with their generations so the tokens charged become the tokens used.
// A WebSocket upgrade is not a request against the limits: each turn on it is, admitted by the
// connection through `request.admitTurn` (which also refuses turns unless the gateway is ready,
// and lets a drain wait for the turn) and holding its slot while the turn runs.
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { isPublicRequest, type ApiKeySpec } from './auth.ts';
import { ApiError } from './errors.ts';
import type { UsageAccount } from './generation.ts';
import { type Admission, KeyQuota, RateLimiter, type KeyLimits, type Refusal } from './rate-limits.ts';
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
function estimateTokens(body: unknown, numBodyBytes: number): number {
  const numPromptTokens = Math.ceil(numBodyBytes / BYTES_PER_TOKEN_ESTIMATE);
  if (typeof body !== 'object' || body === null) return numPromptTokens;
  const fields = body as Record<string, unknown>;
  const maxOutputTokens = positiveIntegerOr(fields.max_completion_tokens ?? fields.max_tokens ?? fields.max_output_tokens, 0);
  const numChoices = Math.min(positiveIntegerOr(fields.n, 1), MAX_CHOICES);
  return numPromptTokens + maxOutputTokens * numChoices;
}

export function installAdmission(app: FastifyInstance, options: AccessOptions, readiness: Readiness): void {
  app.decorateRequest('account', undefined);
  app.decorateRequest('admitTurn', null);
  const nowMs = options.nowMs ?? (() => performance.now());
  const startMs = nowMs();
  const quotas = new Map(options.apiKeys.map((spec) => [spec.name, new KeyQuota(`key \`${spec.name}\``, spec.limits, startMs)]));
  const anonymousQuota = new KeyQuota('this server', options.anonymousLimits ?? {}, startMs);
  const maxConcurrentRequests = options.maxConcurrentRequests ?? null;
  const isAnythingLimited =
    maxConcurrentRequests !== null || anonymousQuota.isLimited || [...quotas.values()].some((quota) => quota.isLimited);
  const limiter = isAnythingLimited ? new RateLimiter(maxConcurrentRequests, nowMs) : null;

  const quotaOf = (request: FastifyRequest) => (request.apiKey === null ? anonymousQuota : quotas.get(request.apiKey.name)!);
  const refusalError = (request: FastifyRequest, refusal: Refusal) => {
    const error = new ApiError(refusal.code, refusal.message);
    request.log.info({ code: error.code, apiKey: request.apiKey?.name }, 'request refused');
    return error;
  };

  const turnAdmitterOf = (request: FastifyRequest): TurnAdmitter => (event, numEventBytes) => {
    const { state } = readiness;
    if (state !== 'ready') return notReadyError(state);
    let admission: Admission | null = null;
    if (limiter !== null) {
      const outcome = limiter.admit(quotaOf(request), estimateTokens(event, numEventBytes));
      if ('code' in outcome) return refusalError(request, outcome);
      admission = outcome;
    }
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
    if (limiter === null || isPublicRequest(request)) return;
    const quota = quotaOf(request);
    const numBodyBytes = positiveIntegerOr(Number(request.headers['content-length']), 0);
    const outcome = limiter.admit(quota, estimateTokens(request.body, numBodyBytes));
    const raw = reply.raw;
    for (const [name, value] of limiter.headersOf(quota)) raw.setHeader(name, value);
    if ('code' in outcome) {
      return refuse(request, reply, refusalError(request, outcome), {
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
