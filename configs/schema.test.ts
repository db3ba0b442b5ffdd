import { test } from 'node:test';
import assert from 'node:assert/strict';
import { validateConfig, threadsPerWorker, ConfigError } from './schema.ts';

test('defaults fill every knob and paths resolve against the config file', () => {
  const config = validateConfig({ models: [{ path: 'm' }] }, '/etc/conduit/a.yaml');
  assert.equal(config.server.http_port, 8000);
  assert.equal(config.models[0].path, '/etc/conduit/m');
  assert.equal(config.models[0].block_size, 16);
  assert.equal(config.models[0].dtype, 'auto');
});

test('errors name the file and the field', () => {
  assert.throws(
    () => validateConfig({ models: [{ path: 'm', dtype: 'int3' }] }, 'configs/x.yaml'),
    (err: unknown) => err instanceof ConfigError && /configs\/x\.yaml: models\.0\.dtype/.test(err.message),
  );
  assert.throws(
    () => validateConfig({ models: [{ path: 'm', max_num_seqs: 'many' }] }, 'y.yaml'),
    /y\.yaml: models\.0\.max_num_seqs/,
  );
  assert.throws(() => validateConfig({ models: [{ path: 'm', bogus: 1 }] }, 'z.yaml'), /z\.yaml: models\.0/);
  assert.throws(
    () => validateConfig({ models: [{ path: 'm', kv_cache_blocks: 4, kv_cache_bytes: 4096 }] }, 'w.yaml'),
    /w\.yaml: models\.0\.kv_cache_blocks: set kv_cache_blocks or kv_cache_bytes/,
  );
});

test('threads are the cores divided among local workers, never oversubscribed', () => {
  const config = validateConfig({ models: [{ path: 'a', num_workers: 2 }, { path: 'b', num_workers: 1 }] }, 'c.yaml');
  assert.equal(threadsPerWorker(config.models[0], config, 16), 5);
  assert.equal(threadsPerWorker(config.models[0], config, 2), 1);
});

test('the router section: defaults, its checks, and workers that may come from Redis alone', () => {
  const config = validateConfig({ models: [{ path: 'm' }] }, 'a.yaml');
  assert.equal(config.models[0].routing_policy, 'kv-aware');
  assert.equal(config.router.redis_url, undefined);
  assert.equal(config.router.heartbeat_ttl_s, 3);
  assert.throws(
    () => validateConfig({ models: [{ path: 'm', num_workers: 0 }] }, 'b.yaml'),
    /b\.yaml: models\.0\.num_workers: a model needs num_workers > 0, a remote_workers address, or router\.redis_url/,
  );
  const shared = validateConfig({ router: { redis_url: 'redis://10.0.0.9:6379' }, models: [{ path: 'm', num_workers: 0 }] }, 'c.yaml');
  assert.equal(shared.router.redis_url, 'redis://10.0.0.9:6379');
  assert.throws(() => validateConfig({ router: { redis_url: '10.0.0.9:6379' }, models: [{ path: 'm' }] }, 'd.yaml'), /d\.yaml: router\.redis_url/);
  assert.throws(() => validateConfig({ router: { heartbeat_ttl_s: 1 }, models: [{ path: 'm' }] }, 'e.yaml'), /e\.yaml: router\.heartbeat_ttl_s/);
  assert.throws(() => validateConfig({ models: [{ path: 'm', routing_policy: 'fastest' }] }, 'f.yaml'), /f\.yaml: models\.0\.routing_policy/);
});

test('the Responses API settings: defaults (a 60-minute WebSocket, as OpenAI), positive values only', () => {
  const { server } = validateConfig({ models: [{ path: 'm' }] }, 'r.yaml');
  assert.equal(server.response_store_max_responses, 1000);
  assert.equal(server.response_store_ttl_s, 3600);
  assert.equal(server.websocket_max_connection_s, 3600);
  assert.equal(server.websocket_ping_interval_s, 30);
  assert.equal(server.stream_max_buffered_bytes, 4 * 1024 * 1024);
  assert.throws(() => validateConfig({ server: { response_store_max_responses: 0 }, models: [{ path: 'm' }] }, 's.yaml'), /s\.yaml: server\.response_store_max_responses/);
  assert.throws(() => validateConfig({ server: { websocket_ping_interval_s: -1 }, models: [{ path: 'm' }] }, 's.yaml'), /s\.yaml: server\.websocket_ping_interval_s/);
});

test('the worker ready timeout: 300 s by default, positive only', () => {
  assert.equal(validateConfig({ models: [{ path: 'm' }] }, 'r.yaml').server.worker_ready_timeout_s, 300);
  assert.equal(validateConfig({ server: { worker_ready_timeout_s: 0.5 }, models: [{ path: 'm' }] }, 'r.yaml').server.worker_ready_timeout_s, 0.5);
  for (const bad of [0, -1, 'soon']) {
    assert.throws(() => validateConfig({ server: { worker_ready_timeout_s: bad }, models: [{ path: 'm' }] }, 's.yaml'), /s\.yaml: server\.worker_ready_timeout_s/);
  }
});
