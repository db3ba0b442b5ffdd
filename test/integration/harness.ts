// Starts the real server (gateway in this process, engine workers as child processes) on
// free loopback ports, for integration tests.
import path from 'node:path';
import OpenAI from 'openai';
import { fileURLToPath } from 'node:url';
import { validateConfig } from '../../configs/schema.ts';
import { serve, type RunningServer } from '../../bin/serve.ts';

export const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const defaultModelDir = path.join(repoRoot, 'models', 'conduit-tiny');

export async function startServer(models: Record<string, unknown>[]): Promise<RunningServer> {
  const config = validateConfig(
    { server: { host: '127.0.0.1', http_port: 0, metrics_port: 0 }, models },
    path.join(repoRoot, 'test', 'integration', 'inline.yaml'),
  );
  return serve(config);
}

/** The most any one request, exit or wait of an integration test may take: a hang fails here, not at the suite's timeout. */
export const WAIT_BOUND_MS = 30_000;

/** The official client on a base URL, each request bounded by WAIT_BOUND_MS and never retried. */
export function openaiClient(baseURL: string): OpenAI {
  return new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: WAIT_BOUND_MS });
}

/** fetch, aborted after WAIT_BOUND_MS. */
export function boundedFetch(url: string, init: RequestInit = {}): Promise<Response> {
  return fetch(url, { ...init, signal: AbortSignal.timeout(WAIT_BOUND_MS) });
}

/** The promise's value, or a rejection naming what did not happen within WAIT_BOUND_MS. */
export function within<T>(promise: Promise<T>, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const bound = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not within ${WAIT_BOUND_MS} ms`)), WAIT_BOUND_MS);
  });
  return Promise.race([promise, bound]).finally(() => clearTimeout(timer));
}
