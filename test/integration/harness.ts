// Starts the real server (gateway in this process, engine workers as child processes) on
// free loopback ports, for integration tests.
import path from 'node:path';
import OpenAI from 'openai';
import { fileURLToPath } from 'node:url';
import { validateConfig } from '../../configs/schema.ts';
import { serve, type RunningServer } from '../../bin/serve.ts';
import { WAIT_BOUND_MS } from '../wait.ts';

export { WAIT_BOUND_MS, within } from '../wait.ts';

export const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const defaultModelDir = path.join(repoRoot, 'models', 'conduit-tiny');

/** router: the configuration's `router:` section (defaults without it). */
export async function startServer(models: Record<string, unknown>[], router?: Record<string, unknown>): Promise<RunningServer> {
  const config = validateConfig(
    { server: { host: '127.0.0.1', http_port: 0, metrics_port: 0 }, ...(router === undefined ? {} : { router }), models },
    path.join(repoRoot, 'test', 'integration', 'inline.yaml'),
  );
  return serve(config);
}

/** The official client on a base URL, each request bounded by WAIT_BOUND_MS and never retried. */
export function openaiClient(baseURL: string): OpenAI {
  return new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: WAIT_BOUND_MS });
}

/** fetch, aborted after WAIT_BOUND_MS. */
export function boundedFetch(url: string, init: RequestInit = {}): Promise<Response> {
  return fetch(url, { ...init, signal: AbortSignal.timeout(WAIT_BOUND_MS) });
}
