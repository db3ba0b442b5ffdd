// Prompts cross the gateway -> worker wire as packed little-endian int32s (GenerateRequest's
// prompt_token_ids_le): exact for any int32, whole at a million tokens, and cheap enough to encode
// that a huge prompt does not hold the gateway's event loop.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as grpc from '@grpc/grpc-js';
import { GrpcEngineClient } from '../grpc/client.ts';
import {
  WireFormatError,
  generateFromWire,
  generateToWire,
  loadEngineService,
  stepFromWire,
  tokenIdsFromBytes,
  tokenIdsToBytes,
  type ClientMessage,
  type ClientMessage__Output,
  type StepOutput__Output,
} from '../grpc/wire.ts';
import type { GenerateRequest, RequestOutput } from '../types.ts';
import { createRng } from '../../loadtest/random.ts';
import { testSeed } from '../../test/seed.ts';
import { within } from '../../test/wait.ts';
import { distinctPrompt } from './fake-runner.ts';
import { FAKE_WORKER_VOCAB_SIZE, startFakeWorker } from './fake-worker.ts';

const VOCAB_SIZE = FAKE_WORKER_VOCAB_SIZE;
const ONE_MILLION = 1_000_000;
/** The gateway's loop turn for a million-token prompt; the varint encoding took 0.4-0.6 s of CPU at load 20. */
const MAX_ENCODE_CPU_MS = 150;

function startWorker(maxModelLen = 128) {
  return startFakeWorker({ maxModelLen });
}

function collect(client: GrpcEngineClient, request: GenerateRequest): Promise<RequestOutput[]> {
  return within(new Promise((resolve) => {
    const outputs: RequestOutput[] = [];
    client.generate(request, (output) => {
      outputs.push(output);
      if (output.finishReason !== null) resolve(outputs);
    });
  }), `request ${request.requestId}'s outputs`);
}

/** A million ids in the vocabulary, then lastId: a worker that names lastId in its refusal read them all. */
function millionTokenPrompt(seed: number, lastId: number, numTokens = ONE_MILLION): number[] {
  const rng = createRng(seed);
  const tokenIds = Array.from({ length: numTokens - 1 }, () => Math.floor(rng() * VOCAB_SIZE));
  tokenIds.push(lastId);
  return tokenIds;
}

test('token ids round-trip exactly through the service\'s own serializer: a million random ids and int32\'s extremes', (t) => {
  const seed = testSeed(t);
  const rng = createRng(seed);
  const extremes = [0, 1, -1, 127, 128, 2 ** 31 - 1, -(2 ** 31), 65535, 65536];
  const promptTokenIds = [...extremes, ...Array.from({ length: ONE_MILLION - extremes.length }, () => Math.floor(rng() * 2 ** 32) - 2 ** 31)];
  const { requestSerialize, requestDeserialize } = loadEngineService().service.Stream;
  const request: GenerateRequest = { requestId: 'big', promptTokenIds, sampling: { maxTokens: 3 } };
  const bytes = requestSerialize({ generate: generateToWire(request) } satisfies ClientMessage);
  // 4 bytes an id, whatever its value.
  assert.ok(bytes.length >= 4 * ONE_MILLION && bytes.length < 4 * ONE_MILLION + 64, `seed ${seed}: ${bytes.length} bytes`);
  const decoded = generateFromWire((requestDeserialize(bytes) as ClientMessage__Output).generate!);
  assert.equal(decoded.promptTokenIds.length, ONE_MILLION);
  assert.deepEqual(decoded.promptTokenIds, promptTokenIds, `seed ${seed}`);
  assert.equal(decoded.sampling.maxTokens, 3);
});

test('ids read from any byte offset, and a length that is not whole ids is a WireFormatError', () => {
  const bytes = tokenIdsToBytes([7, -2, 2 ** 31 - 1]);
  assert.deepEqual([...bytes.subarray(0, 4)], [7, 0, 0, 0], 'little-endian');
  // Decoded messages' bytes are views into a larger buffer, at any offset.
  const unaligned = new Uint8Array(bytes.length + 1);
  unaligned.set(bytes, 1);
  assert.deepEqual(tokenIdsFromBytes(unaligned.subarray(1)), [7, -2, 2 ** 31 - 1]);
  assert.deepEqual(tokenIdsFromBytes(new Uint8Array(0)), []);
  assert.throws(() => tokenIdsFromBytes(new Uint8Array(5)), (err: unknown) => err instanceof WireFormatError && /5 bytes/.test(err.message));
});

