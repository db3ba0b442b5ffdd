// The real `conduit serve` (the compiled CLI, as a user starts it): its KServe gRPC calls leave
// their access lines on stdout through the gateway's own logger, at the level --log-level sets,
// and Triton's logging setting changed over HTTP (/v2/logging) silences the gRPC lines too.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import { within } from '../../../test/wait.ts';
import { boundedFetch, defaultModelDir, repoRoot } from '../../../test/integration/harness.ts';
import { loadInferenceService } from '../grpc.ts';
import { callWithMetadata, type Client } from './grpc-client.ts';

type LogLine = Record<string, unknown>;

test('conduit serve: a gRPC call\'s access line on stdout under its request id; /v2/logging silences it', { timeout: 120_000 }, async (t) => {
  const server = spawn(process.execPath, [
    path.join(repoRoot, 'bin', 'conduit.js'), 'serve', '--model', defaultModelDir, '--model-repository', path.join(repoRoot, 'models'),
    '--http-port', '0', '--grpc-port', '0', '--metrics-port', '0', '--log-level', 'info',
  ], { stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  t.after(() => {
    try {
      process.kill(-server.pid!, 'SIGKILL');
    } catch {
      // Gone already.
    }
  });
  const lines: LogLine[] = [];
  const listeners = new Set<() => void>();
  createInterface({ input: server.stdout! }).on('line', (line) => {
    try {
      lines.push(JSON.parse(line));
    } catch {
      return;
    }
    for (const listener of listeners) listener();
  });
  const accessLine = (requestId: string) => within(new Promise<LogLine>((resolve) => {
    const check = () => {
      const found = lines.find((line) => line.request_id === requestId && line.msg === 'request completed');
      if (found === undefined) return;
      listeners.delete(check);
      resolve(found);
    };
    listeners.add(check);
    check();
  }), `the access line of ${requestId}`);

  let stderr = '';
  // Until it serves, the HTTP side refuses /v2/logging as it refuses every route.
  const [httpAddress, grpcPort] = await within(new Promise<[string, string]>((resolve, reject) => {
    server.stderr!.on('data', (data: Buffer) => {
      stderr += data.toString();
      const match = /serving on (http:\/\/\S+) \(.*KServe gRPC \S+:(\d+)\)/.exec(stderr);
      if (match) resolve([match[1].replace('0.0.0.0', '127.0.0.1'), match[2]]);
    });
    server.once('exit', () => reject(new Error(`conduit exited before serving:\n${stderr}`)));
  }), 'conduit serving');
  const client = new (loadInferenceService())(`127.0.0.1:${grpcPort}`, grpc.credentials.createInsecure()) as unknown as Client;
  t.after(() => client.close());
  const serverLive = (requestId: string) => {
    const metadata = new grpc.Metadata();
    metadata.set('x-request-id', requestId);
    return callWithMetadata(client, 'ServerLive', {}, metadata);
  };
  const setLogInfo = async (on: boolean) => {
    const response = await boundedFetch(`${httpAddress}/v2/logging`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ log_info: on }) });
    assert.equal(response.status, 200, await response.text());
  };

  const outcome = await serverLive('serve-grpc-1');
  assert.deepEqual(outcome.headers.get('x-request-id'), ['serve-grpc-1']);
  const line = await accessLine('serve-grpc-1');
  assert.deepEqual([line.level, line.role, line.protocol, line.method, line.grpc_status], ['info', 'gateway', 'grpc', 'ServerLive', 'OK']);

  await setLogInfo(false);
  await serverLive('serve-grpc-quiet');
  await setLogInfo(true);
  await serverLive('serve-grpc-2');
  // One logger writes in call order: once the later line is out, the quiet one would have been.
  await accessLine('serve-grpc-2');
  assert.equal(lines.some((entry) => entry.request_id === 'serve-grpc-quiet'), false);
});
