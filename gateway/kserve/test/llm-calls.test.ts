// An LLM over v2 infer, as a client's call: its generation stops in the engine (the slot freed)
// when the client cancels or leaves, over gRPC ModelInfer and HTTP infer; and a gRPC call's
// tokens are charged to the key's per-minute quota as an HTTP request's are (its estimate at
// admission replaced by what it used). A real gateway and gRPC service sharing one AccessControl,
// over a scripted engine worker.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { after, before, test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import type { FastifyInstance } from 'fastify';
import type { GenerateRequest } from '../../../engine/types.ts';
import { within } from '../../../test/wait.ts';
import { AccessControl } from '../../admission.ts';
import { MODEL_NAME, startTestGateway, type TestGateway } from '../../test/harness.ts';
import type { Script } from '../../test/scripted-engine.ts';
import { startKServeGrpc, type KServeGrpcServer } from '../grpc.ts';
import { bearerMetadata, connectInferenceClient, type Client } from './grpc-client.ts';
import { serializeBytes } from './harness.ts';

const KEY = 'sk-calls-1';
const TOKENS_PER_MINUTE = 100_000;
let gateway: TestGateway;
let app: FastifyInstance;
let grpcServer: KServeGrpcServer;
let client: Client;
let script: Script = { steps: [] };

before(async () => {
  // The clock stands still: nothing refills, so the quota shows exactly what was charged.
  const access = new AccessControl({ apiKeys: [{ name: 'team-calls', key: KEY, limits: { tokensPerMinute: TOKENS_PER_MINUTE } }], nowMs: () => 1_000_000 });
  gateway = await startTestGateway(() => script, { gatewayOptions: { access }, beforeListen: async (instance) => { app = instance; } });
  grpcServer = await startKServeGrpc({ repository: undefined as never, llms: [], llmModels: app.kserveLlms, version: '0.1.0', host: '127.0.0.1', port: 0, access });
  client = connectInferenceClient(`127.0.0.1:${grpcServer.port}`);
});
after(async () => {
  client.close();
  await grpcServer.close();
  await gateway.close();
});

const inferRequest = (text: string, maxTokens: number) => ({
  model_name: MODEL_NAME, id: 'c-1', parameters: { max_tokens: { int64_param: String(maxTokens) } },
  inputs: [{ name: 'text_input', datatype: 'BYTES', shape: ['1'] }], raw_input_contents: [serializeBytes([text])],
});

const httpInferBody = (text: string, maxTokens: number) => JSON.stringify({
  inputs: [{ name: 'text_input', shape: [1], datatype: 'BYTES', data: [text] }], parameters: { max_tokens: maxTokens },
});

/** The tokens the key may still use this minute, as a request admitted with no estimate sees them. */
async function remainingTokens(): Promise<number> {
  const response = await within(fetch(`${gateway.baseUrl}/v1/models`, { headers: { authorization: `Bearer ${KEY}` } }), 'GET /v1/models was not answered');
  await response.arrayBuffer();
  return Number(response.headers.get('x-ratelimit-remaining-tokens'));
}

async function expectAbortedOnLeave(start: () => () => void, what: string) {
  script = { steps: [gateway.tokens(' and')], hang: true };
  const generated = once(gateway.engine, 'generate');
  const leave = start();
  const [request] = (await within(generated, `${what}: the engine got no request`)) as [GenerateRequest];
  const aborted = once(gateway.engine, 'abort');
  leave();
  assert.deepEqual(await within(aborted, `${what}: the engine was not told to abort the generation`), [request.requestId]);
  assert.equal(gateway.engine.numInFlight, 0, `${what}: the engine still runs the request`);
}

test('gRPC ModelInfer: a cancelled call aborts its generation in the engine', async () => {
  let settled: Promise<grpc.ServiceError | null> = Promise.resolve(null);
  await expectAbortedOnLeave(() => {
    let pending!: grpc.ClientUnaryCall;
    settled = new Promise((resolve) => { pending = client.ModelInfer(inferRequest('Hello', 50), bearerMetadata(KEY), (err: grpc.ServiceError | null) => resolve(err)); });
    return () => pending.cancel();
  }, 'ModelInfer');
  assert.equal((await within(settled, 'the cancelled call did not settle'))?.code, grpc.status.CANCELLED);
});

test('HTTP /v2 infer: a client that leaves aborts its generation in the engine', async () => {
  await expectAbortedOnLeave(() => {
    const controller = new AbortController();
    fetch(`${gateway.baseUrl}/v2/models/${MODEL_NAME}/infer`, {
      method: 'POST', headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' }, body: httpInferBody('Hello', 50), signal: controller.signal,
    }).catch(() => {});
    return () => controller.abort();
  }, 'HTTP infer');
});

test("gRPC ModelInfer charges the tokens it used to the key's per-minute quota, as HTTP infer does", async () => {
  script = { steps: [gateway.tokens(' a b c')], finishReason: 'length' };
  // HTTP first: what this request uses (prompt and completion), as its settled charge shows.
  const before = await remainingTokens();
  const http = await within(fetch(`${gateway.baseUrl}/v2/models/${MODEL_NAME}/infer`, {
    method: 'POST', headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' }, body: httpInferBody('Hello there', 10),
  }), 'HTTP infer was not answered');
  assert.equal(http.status, 200, await http.clone().text());
  await http.arrayBuffer();
  const afterHttp = await remainingTokens();
  const numUsedTokens = before - afterHttp;
  const numCompletionTokens = gateway.tokens(' a b c').length;
  assert.ok(numUsedTokens > numCompletionTokens, `HTTP infer was charged ${numUsedTokens} tokens, less than it generated`);
  const request = inferRequest('Hello there', 10);
  const response = await within(new Promise<any>((resolve, reject) => {
    client.ModelInfer(request, bearerMetadata(KEY), (err: grpc.ServiceError | null, value: unknown) => (err ? reject(err) : resolve(value)));
  }), 'ModelInfer was not answered');
  assert.deepEqual(response.outputs.map((o: { name: string }) => o.name), ['text_output', 'finish_reason']);
  // The same request over gRPC: charged what it used, not its admission estimate.
  assert.equal(await remainingTokens(), afterHttp - numUsedTokens);
});
