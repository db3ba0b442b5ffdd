// GET /: a small chat page over the Responses API's WebSocket mode (index.html beside this
// file's source, where the compiled server reads it too; no framework, no build step). Public: it asks for an API key itself when the server
// needs one, and sends it with each connection.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import type { FastifyPluginAsync } from 'fastify';
import { packageRoot } from '../../package-root.ts';

const pageHtml = readFileSync(path.join(packageRoot, 'gateway', 'chat-page', 'index.html'), 'utf8');

export const chatPagePlugin: FastifyPluginAsync = async (app) => {
  app.get('/', async (_request, reply) =>
    reply.type('text/html; charset=utf-8').header('cache-control', 'no-cache').send(pageHtml),
  );
};
