// Request ids and access lines of the KServe gRPC service over a real socket, with a real pino
// logger writing to a stream the test reads: the client's x-request-id (or a generated one) in
// the response's initial metadata and on the call's one access line, the status of a failing
// call, one line per ModelStreamInfer request, ModelInferRequest's own id echoed as Triton does,
// and the level (the logger's, and Triton's LogSettings) silencing the lines.
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { after, before, describe, test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import { pino, type Logger } from 'pino';
import { ModelRepository } from '../../../triton/index.ts';
import { within } from '../../../test/wait.ts';
import { startKServeGrpc, type KServeGrpcServer } from '../grpc.ts';
import { call, callWithMetadata, connectInferenceClient } from './grpc-client.ts';
import { makeTestRepo } from './harness.ts';

type LogLine = Record<string, any>;

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
const FAILING_MODEL = {
  config: 'backend: "script"\nmax_batch_size: 0\ninput [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]\noutput [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]\n',
  script: "export function execute() { throw new Error('the model failed'); }\n",
};
/** Values no access line may hold: the test's tensor, in the typed form and as raw bytes. */
const TENSOR = [1.25, -2.5, 3.75];
const inferRequest = (model: string, id: string) => ({
  model_name: model, id, inputs: [{ name: 'INPUT', datatype: 'FP32', shape: [TENSOR.length], contents: { fp32_contents: TENSOR } }],
});

function withRequestId(...ids: string[]): grpc.Metadata {
  const metadata = new grpc.Metadata();
  for (const id of ids) metadata.add('x-request-id', id);
  return metadata;
}

/** A gRPC service over a test repository, its logger writing JSON lines into `lines`. */
async function startLoggedService(level: string) {
  const repo = makeTestRepo({ failing: FAILING_MODEL });
  const repository = new ModelRepository({ repoDir: repo.dir, mode: 'none', pollIntervalMs: 1000, startupModels: [] });
  await repository.start();
  const lines: LogLine[] = [];
  const listeners = new Set<() => void>();
  const stream = new Writable({
    write(chunk, _encoding, done) {
      lines.push(JSON.parse(String(chunk)));
      for (const listener of listeners) listener();
      done();
    },
  });
  const logger: Logger = pino({ level }, stream);
  const server: KServeGrpcServer = await startKServeGrpc({ repository, llms: [], version: '0.1.0', host: '127.0.0.1', port: 0, logger });
  const client = connectInferenceClient(`127.0.0.1:${server.port}`);
  /** The lines about a request id so far. */
  const linesOf = (requestId: string) => lines.filter((line) => line.request_id === requestId);
  /** Resolves with the first `count` access lines of a request id, once they are written. */
  const accessLines = (requestId: string, count = 1) => within(new Promise<LogLine[]>((resolve) => {
    const check = () => {
      const found = linesOf(requestId).filter((line) => line.msg === 'request completed');
      if (found.length < count) return;
      listeners.delete(check);
      resolve(found);
    };
    listeners.add(check);
    check();
  }), `${count} access line(s) of ${requestId}`);
  return {
    client, port: server.port, linesOf, accessLines,
    async close() {
      client.close();
      await server.close();
      await repository.close();
      repo.remove();
    },
  };
}

describe('KServe gRPC request ids and access lines', () => {
  let env: Awaited<ReturnType<typeof startLoggedService>>;
  before(async () => { env = await startLoggedService('info'); });
  after(() => env.close());

  test("the client's x-request-id comes back in the initial metadata and names the call's one access line, which holds no tensor", async () => {
    const outcome = await callWithMetadata(env.client, 'ModelInfer', inferRequest('identity_fp32', 'infer-7'), withRequestId('grpc-client-id-1'));
    assert.equal(outcome.error, null);
    assert.deepEqual(outcome.headers.get('x-request-id'), ['grpc-client-id-1']);
    const [{ time, pid, hostname, duration_ms: durationMs, ...line }] = await env.accessLines('grpc-client-id-1');
    assert.deepEqual([typeof time, typeof pid, typeof hostname, typeof durationMs], ['number', 'number', 'string', 'number']);
    assert.deepEqual(line, {
      level: 30, msg: 'request completed', request_id: 'grpc-client-id-1', protocol: 'grpc', method: 'ModelInfer',
      model: 'identity_fp32', model_version: '1', infer_id: 'infer-7', grpc_status: 'OK',
    });
    const raw = JSON.stringify(env.linesOf('grpc-client-id-1'));
    for (const value of TENSOR) assert.ok(!raw.includes(String(value)), `${value} in ${raw}`);
    assert.ok(!raw.includes(Buffer.from(new Float32Array(TENSOR).buffer).toString('base64')));
    assert.equal(env.linesOf('grpc-client-id-1').length, 1);
  });

  test('without an x-request-id, or with one the HTTP header rule refuses, the id is generated', async () => {
    const cases: [string, grpc.Metadata][] = [
      ['none', new grpc.Metadata()],
      ['a space', withRequestId('two words')],
      ['129 characters', withRequestId('x'.repeat(129))],
      ['two values', withRequestId('first-id', 'second-id')],
    ];
    const seen = new Set<string>();
    for (const [what, metadata] of cases) {
      const outcome = await callWithMetadata(env.client, 'ServerLive', {}, metadata);
      assert.equal(outcome.error, null, what);
      const [requestId] = outcome.headers.get('x-request-id') as string[];
      assert.match(requestId, UUID, what);
      assert.ok(!seen.has(requestId), `${what}: a fresh id`);
      seen.add(requestId);
      const [line] = await env.accessLines(requestId);
      assert.equal(line.method, 'ServerLive', what);
      assert.equal(line.grpc_status, 'OK', what);
      assert.equal('model' in line, false, `${what}: ServerLive names no model`);
    }
  });

  test("a failing call's line carries its status by name; the request id comes back on the failure too", async () => {
    const notFound = await callWithMetadata(env.client, 'ModelInfer', inferRequest('nope', ''), withRequestId('grpc-fail-404'));
    assert.equal(notFound.error?.code, grpc.status.NOT_FOUND);
    assert.deepEqual(notFound.headers.get('x-request-id'), ['grpc-fail-404']);
    const [notFoundLine] = await env.accessLines('grpc-fail-404');
    assert.equal(notFoundLine.grpc_status, 'NOT_FOUND');
    assert.equal(notFoundLine.model, 'nope');
    assert.equal('model_version' in notFoundLine, false, 'none asked for, none resolved');
    assert.equal('infer_id' in notFoundLine, false, 'an empty id is none');

    const badShape = await callWithMetadata(env.client, 'ModelInfer', { ...inferRequest('identity_fp32', 'x'), model_version: '1', inputs: [{ name: 'INPUT', datatype: 'FP32', shape: [2], contents: { fp32_contents: TENSOR } }] }, withRequestId('grpc-fail-400'));
    assert.equal(badShape.error?.code, grpc.status.INVALID_ARGUMENT);
    const [badShapeLine] = await env.accessLines('grpc-fail-400');
    assert.deepEqual([badShapeLine.grpc_status, badShapeLine.model, badShapeLine.model_version], ['INVALID_ARGUMENT', 'identity_fp32', '1']);

    const unknownVersion = await callWithMetadata(env.client, 'ModelMetadata', { name: 'identity_fp32', version: '9' }, withRequestId('grpc-fail-version'));
    assert.equal(unknownVersion.error?.code, grpc.status.NOT_FOUND);
    const [versionLine] = await env.accessLines('grpc-fail-version');
    assert.deepEqual([versionLine.method, versionLine.grpc_status, versionLine.model, versionLine.model_version], ['ModelMetadata', 'NOT_FOUND', 'identity_fp32', '9']);
  });

  test("a model's own failure is INTERNAL on its access line, and its error line carries the same request id", async () => {
    const outcome = await callWithMetadata(env.client, 'ModelInfer', inferRequest('failing', 'f1'), withRequestId('grpc-fail-500'));
    assert.equal(outcome.error?.code, grpc.status.INTERNAL);
    const [line] = await env.accessLines('grpc-fail-500');
    assert.equal(line.grpc_status, 'INTERNAL');
    const errorLine = env.linesOf('grpc-fail-500').find((entry) => entry.msg === 'kserve grpc request failed');
    assert.ok(errorLine !== undefined, JSON.stringify(env.linesOf('grpc-fail-500')));
    assert.equal(errorLine.level, 50, 'error');
    assert.match(errorLine.err.message, /the model failed/);
  });

  test('a message that does not decode leaves an INVALID_ARGUMENT line naming no model', async () => {
    const raw = new grpc.Client(`127.0.0.1:${env.port}`, grpc.credentials.createInsecure());
    try {
      const identity = (bytes: Buffer) => bytes;
      const err = await new Promise<grpc.ServiceError | null>((resolve) => {
        raw.makeUnaryRequest('/inference.GRPCInferenceService/ModelInfer', identity, identity, Buffer.from([0x0a]), withRequestId('grpc-malformed'), (error) => resolve(error));
      });
      assert.equal(err?.code, grpc.status.INVALID_ARGUMENT);
    } finally {
      raw.close();
    }
    const [line] = await env.accessLines('grpc-malformed');
    assert.deepEqual([line.method, line.grpc_status, 'model' in line], ['ModelInfer', 'INVALID_ARGUMENT', false]);
  });

  test('each control RPC leaves one line, naming the model where its request names one', async () => {
    const calls: [string, unknown, Record<string, unknown>][] = [
      ['ServerReady', {}, { grpc_status: 'OK' }],
      ['ModelReady', { name: 'identity_fp32', version: '' }, { model: 'identity_fp32', grpc_status: 'OK' }],
      ['ModelConfig', { name: 'identity_fp32', version: '1' }, { model: 'identity_fp32', model_version: '1', grpc_status: 'OK' }],
      ['ModelStatistics', { name: '', version: '' }, { grpc_status: 'OK' }],
      ['RepositoryIndex', { ready: true }, { grpc_status: 'OK' }],
      ['RepositoryModelLoad', { model_name: 'identity_fp32' }, { model: 'identity_fp32', grpc_status: 'UNAVAILABLE' }],
      // A region's name is not a model's.
      ['SystemSharedMemoryStatus', { name: 'no-such-region' }, { grpc_status: 'NOT_FOUND' }],
      ['TraceSetting', { model_name: 'identity_fp32' }, { model: 'identity_fp32', grpc_status: 'OK' }],
      ['LogSettings', {}, { grpc_status: 'OK' }],
    ];
    for (const [index, [rpc, request, expected]] of calls.entries()) {
      const requestId = `grpc-control-${index}`;
      await callWithMetadata(env.client, rpc, request, withRequestId(requestId));
      const [line] = await env.accessLines(requestId);
      const { model, model_version: version, grpc_status: status } = line;
      assert.deepEqual(
        Object.fromEntries(Object.entries({ method: line.method, model, model_version: version, grpc_status: status }).filter(([, value]) => value !== undefined)),
        { method: rpc, ...expected }, rpc,
      );
    }
    for (const index of calls.keys()) assert.equal(env.linesOf(`grpc-control-${index}`).length, 1);
  });

  test("ModelStreamInfer: the stream's id in its initial metadata, one line per request message with its own status; a failed request's response carries its id, as Triton's", async () => {
    const stream = env.client.ModelStreamInfer(withRequestId('grpc-stream-1')) as grpc.ClientDuplexStream<unknown, any>;
    const responses: any[] = [];
    const headers = new Promise<grpc.Metadata>((resolve) => stream.on('metadata', resolve));
    const done = new Promise<void>((resolve, reject) => {
      stream.on('data', (response) => responses.push(response));
      stream.on('end', resolve);
      stream.on('error', reject);
    });
    stream.write(inferRequest('identity_fp32', 's-ok'));
    stream.write(inferRequest('nope', 's-missing'));
    stream.write(inferRequest('failing', 's-failing'));
    stream.end();
    await within(done, 'the stream to end');
    assert.deepEqual((await headers).get('x-request-id'), ['grpc-stream-1']);
    const byId = Object.fromEntries(responses.map((response) => [response.infer_response.id, response]));
    assert.deepEqual(Object.keys(byId).sort(), ['s-failing', 's-missing', 's-ok']);
    assert.equal(byId['s-ok'].error_message, '');
    assert.equal(byId['s-missing'].error_message, "Request for unknown model: 'nope' is not found");
    assert.equal(byId['s-missing'].infer_response.outputs.length, 0, 'only the id');
    assert.match(byId['s-failing'].error_message, /the model failed/);

    const lines = await env.accessLines('grpc-stream-1', 3);
    const outcomes = Object.fromEntries(lines.map((line) => [line.infer_id, [line.method, line.model, line.grpc_status]]));
    assert.deepEqual(outcomes, {
      's-ok': ['ModelStreamInfer', 'identity_fp32', 'OK'],
      's-missing': ['ModelStreamInfer', 'nope', 'NOT_FOUND'],
      's-failing': ['ModelStreamInfer', 'failing', 'INTERNAL'],
    });
  });

  test("ModelInferRequest's own id is echoed exactly, as Triton echoes it (and an empty one stays empty)", async () => {
    for (const id of ['42', 'ünïcode ✓ "quoted" \\ and spaces', '']) {
      assert.equal((await call(env.client, 'ModelInfer', inferRequest('identity_fp32', id))).id, id);
    }
    // A long one whole in the response; its access line keeps 128 characters of it.
    const longId = 'x'.repeat(1000);
    const outcome = await callWithMetadata(env.client, 'ModelInfer', inferRequest('identity_fp32', longId), withRequestId('grpc-long-id'));
    assert.equal(outcome.response.id, longId);
    const [line] = await env.accessLines('grpc-long-id');
    assert.equal(line.infer_id, longId.slice(0, 128));
  });
});

test('the level silences the access lines: the logger set to warn, and Triton LogSettings turning log_info off', async () => {
  const env = await startLoggedService('warn');
  try {
    await callWithMetadata(env.client, 'ServerLive', {}, withRequestId('quiet-at-warn'));
    // LogSettings moves the service's logger: info on, a call logged, info off, a call not logged.
    await call(env.client, 'LogSettings', { settings: { log_info: { bool_param: true } } });
    await callWithMetadata(env.client, 'ServerLive', {}, withRequestId('loud-at-info'));
    await env.accessLines('loud-at-info');
    await call(env.client, 'LogSettings', { settings: { log_info: { bool_param: false } } });
    await callWithMetadata(env.client, 'ServerLive', {}, withRequestId('quiet-after-log-info-off'));
    await call(env.client, 'LogSettings', { settings: { log_info: { bool_param: true } } });
    await callWithMetadata(env.client, 'ServerLive', {}, withRequestId('loud-again'));
    // Lines are written in call order: once the last is there, the quiet ones would have been too.
    await env.accessLines('loud-again');
    assert.deepEqual(env.linesOf('quiet-at-warn'), []);
    assert.deepEqual(env.linesOf('quiet-after-log-info-off'), []);
  } finally {
    await env.close();
  }
});
