// Where API keys come from (server.api_keys, server.api_keys_file, CONDUIT_API_KEYS), their limits,
// and errors that say where a bad key is without quoting it.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';
import { resolveApiKeys } from './api-keys.ts';
import { ConfigError, validateConfig } from './schema.ts';

test('no keys anywhere: an empty list (no auth); limits default to none', () => {
  const { server } = validateConfig({ models: [{ path: 'm' }] }, 'k.yaml');
  assert.deepEqual(resolveApiKeys(server, {}), []);
  assert.deepEqual(server.key_limits, {});
  assert.equal(server.max_concurrent_requests, undefined);
  assert.equal(server.drain_timeout_s, 30);
});

test('keys from the list, the file and the environment, each with its limits', () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-keys-'));
  try {
    writeFileSync(path.join(dir, 'keys.txt'), '# team keys\n\nsk-file-one\n  sk-file-two  \n');
    const { server } = validateConfig(
      {
        server: {
          api_keys: ['sk-bare', { key: 'sk-named', name: 'ci', requests_per_minute: 5 }, { key: 'sk-ops', name: 'ops', role: 'admin' }],
          api_keys_file: 'keys.txt',
          key_limits: { requests_per_minute: 60, tokens_per_minute: 10_000, max_concurrent_requests: 4 },
        },
        models: [{ path: 'm' }],
      },
      path.join(dir, 'conduit.yaml'),
    );
    assert.equal(server.api_keys_file, path.join(dir, 'keys.txt'));
    const keys = resolveApiKeys(server, { CONDUIT_API_KEYS: 'sk-env-a, sk-env-b' });
    const defaults = { requestsPerMinute: 60, tokensPerMinute: 10_000, maxConcurrentRequests: 4 };
    assert.deepEqual(keys, [
      { name: 'api_keys[0]', key: 'sk-bare', role: 'user', limits: defaults },
      { name: 'ci', key: 'sk-named', role: 'user', limits: { ...defaults, requestsPerMinute: 5 } },
      { name: 'ops', key: 'sk-ops', role: 'admin', limits: defaults },
      { name: 'keys.txt:3', key: 'sk-file-one', role: 'user', limits: defaults },
      { name: 'keys.txt:4', key: 'sk-file-two', role: 'user', limits: defaults },
      { name: 'CONDUIT_API_KEYS[0]', key: 'sk-env-a', role: 'user', limits: defaults },
      { name: 'CONDUIT_API_KEYS[1]', key: 'sk-env-b', role: 'user', limits: defaults },
    ]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('bad keys are refused, named by where they are and never quoted', () => {
  assert.throws(() => validateConfig({ server: { api_keys: ['has space'] }, models: [{ path: 'm' }] }, 'a.yaml'), /a\.yaml: server\.api_keys\.0\.key/);
  assert.throws(() => validateConfig({ server: { api_keys: [{ key: 'sk', bogus: 1 }] }, models: [{ path: 'm' }] }, 'b.yaml'), /b\.yaml: server\.api_keys\.0/);
  assert.throws(() => validateConfig({ server: { key_limits: { requests_per_minute: 0 } }, models: [{ path: 'm' }] }, 'c.yaml'), /requests_per_minute/);
  assert.throws(() => validateConfig({ server: { api_keys: [{ key: 'sk', role: 'root' }] }, models: [{ path: 'm' }] }, 'r.yaml'), /r\.yaml: server\.api_keys\.0\.role/);

  const { server } = validateConfig({ server: { api_keys: ['sk-same'] }, models: [{ path: 'm' }] }, 'd.yaml');
  const isQuiet = (pattern: RegExp) => (err: unknown) => err instanceof ConfigError && pattern.test(err.message) && !err.message.includes('sk-same');
  assert.throws(() => resolveApiKeys(server, { CONDUIT_API_KEYS: 'sk-same' }), isQuiet(/CONDUIT_API_KEYS\[0\]: the same API key as api_keys\[0\]/));
  assert.throws(() => resolveApiKeys(server, { CONDUIT_API_KEYS: 'sk-ok,,sk-other' }), /CONDUIT_API_KEYS\[1\]: an API key is printable ASCII/);
  assert.throws(
    () => resolveApiKeys({ ...server, api_keys_file: '/nonexistent/keys.txt' }, {}),
    (err: unknown) => err instanceof ConfigError && /\/nonexistent\/keys\.txt: cannot read/.test(err.message),
  );
});
