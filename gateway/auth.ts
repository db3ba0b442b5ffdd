// API keys, checked the same way on every protocol. A key arrives as `Authorization: Bearer
// <key>` (what OpenAI's SDKs send, on HTTP requests and WebSocket upgrades alike, and what
// Triton's clients send as gRPC metadata) or, from browsers, whose WebSocket API cannot set
// headers, as the subprotocol offer `openai-insecure-api-key.<key>`. Keys are compared in
// constant time: the sha256 digest of the key presented against that of every key configured,
// all of them every time, so neither the key's bytes nor its length show in the timing.
// `/health` and `GET /` (the chat page, which authenticates over its WebSocket) are public.
// Administrative surfaces (repository load/unload, shared memory, trace and log settings) take
// only keys whose role is `admin`, when the server has keys.
import { createHash, timingSafeEqual } from 'node:crypto';
import type { IncomingHttpHeaders } from 'node:http';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { ApiError } from './errors.ts';
import type { KeyLimits } from './rate-limits.ts';
import { refuse } from './refusal.ts';

export type KeyRole = 'user' | 'admin';

export interface ApiKeySpec {
  /** How logs and messages name the key; never the key itself. */
  name: string;
  key: string;
  /** `user` when omitted: the APIs, not the administrative surfaces. */
  role?: KeyRole;
  limits: KeyLimits;
}

declare module 'fastify' {
  interface FastifyRequest {
    /** The key the request presented; null on public routes and on a server without keys. */
    apiKey: ApiKeySpec | null;
  }
}

const BROWSER_KEY_PROTOCOL_PREFIX = 'openai-insecure-api-key.';

function digestOf(key: string): Buffer {
  return createHash('sha256').update(key).digest();
}

const missingKeyMessage =
  "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth " +
  '(i.e. Authorization: Bearer YOUR_KEY).';
// OpenAI's message quotes part of the key; this one quotes none of it.
const incorrectKeyMessage = 'Incorrect API key provided.';

export class ApiKeyRing {
  private readonly entries: { digest: Buffer; spec: ApiKeySpec }[];

  constructor(specs: readonly ApiKeySpec[]) {
    const names = new Set(specs.map((spec) => spec.name));
    const keys = new Set(specs.map((spec) => spec.key));
    if (names.size !== specs.length || keys.size !== specs.length) throw new Error('API key names and keys must be unique');
    this.entries = specs.map((spec) => ({ digest: digestOf(spec.key), spec }));
  }

  get size(): number {
    return this.entries.length;
  }

  /**
   * The one check every protocol makes. Null on a server without keys (anyone may call);
   * otherwise the key presented, or an `invalid_api_key` error when it is missing or unknown.
   */
  authenticate(presentedKey: string | null): ApiKeySpec | null | ApiError {
    if (this.entries.length === 0) return null;
    const apiKey = presentedKey === null ? null : this.find(presentedKey);
    if (apiKey !== null) return apiKey;
    return new ApiError('invalid_api_key', presentedKey === null ? missingKeyMessage : incorrectKeyMessage);
  }

  find(presentedKey: string): ApiKeySpec | null {
    const digest = digestOf(presentedKey);
    let found: ApiKeySpec | null = null;
    // No early exit: which key matched, if any, must not show in the timing.
    for (const entry of this.entries) {
      if (timingSafeEqual(digest, entry.digest)) found = entry.spec;
    }
    return found;
  }
}

/** Routes anyone may call: the liveness probe and the chat page. */
export function isPublicRequest(request: FastifyRequest): boolean {
  if (request.method !== 'GET' && request.method !== 'HEAD') return false;
  const queryStart = request.url.indexOf('?');
  const path = queryStart === -1 ? request.url : request.url.slice(0, queryStart);
  return path === '/' || path === '/health';
}

/** The key of an `Authorization: Bearer <key>` header (or gRPC metadata); null when absent or malformed. */
export function bearerKeyOf(authorization: string | undefined): string | null {
  if (authorization === undefined) return null;
  const match = /^Bearer[ \t]+(\S+)[ \t]*$/i.exec(authorization);
  return match === null ? null : match[1];
}

/**
 * Takes every `openai-insecure-api-key.` offer out of Sec-WebSocket-Protocol, so the upgrade
 * selects one of the other offered subprotocols (or none) and never echoes a key; returns the
 * first key offered.
 */
function takeSubprotocolKey(headers: IncomingHttpHeaders): string | null {
  const offer = headers['sec-websocket-protocol'];
  if (offer === undefined || !offer.includes(BROWSER_KEY_PROTOCOL_PREFIX)) return null;
  let key: string | null = null;
  const kept: string[] = [];
  for (const item of offer.split(',')) {
    const protocol = item.trim();
    if (protocol.startsWith(BROWSER_KEY_PROTOCOL_PREFIX)) key ??= protocol.slice(BROWSER_KEY_PROTOCOL_PREFIX.length);
    else if (protocol !== '') kept.push(protocol);
  }
  if (kept.length === 0) delete headers['sec-websocket-protocol'];
  else headers['sec-websocket-protocol'] = kept.join(', ');
  return key;
}

/**
 * ws's handleProtocols: the first offered subprotocol that is not a key, or none. The onRequest
 * hook has already taken the key offers out; this keeps a key from ever being selected even so.
 */
export function selectSubprotocol(protocols: Set<string>): string | false {
  for (const protocol of protocols) if (!protocol.startsWith(BROWSER_KEY_PROTOCOL_PREFIX)) return protocol;
  return false;
}


/**
 * Null when the caller may use an administrative surface: a server without keys (apiKey null
 * after authenticate), or an admin key. Otherwise the 403 `permission_denied` to answer.
 */
export function adminRefusal(apiKey: ApiKeySpec | null, surface: string): ApiError | null {
  if (apiKey === null || apiKey.role === 'admin') return null;
  return new ApiError(
    'permission_denied',
    `The API key \`${apiKey.name}\` may not use ${surface}: that needs a key whose role is admin (server.api_keys).`,
  );
}

/** Without keys every request passes (and apiKey stays null); with keys, a non-public request needs one of them. */
export function installAuth(app: FastifyInstance, ring: ApiKeyRing): void {
  app.decorateRequest('apiKey', null);
  app.addHook('onRequest', async (request, reply) => {
    // Even without keys: a browser's key must never come back as the selected subprotocol.
    const offeredKey = takeSubprotocolKey(request.headers);
    if (ring.size === 0 || isPublicRequest(request)) return;
    const presentedKey = bearerKeyOf(request.headers.authorization) ?? offeredKey;
    const apiKey = ring.authenticate(presentedKey);
    if (apiKey instanceof ApiError) {
      request.log.info({ code: apiKey.code, keyPresented: presentedKey !== null }, 'request refused');
      return refuse(request, reply, apiKey, { 'www-authenticate': 'Bearer' });
    }
    request.apiKey = apiKey;
  });
}

/** A route hook for an administrative surface (HTTP): 403 unless adminRefusal lets the caller in. */
export function adminOnly(surface: string) {
  return async (request: FastifyRequest, reply: FastifyReply) => {
    const error = adminRefusal(request.apiKey, surface);
    if (error === null) return;
    request.log.info({ code: error.code, apiKey: request.apiKey?.name }, 'request refused');
    return refuse(request, reply, error);
  };
}
