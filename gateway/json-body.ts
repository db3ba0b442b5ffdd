// The one body parser: every body is JSON, whatever its content-type says (curl -d sends
// application/x-www-form-urlencoded, and OpenAI parses it anyway). The bytes must be valid UTF-8
// (fastify's default parser would silently turn bad bytes into U+FFFD) and valid JSON; each
// failure is a catalogue error.
import type { FastifyInstance } from 'fastify';
import { ApiError } from './errors.ts';

const strictUtf8 = new TextDecoder('utf-8', { fatal: true });

export function installJsonBodyParser(app: FastifyInstance) {
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', { parseAs: 'buffer' }, (_request, body, done) => {
    let text: string;
    try {
      text = strictUtf8.decode(body as Buffer);
    } catch {
      done(new ApiError('invalid_utf8', 'The request body is not valid UTF-8.'), undefined);
      return;
    }
    try {
      done(null, JSON.parse(text));
    } catch (err) {
      done(new ApiError('invalid_json', `The request body is not valid JSON: ${(err as Error).message}`), undefined);
    }
  });
}
