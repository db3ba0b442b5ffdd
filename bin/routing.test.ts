import assert from 'node:assert/strict';
import { test } from 'node:test';
import { validateConfig } from '../configs/schema.ts';
import { DEFAULT_ROUTER_SETTINGS, routerSettingsOf } from '../router/settings.ts';

test("a configuration's router defaults are the router's own (configs/README.md documents one set)", () => {
  const config = validateConfig({ models: [{ path: 'm' }] }, 'a.yaml');
  assert.deepEqual(routerSettingsOf(config.models[0].routing_policy, config.router), DEFAULT_ROUTER_SETTINGS);
});

test('the router section reaches the settings, seconds as milliseconds', () => {
  const config = validateConfig(
    { router: { load_weight: 2, session_ttl_s: 5 }, models: [{ path: 'm', routing_policy: 'round-robin' }] },
    'b.yaml',
  );
  const settings = routerSettingsOf(config.models[0].routing_policy, config.router);
  assert.equal(settings.policy, 'round-robin');
  assert.equal(settings.loadWeight, 2);
  assert.equal(settings.sessionTtlMs, 5_000);
});