test('a million-token prompt reaches the worker whole over gRPC, and the stream serves on', async (t) => {
  const { client, stop } = await startWorker();
  t.after(stop);
  // The worker's scheduler checks every id before the context length: its refusal names the
  // last one and counts them all, so both ends of the prompt crossed.
  for (const lastId of [-7, 2 ** 31 - 1]) {
    const [output] = await collect(client, { requestId: `big${lastId}`, promptTokenIds: millionTokenPrompt(lastId, lastId), sampling: { maxTokens: 1 } });
    assert.equal(output.error?.code, 'invalid_request');
    assert.match(output.error!.message, new RegExp(`holds ${lastId}$`));
    assert.equal(output.numPromptTokens, ONE_MILLION);
  }
  const outputs = await collect(client, { requestId: 'small', promptTokenIds: distinctPrompt('small', 6), sampling: { maxTokens: 3 } });
  assert.equal(outputs.at(-1)!.finishReason, 'length');
  assert.equal(outputs.flatMap((output) => output.newTokenIds).length, 3);
});

test('a prompt of more than gRPC\'s default 4 MiB of ids gets through to a worker whose context holds it', async (t) => {
  const numTokens = 1_200_000;
  const { client, stop } = await startWorker(2 * numTokens);
  t.after(stop);
  const [output] = await collect(client, { requestId: 'huge', promptTokenIds: millionTokenPrompt(3, -3, numTokens), sampling: { maxTokens: 1 } });
  assert.match(output.error?.message ?? '', /holds -3$/, `the worker's answer: ${JSON.stringify(output.error)}`);
  assert.equal(output.numPromptTokens, numTokens);
});

test('sending a million-token prompt holds the gateway\'s event loop for a copy, not a varint per id', async (t) => {
  const { client, stop } = await startWorker();
  t.after(stop);
  const promptTokenIds = millionTokenPrompt(1, -1);
  // The stream up and idle first, so that the write below goes out at once rather than queue.
  await collect(client, { requestId: 'warm-up', promptTokenIds: distinctPrompt('warm-up', 6), sampling: { maxTokens: 1 } });
  let answered!: Promise<RequestOutput[]>;
  // client.generate encodes and writes synchronously: its CPU time is the loop's turn for it
  // (CPU, not wall time, so that neighbours' load does not count).
  const before = process.cpuUsage();
  answered = collect(client, { requestId: 'big', promptTokenIds, sampling: { maxTokens: 1 } });
  const used = process.cpuUsage(before);
  const cpuMs = (used.user + used.system) / 1000;
  assert.ok(cpuMs < MAX_ENCODE_CPU_MS, `encoding a ${ONE_MILLION}-token prompt took ${cpuMs.toFixed(0)} ms of CPU (bound ${MAX_ENCODE_CPU_MS} ms)`);
  const [output] = await answered;
  assert.equal(output.numPromptTokens, ONE_MILLION);
});

test('a prompt whose bytes are not whole ids is refused on its own; the stream serves on', async (t) => {
  const { server, stop } = await startWorker();
  const Engine = loadEngineService();
  const stub = new Engine(server.address, grpc.credentials.createInsecure()) as unknown as grpc.Client & {
    Stream(): grpc.ClientDuplexStream<ClientMessage, StepOutput__Output>;
  };
  const call = stub.Stream();
  t.after(async () => {
    call.cancel();
    stub.close();
    await stop();
  });
  const outputs: RequestOutput[] = [];
  const finished = new Map<string, () => void>();
  call.on('data', (message: StepOutput__Output) => {
    for (const output of stepFromWire(message).outputs) {
      outputs.push(output);
      if (output.finishReason !== null) finished.get(output.requestId)?.();
    }
  });
  call.on('error', () => {});
  const finish = (requestId: string) => within(new Promise<void>((resolve) => finished.set(requestId, resolve)), `${requestId} finished`);
  const bad = finish('bad');
  call.write({ generate: { ...generateToWire({ requestId: 'bad', promptTokenIds: [1], sampling: { maxTokens: 2 } }), promptTokenIdsLe: new Uint8Array(5) } });
  await bad;
  const refusal = outputs.find((output) => output.requestId === 'bad')!;
  assert.equal(refusal.error?.code, 'invalid_request');
  assert.match(refusal.error!.message, /5 bytes, not a whole number of 4-byte ids/);
  const good = finish('good');
  call.write({ generate: generateToWire({ requestId: 'good', promptTokenIds: distinctPrompt('good', 6), sampling: { maxTokens: 2 } }) });
  await good;
  assert.equal(outputs.filter((output) => output.requestId === 'good').flatMap((output) => output.newTokenIds).length, 2);
});
