// Compressed request bodies (Content-Encoding: gzip or deflate, as Triton's clients send them)
// are inflated as a stream on the way in: zlib runs in libuv's thread pool, so the event loop
// never inflates, and the bytes counted against the body limit are the decompressed ones, so a
// small body that expands to gigabytes (a "zip bomb") stops at the limit: 413, with the
// decompressor destroyed at once rather than left to inflate the rest.
import { Transform } from 'node:stream';
import { createGunzip, createInflate, type Gunzip, type Inflate } from 'node:zlib';
import type { FastifyInstance } from 'fastify';
import { ApiError } from './errors.ts';

/** What fastify reads off the stream a preParsing hook returns: the body's bytes as sent, for Content-Length. */
interface DecodedBody extends Transform {
  receivedEncodedLength: number;
}

function decompressorFor(encoding: string): Gunzip | Inflate | null {
  if (encoding === 'gzip' || encoding === 'x-gzip') return createGunzip();
  if (encoding === 'deflate') return createInflate();
  return null;
}

export function installBodyDecompression(app: FastifyInstance, bodyLimitBytes: number): void {
  app.addHook('preParsing', async (request, _reply, payload) => {
    const encoding = request.headers['content-encoding']?.trim().toLowerCase();
    if (encoding === undefined || encoding === '' || encoding === 'identity') return payload;
    const decompressor = decompressorFor(encoding);
    if (decompressor === null) {
      throw new ApiError('unsupported_content_encoding', `Content-Encoding '${encoding.slice(0, 64)}' is not supported; send gzip, deflate or identity.`);
    }
    let numDecodedBytes = 0;
    const decoded = new Transform({
      transform(chunk: Buffer, _encoding, callback) {
        numDecodedBytes += chunk.byteLength;
        if (numDecodedBytes > bodyLimitBytes) {
          callback(new ApiError('body_too_large', `The request body is larger than the ${bodyLimitBytes}-byte limit once decompressed.`));
          return;
        }
        callback(null, chunk);
      },
    }) as DecodedBody;
    decoded.receivedEncodedLength = 0;
    payload.on('data', (chunk: Buffer) => {
      decoded.receivedEncodedLength += chunk.byteLength;
    });
    decompressor.on('error', (err) => decoded.destroy(new ApiError('invalid_request', `The request body is not valid ${encoding}: ${err.message}.`)));
    // Past the limit (or a broken body) nothing more is inflated; the request's own stream is left to its server.
    decoded.on('error', () => {
      payload.unpipe(decompressor);
      decompressor.destroy();
    });
    payload.pipe(decompressor).pipe(decoded);
    return decoded;
  });
}
