// The KServe gRPC tests' client side: connecting, a key's metadata, a unary call as a promise (with its initial metadata when
// asked), and the expected failure of one.
import assert from 'node:assert/strict';
import * as grpc from '@grpc/grpc-js';
import { connectInferenceClient, type InferenceClient } from '../grpc.ts';

export { connectInferenceClient };
export type Client = InferenceClient;

/** Request metadata carrying an API key, as clients send it: `authorization: Bearer <key>`. */
export function bearerMetadata(key: string): grpc.Metadata {
  const metadata = new grpc.Metadata();
  metadata.set('authorization', `Bearer ${key}`);
  return metadata;
}

export function call(client: Client, rpc: string, request: unknown): Promise<any> {
  return new Promise((resolve, reject) => client[rpc](request, (err: grpc.ServiceError | null, response: unknown) => (err ? reject(err) : resolve(response))));
}

export async function expectStatus(promise: Promise<unknown>, code: grpc.status, details: RegExp | string) {
  await assert.rejects(promise, (err: grpc.ServiceError) => {
    assert.equal(err.code, code, `${err.code}: ${err.details}`);
    if (typeof details === 'string') assert.equal(err.details, details);
    else assert.match(err.details, details);
    return true;
  });
}

/** What a unary call got back: its initial metadata (headers), and its response or its error. */
export interface CallOutcome {
  headers: grpc.Metadata;
  response: any;
  error: grpc.ServiceError | null;
}

/** A unary call with request metadata, answering its initial metadata with its response or error. */
export function callWithMetadata(client: Client, rpc: string, request: unknown, metadata: grpc.Metadata): Promise<CallOutcome> {
  return new Promise((resolve) => {
    let headers: grpc.Metadata | null = null;
    const pending = client[rpc](request, metadata, (error: grpc.ServiceError | null, response: unknown) => {
      resolve({ headers: headers ?? new grpc.Metadata(), response, error });
    }) as grpc.ClientUnaryCall;
    pending.on('metadata', (received) => { headers = received; });
  });
}
