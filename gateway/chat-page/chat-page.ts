// GET /: a small chat page over the Responses API's WebSocket mode (index.html beside this
// file, no framework, no build step). Public: it asks for an API key itself when the server
// needs one, and sends it with each connection.
import { readFileSync } from 'node:fs';
import type { FastifyPluginAsync } from 'fastify';

const pageHtml = readFileSync(new URL('./index.html', import.meta.url), 'utf8');

export const chatPagePlugin: FastifyPluginAsync = async (app) => {
  app.get('/', async (_request, reply) =>
    reply.type('text/html; charset=utf-8').header('cache-control', 'no-cache').send(pageHtml),
  );
};
