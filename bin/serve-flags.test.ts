// `conduit serve`'s flags for the model repository and gRPC port (Triton's names).
import assert from 'node:assert/strict';
import path from 'node:path';
import { test } from 'node:test';
import { logLevelOverride, resolveServeConfig } from './cli.ts';

test('the default config serves models/ as a model repository in none mode', () => {
  const config = resolveServeConfig([]);
  assert.equal(config.model_repository?.path, path.resolve('models'));
  assert.equal(config.model_repository?.model_control_mode, 'none');
  assert.equal(config.server.grpc_port, 8001);
});

test('--model-repository, --model-control-mode, --load-model and --grpc-port', () => {
  const config = resolveServeConfig(['--model-repository', 'some/repo', '--model-control-mode', 'explicit', '--load-model', 'a', '--load-model', 'b', '--grpc-port', '9001']);
  assert.deepEqual(config.model_repository, { path: path.resolve('some/repo'), model_control_mode: 'explicit', repository_poll_s: 15, load_models: ['a', 'b'] });
  assert.equal(config.server.grpc_port, 9001);
});

test('a bad control mode is a config error naming the field', () => {
  assert.throws(() => resolveServeConfig(['--model-control-mode', 'sometimes']), /model_repository\.model_control_mode: /);
});

test('a bad port flag is blamed on the command line, not on the configuration file', () => {
  assert.throws(() => resolveServeConfig(['--http-port', '99999']), /^ConfigError: command line: --http-port 99999: Too big/);
  assert.throws(() => resolveServeConfig(['--metrics-port', 'abc']), /command line: --metrics-port abc: .*expected number/);
  assert.throws(() => resolveServeConfig(['--grpc-port=-1']), /command line: --grpc-port -1: Too small/);
  assert.equal(resolveServeConfig(['--http-port', '0']).server.http_port, 0);
});

test('--log-level over CONDUIT_LOG_LEVEL over server.log_level (info by default), a bad one blamed on its source', () => {
  assert.equal(resolveServeConfig([]).server.log_level, process.env.CONDUIT_LOG_LEVEL ?? 'info');
  assert.equal(resolveServeConfig(['--log-level', 'debug']).server.log_level, 'debug');
  assert.equal(logLevelOverride(undefined, { CONDUIT_LOG_LEVEL: 'warn' }), 'warn');
  assert.equal(logLevelOverride('error', { CONDUIT_LOG_LEVEL: 'warn' }), 'error');
  assert.equal(logLevelOverride(undefined, {}), undefined);
  assert.throws(() => resolveServeConfig(['--log-level', 'loud']), /^ConfigError: command line: --log-level loud: Invalid option/);
  assert.throws(() => logLevelOverride(undefined, { CONDUIT_LOG_LEVEL: 'INFO' }), /CONDUIT_LOG_LEVEL INFO: Invalid option/);
});

test('--device cuda puts every model on the GPU; a bad device names the field', () => {
  const config = resolveServeConfig(['--model', 'models/conduit-tiny', '--device', 'cuda']);
  assert.deepEqual(config.models.map((model) => model.device), ['cuda']);
  assert.equal(resolveServeConfig(['--model', 'models/conduit-tiny']).models[0].device, 'cpu');
  assert.throws(() => resolveServeConfig(['--model', 'models/conduit-tiny', '--device', 'tpu']), /models\.0\.device: /);
});

test('--speculative-config (vLLM\'s JSON) applies to every model served', () => {
  const config = resolveServeConfig(['--model', 'a', '--model', 'b', '--speculative-config', '{"method": "ngram", "num_speculative_tokens": 4}']);
  assert.deepEqual(config.models.map((model) => model.speculative_config), [
    { method: 'ngram', num_speculative_tokens: 4, adaptive: true },
    { method: 'ngram', num_speculative_tokens: 4, adaptive: true },
  ]);
  assert.equal(resolveServeConfig(['--model', 'a']).models[0].speculative_config, undefined);
  assert.throws(() => resolveServeConfig(['--model', 'a', '--speculative-config', '{"method": "medusa", "num_speculative_tokens": 4}']), /speculative_config/);
});
