// A /v2 request's body, read as every body is (gateway/body-decoding.ts inflates it, json-body.ts
// parses its JSON with the same bounds, off the loop when large), and a /v2 answer, gzip-compressed
// when the client accepts it. One module for the plugin's routes, the control routes and generate.
import { promisify } from 'node:util';
import { gzip } from 'node:zlib';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { ClassicError } from '../../triton/index.ts';
import { parseJsonBytes } from '../json-body.ts';
import type { OffloadPool } from '../offload/pool.ts';

/**
 * A /v2 body: its bytes (decompressed already, gateway/body-decoding.ts) and its JSON, parsed as
 * /v1's are (same bounds, off the loop when large): the whole body's, or with the binary
 * extension the header's (Inference-Header-Content-Length), or none for an empty body or a raw
 * binary request.
 */
export interface KServeBody {
  bytes: Buffer;
  json: unknown;
}

const gzipAsync = promisify(gzip);

/** The binary extension's JSON length, when the request says one (checked by the infer route). */
function headerLengthOf(request: FastifyRequest): number | null {
  const value = request.headers['inference-header-content-length'];
  return value !== undefined && /^\d+$/.test(String(value)) ? Number(value) : null;
}

export async function parseKServeBody(request: FastifyRequest, bytes: Buffer, pool: OffloadPool): Promise<KServeBody> {
  const headerLength = request.headers['inference-header-content-length'] === undefined ? bytes.byteLength : headerLengthOf(request);
  // A raw binary request (0), a header length the infer route refuses, or nothing at all: no JSON.
  if (headerLength === null || headerLength === 0 || headerLength > bytes.byteLength) return { bytes, json: undefined };
  // The bytes stay the request's (the infer route reads them): a large JSON part moves to the thread as a copy.
  return { bytes, json: await parseJsonBytes(bytes.subarray(0, headerLength), pool, request, false) };
}

export function bodyOf(request: FastifyRequest): KServeBody {
  return (request.body as KServeBody | undefined) ?? { bytes: Buffer.alloc(0), json: undefined };
}

export function jsonBody(request: FastifyRequest): Record<string, unknown> {
  const parsed = bodyOf(request).json;
  if (parsed === undefined) return {};
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) throw new ClassicError('INVALID_ARG', 'the request body must be a JSON object');
  return parsed as Record<string, unknown>;
}

/** Sends JSON (or bytes), gzip-compressed (off the loop) when the client accepts it, as Triton does. */
export async function send(request: FastifyRequest, reply: FastifyReply, body: Buffer | string, contentType: string) {
  const accept = request.headers['accept-encoding'] ?? '';
  reply.header('content-type', contentType);
  if (/\bgzip\b/.test(accept)) return reply.header('content-encoding', 'gzip').send(await gzipAsync(body));
  return reply.send(body);
}
