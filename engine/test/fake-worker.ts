// A worker as the gRPC tests start one: a FakeRunner's engine served on a real socket, with a
// client connected to it.
import { createEngine } from '../engine.ts';
import { GrpcEngineClient } from '../grpc/client.ts';
import { serveEngine } from '../grpc/service.ts';
import type { Logger } from '../log.ts';
import { FakeRunner } from './fake-runner.ts';

export const FAKE_WORKER_KV_BLOCKS = 64;
export const FAKE_WORKER_VOCAB_SIZE = 500;

export interface FakeWorkerOptions {
  listen?: string;
  log?: Logger;
  maxModelLen?: number;
  /** The served model's generation_config temperature, when it sets one. */
  temperature?: number;
}

export async function startFakeWorker({ listen = '127.0.0.1:0', log, maxModelLen = 128, temperature }: FakeWorkerOptions = {}) {
  const runner = new FakeRunner({ numKvBlocks: FAKE_WORKER_KV_BLOCKS, blockSizeTokens: 4, vocabSize: FAKE_WORKER_VOCAB_SIZE, maxModelLen });
  const engine = createEngine(runner, {
    servedName: 'fake',
    maxNumSeqs: 8,
    maxNumBatchedTokens: 64,
    generationDefaults: { eosTokenIds: [2], ...(temperature === undefined ? {} : { temperature }) },
  });
  const server = await serveEngine(engine, listen, log);
  const client = new GrpcEngineClient(server.address);
  const stop = async () => {
    client.close();
    await server.close();
    await engine.close();
  };
  return { runner, engine, server, client, stop };
}
