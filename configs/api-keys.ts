// The API keys a server accepts: `server.api_keys`, the file `server.api_keys_file` and the
// environment variable CONDUIT_API_KEYS (comma-separated), all together. Keys from the file and
// the environment have `server.key_limits`; a list entry may set its own. Every error names where
// the key came from, never the key.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { apiKeyString, ConfigError, type KeyLimitsConfig, type KeyRole, type ServerConfig } from './schema.ts';

export const API_KEYS_ENV = 'CONDUIT_API_KEYS';

export interface KeyLimits {
  requestsPerMinute?: number;
  tokensPerMinute?: number;
  maxConcurrentRequests?: number;
}

export interface ApiKey {
  /** Where the key came from (`api_keys[0]`, `keys.txt:3`, `CONDUIT_API_KEYS[1]`) unless named; clients see it in 429s. */
  name: string;
  key: string;
  /** `admin` may use the administrative surfaces too; keys of the file and the environment are `user`. */
  role: KeyRole;
  limits: KeyLimits;
}

export function keyLimitsOf(limits: KeyLimitsConfig): KeyLimits {
  return {
    requestsPerMinute: limits.requests_per_minute,
    tokensPerMinute: limits.tokens_per_minute,
    maxConcurrentRequests: limits.max_concurrent_requests,
  };
}

function checkedKey(key: string, source: string): string {
  if (!apiKeyString.safeParse(key).success) throw new ConfigError(`${source}: an API key is printable ASCII without spaces`);
  return key;
}

function keysOfFile(file: string): { source: string; key: string }[] {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    throw new ConfigError(`${file}: cannot read: ${(err as Error).message}`);
  }
  return text.split('\n').flatMap((line, index) => {
    const key = line.trim();
    if (key === '' || key.startsWith('#')) return [];
    // The name clients may see, so the file's name without its folders.
    const source = `${path.basename(file)}:${index + 1}`;
    return [{ source, key: checkedKey(key, `${file}:${index + 1}`) }];
  });
}

function keysOfEnv(value: string | undefined): { source: string; key: string }[] {
  if (value === undefined || value.trim() === '') return [];
  return value.split(',').map((item, index) => {
    const source = `${API_KEYS_ENV}[${index}]`;
    return { source, key: checkedKey(item.trim(), source) };
  });
}

export function resolveApiKeys(server: ServerConfig, env: Record<string, string | undefined> = process.env): ApiKey[] {
  const defaults = keyLimitsOf(server.key_limits);
  const keys: ApiKey[] = server.api_keys.map((entry, index) => ({
    name: entry.name ?? `api_keys[${index}]`,
    key: entry.key,
    role: entry.role,
    limits: {
      requestsPerMinute: entry.requests_per_minute ?? defaults.requestsPerMinute,
      tokensPerMinute: entry.tokens_per_minute ?? defaults.tokensPerMinute,
      maxConcurrentRequests: entry.max_concurrent_requests ?? defaults.maxConcurrentRequests,
    },
  }));
  const fileKeys = server.api_keys_file === undefined ? [] : keysOfFile(server.api_keys_file);
  for (const { source, key } of [...fileKeys, ...keysOfEnv(env[API_KEYS_ENV])]) {
    keys.push({ name: source, key, role: 'user', limits: defaults });
  }
  const nameByKey = new Map<string, string>();
  const names = new Set<string>();
  for (const { name, key } of keys) {
    const sameKeyName = nameByKey.get(key);
    if (sameKeyName !== undefined) throw new ConfigError(`${name}: the same API key as ${sameKeyName}`);
    if (names.has(name)) throw new ConfigError(`${name}: two API keys have this name`);
    nameByKey.set(key, name);
    names.add(name);
  }
  return keys;
}
