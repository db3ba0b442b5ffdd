// The one body parser: every body is JSON, whatever its content-type says (curl -d sends
// application/x-www-form-urlencoded, and OpenAI parses it anyway). The bytes must be valid UTF-8
// (fastify's default parser would silently turn bad bytes into U+FFFD) and valid JSON; each
// failure is a catalogue error. A large body is decoded and parsed in a worker thread: measured
// on this machine, 8 MiB take 40-100 ms on the loop (UTF-8 to string, then JSON.parse; 1.4 s for
// brackets nested 4 million deep), while the parsed value comes back in 4-8 ms when it is mostly
// strings.
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { ApiError } from './errors.ts';
import type { OffloadPool } from './offload/pool.ts';

/** Parsed on the loop up to this: at most a few milliseconds, however the JSON is shaped. */
export const MAX_INLINE_BODY_BYTES = 64 * 1024;
/**
 * Objects and arrays a body may hold. Bringing a parsed value back from a thread costs about a
 * microsecond per object (250,000 small ones: 210 ms on the loop), strings next to nothing:
 * this keeps that under 30 ms, and is far above any real request (a chat of thousands of turns).
 * A body small enough to parse on the loop cannot hold many more.
 */
export const MAX_JSON_CONTAINERS = 32_768;

const strictUtf8 = new TextDecoder('utf-8', { fatal: true });

function decodeJsonBody(bytes: Uint8Array): unknown {
  let text: string;
  try {
    text = strictUtf8.decode(bytes);
  } catch {
    throw new ApiError('invalid_utf8', 'The request body is not valid UTF-8.');
  }
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new ApiError('invalid_json', `The request body is not valid JSON: ${(err as Error).message}`);
  }
}

/**
 * How deep objects and arrays may nest: far deeper than any real request (a JSON schema in
 * response_format nests a few dozen levels), and shallow enough for every recursive walk a
 * parsed body meets (validation, structured clone from a thread, which overflows its stack
 * some ten thousand levels down).
 */
export const MAX_JSON_DEPTH = 128;

/** Counts objects and arrays and their depth without recursion (a body may nest millions deep). */
export function checkJsonShape(value: unknown) {
  const pending: unknown[] = [value];
  const depths: number[] = [1];
  let numContainers = 0;
  while (pending.length > 0) {
    const item = pending.pop();
    const depth = depths.pop()!;
    if (item === null || typeof item !== 'object') continue;
    if (++numContainers > MAX_JSON_CONTAINERS) {
      throw new ApiError('invalid_request', `The request body holds more than ${MAX_JSON_CONTAINERS} JSON objects and arrays.`);
    }
    if (depth > MAX_JSON_DEPTH) throw depthError();
    for (const child of Array.isArray(item) ? item : Object.values(item)) {
      if (child !== null && typeof child === 'object') {
        pending.push(child);
        depths.push(depth + 1);
      }
    }
  }
}

const OPEN_BRACKET = 0x5b;
const OPEN_BRACE = 0x7b;
const CLOSE_BRACKET = 0x5d;
const CLOSE_BRACE = 0x7d;
const QUOTE = 0x22;
const BACKSLASH = 0x5c;

/**
 * Refuses bytes nested past MAX_JSON_DEPTH before JSON.parse builds them: a byte scan (brackets
 * outside strings) costs a few milliseconds for 8 MiB, where parsing millions of nested arrays
 * first took seconds of a thread and hundreds of megabytes.
 */
function checkNestingDepth(bytes: Uint8Array) {
  let depth = 0;
  let isInString = false;
  for (let i = 0; i < bytes.length; i++) {
    const byte = bytes[i];
    if (isInString) {
      if (byte === BACKSLASH) i++;
      else if (byte === QUOTE) isInString = false;
    } else if (byte === QUOTE) {
      isInString = true;
    } else if (byte === OPEN_BRACKET || byte === OPEN_BRACE) {
      if (++depth > MAX_JSON_DEPTH) throw depthError();
    } else if (byte === CLOSE_BRACKET || byte === CLOSE_BRACE) {
      depth--;
    }
  }
}

function depthError(): ApiError {
  return new ApiError('invalid_request', `The request body nests JSON objects and arrays more than ${MAX_JSON_DEPTH} deep.`);
}

/** The body's value, checked: nesting, valid UTF-8, valid JSON, and a shape every later step can walk. */
export function parseJsonBody(bytes: Uint8Array): unknown {
  checkNestingDepth(bytes);
  const value = decodeJsonBody(bytes);
  checkJsonShape(value);
  return value;
}

/**
 * The value of JSON bytes, parsed where it costs the loop least: on it up to
 * MAX_INLINE_BODY_BYTES, in a pool thread above (dropped unrun once the client is gone). Every
 * body with JSON goes through here, /v1's and /v2's alike. With mayTake, bytes that own their
 * buffer move to the thread uncopied, and must not be used after; otherwise a copy moves.
 */
export function parseJsonBytes(bytes: Uint8Array, pool: OffloadPool, request: FastifyRequest, mayTake = true): Promise<unknown> | unknown {
  if (bytes.length <= MAX_INLINE_BODY_BYTES) return parseJsonBody(bytes);
  const ownsBuffer = bytes.byteOffset === 0 && bytes.byteLength === bytes.buffer.byteLength;
  const own = mayTake && ownsBuffer ? bytes : new Uint8Array(bytes);
  const socket = request.raw.socket;
  return pool.run({ kind: 'parseJson', bytes: own }, { isWanted: () => !socket.destroyed, transfer: [own.buffer as ArrayBuffer] });
}

export function installJsonBodyParser(app: FastifyInstance, pool: OffloadPool) {
  app.removeAllContentTypeParsers();
  // The parsed value replaces the bytes, so the body's buffer may move to the thread.
  app.addContentTypeParser('*', { parseAs: 'buffer' }, async (request: FastifyRequest, body: Buffer) => parseJsonBytes(body, pool, request));
}
