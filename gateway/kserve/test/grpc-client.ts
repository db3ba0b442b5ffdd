// The KServe gRPC tests' client side: a unary call as a promise, and the expected failure of one.
import assert from 'node:assert/strict';
import type * as grpc from '@grpc/grpc-js';

export type Client = grpc.Client & Record<string, (...args: any[]) => any>;

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
