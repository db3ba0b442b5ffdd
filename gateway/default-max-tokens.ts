// A checkpoint's default output length: `max_new_tokens` in its generation_config.json, which
// vLLM's OpenAI server applies to every request that sets no limit of its own. The gateway reads
// it itself (it resolves every request's max_tokens before the engine sees it) rather than
// import the engine's reader of the same file: the engine's internals are not the gateway's.
import { readFileSync } from 'node:fs';
import path from 'node:path';

/** Null when the checkpoint names none (no file, no field, or not a positive integer). */
export function readDefaultMaxTokens(modelDir: string): number | null {
  let json: unknown;
  try {
    json = JSON.parse(readFileSync(path.join(modelDir, 'generation_config.json'), 'utf8'));
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw new Error(`${path.join(modelDir, 'generation_config.json')}: ${(err as Error).message}`);
  }
  const value = (json as Record<string, unknown> | null)?.max_new_tokens;
  return Number.isSafeInteger(value) && (value as number) > 0 ? (value as number) : null;
}
