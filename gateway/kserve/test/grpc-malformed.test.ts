// Bytes that do not decode as the RPC's request message are the client's fault: INVALID_ARGUMENT
// (grpc-js alone answers INTERNAL, as if the server had failed), and the server serves on; an
// error quoting a huge client string is cut to fit a trailer, and one holding half a surrogate
// pair is mended rather than thrown from grpc-js. All found by `npm run fuzz -- --target kserve-grpc`.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import { ModelRepository } from '../../../triton/index.ts';
import { loadInferenceService, startKServeGrpc, type KServeGrpcServer } from '../grpc.ts';
import { call, type Client } from './grpc-client.ts';
import { MODELS_DIR } from './harness.ts';

/** Field 1's tag (model_name / name, length-delimited) and nothing after it. */
const TRUNCATED = Buffer.from([0x0a]);
/** Field 5, a length-delimited message claiming 2 bytes where 1 follows. */
const SHORT_MESSAGE = Buffer.from([0x2a, 0x02, 0xff]);
/** Field 1, a string claiming 5 bytes where 3 follow: protobufjs's Buffer reader cut it short and decoded "abc". */
const SHORT_STRING = Buffer.from([0x0a, 0x05, 0x61, 0x62, 0x63]);
/** Field 5, a message of 3 bytes holding field 1, a string claiming 5. */
const SHORT_NESTED_STRING = Buffer.from([0x2a, 0x03, 0x0a, 0x05, 0x61]);

let repository: ModelRepository;
let server: KServeGrpcServer;
let client: grpc.Client;
before(async () => {
  repository = new ModelRepository({ repoDir: MODELS_DIR, mode: 'none', pollIntervalMs: 1000, startupModels: [] });
  await repository.start();
  server = await startKServeGrpc({ repository, llms: [], version: '0.1.0', host: '127.0.0.1', port: 0 });
  client = new grpc.Client(`127.0.0.1:${server.port}`, grpc.credentials.createInsecure());
});
after(async () => {
  client.close();
  await server.close();
  await repository.close();
});

const identity = (bytes: Buffer) => bytes;

function unary(method: string, bytes: Buffer): Promise<grpc.ServiceError | null> {
  return new Promise((resolve) => {
    client.makeUnaryRequest(`/inference.GRPCInferenceService/${method}`, identity, identity, bytes, { deadline: Date.now() + 10_000 }, (err) => resolve(err));
  });
}

test('a unary request that does not decode is INVALID_ARGUMENT, and a valid one after it is served', async () => {
  for (const method of ['ModelInfer', 'ModelReady', 'ModelMetadata', 'RepositoryModelLoad']) {
    for (const bytes of [TRUNCATED, SHORT_MESSAGE, SHORT_STRING, ...(method === 'ModelInfer' ? [SHORT_NESTED_STRING] : [])]) {
      const err = await unary(method, bytes);
      assert.equal(err?.code, grpc.status.INVALID_ARGUMENT, `${method} ${bytes.toString('hex')}: ${err?.code} ${err?.details}`);
      assert.match(err!.details, /malformed request message/);
    }
  }
  // ModelReadyRequest { name: "digits" }
  assert.equal(await unary('ModelReady', Buffer.concat([Buffer.from([0x0a, 6]), Buffer.from('digits')])), null);
});

test('a stream message that does not decode gets an error_message and the stream goes on', async () => {
  const call = client.makeBidiStreamRequest('/inference.GRPCInferenceService/ModelStreamInfer', identity, identity, new grpc.Metadata(), { deadline: Date.now() + 10_000 });
  const responses: Buffer[] = [];
  call.on('data', (bytes: Buffer) => responses.push(bytes));
  const ended = new Promise<grpc.StatusObject>((resolve) => call.on('status', resolve));
  call.write(TRUNCATED);
  call.write(SHORT_MESSAGE);
  call.end();
  const status = await ended;
  assert.equal(status.code, grpc.status.OK, status.details);
  assert.equal(responses.length, 2);
  // ModelStreamInferResponse field 1 is error_message.
  for (const response of responses) assert.match(response.toString('latin1'), /malformed request message/);
});

/** A ModelMetadataRequest { name } as bytes (field 1, length-delimited, varint length). */
function metadataRequest(name: string): Buffer {
  const bytes = Buffer.from(name, 'utf8');
  const length: number[] = [];
  for (let n = bytes.byteLength; ; n >>>= 7) {
    if (n < 0x80) { length.push(n); break; }
    length.push((n & 0x7f) | 0x80);
  }
  return Buffer.concat([Buffer.from([0x0a, ...length]), bytes]);
}

test('an error quoting a huge client string is cut in the status details, and the connection serves on', async () => {
  // 'x' is one byte in the trailer, 'ü' six (%C3%BC), '😀' twelve for two characters: ASCII,
  // percent-encoded, and a surrogate pair the cut must not split.
  for (const name of ['x'.repeat(200_000), 'ü'.repeat(20_000), '😀'.repeat(10_000), `a${'😀'.repeat(10_000)}`]) {
    const err = await unary('ModelMetadata', metadataRequest(name));
    assert.equal(err?.code, grpc.status.NOT_FOUND, `${name.slice(0, 3)}: ${err?.code} ${err?.details?.slice(0, 200)}`);
    assert.ok(err!.details.startsWith(`Request for unknown model: '${name.slice(0, 100)}`), err!.details.slice(0, 200));
    assert.match(err!.details, /\.\.\. \(cut from \d+ characters\)$/);
    assert.ok(err!.details.length < 1200, `${err!.details.length} characters`);
    assert.equal(await unary('ModelReady', metadataRequest('digits')), null, 'the next call on the connection');
  }
});

test("an error message holding half a surrogate pair (JSON.parse's about a config of '🎉') is answered, not thrown from grpc-js", async () => {
  // Explicit mode, so a load's config is parsed.
  const explicit = new ModelRepository({ repoDir: MODELS_DIR, mode: 'explicit', pollIntervalMs: 1000, startupModels: [] });
  await explicit.start();
  const explicitServer = await startKServeGrpc({ repository: explicit, llms: [], version: '0.1.0', host: '127.0.0.1', port: 0 });
  const Service = loadInferenceService();
  const explicitClient = new Service(`127.0.0.1:${explicitServer.port}`, grpc.credentials.createInsecure()) as unknown as Client;
  const uncaught: Error[] = [];
  const onUncaught = (err: Error) => { uncaught.push(err); };
  process.on('uncaughtException', onUncaught);
  try {
    const load = (config: string) => new Promise<grpc.ServiceError | null>((resolve) => {
      explicitClient.RepositoryModelLoad({ model_name: 'absent', parameters: { config: { string_param: config } } }, { deadline: Date.now() + 10_000 }, resolve);
    });
    const err = await load('🎉');
    assert.equal(err?.code, grpc.status.INVALID_ARGUMENT, `${err?.code} ${err?.details}`);
    assert.match(err!.details, /\ufffd/);
    assert.deepEqual(await call(explicitClient, 'ServerLive', {}), { live: true }, 'the next call is answered');
    assert.deepEqual(uncaught, []);
  } finally {
    process.off('uncaughtException', onUncaught);
    explicitClient.close();
    await explicitServer.close();
    await explicit.close();
  }
});
