// gRPC's standard health service (`grpc.health.v1.Health`, proto/health.proto) beside the
// inference service, as Triton serves it and Kubernetes' gRPC probes call it. The service ''
// (and the inference service's own name) is the server: SERVING while it is ready, NOT_SERVING
// while it starts or drains; a model's name is that model's readiness. Check answers NOT_FOUND
// for any other name; Watch answers SERVICE_UNKNOWN and keeps watching, as the protocol says.
import path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { packageRoot } from '../../package-root.ts';

export type ServingStatus = 'SERVING' | 'NOT_SERVING' | 'SERVICE_UNKNOWN';

/** How often a Watch looks at the status again: readiness changes are rare and have no event of their own. */
const WATCH_INTERVAL_MS = 1000;

export function loadHealthService(): grpc.ServiceClientConstructor {
  const definition = protoLoader.loadSync(path.join(packageRoot, 'proto', 'health.proto'), { keepCase: true, enums: String, defaults: true });
  const root = grpc.loadPackageDefinition(definition) as unknown as { grpc: { health: { v1: { Health: grpc.ServiceClientConstructor } } } };
  return root.grpc.health.v1.Health;
}

/**
 * Adds the health service; statusOf answers a service name's status now. The returned function
 * ends every Watch (a server shutting down waits for its open calls).
 */
export function addHealthService(server: grpc.Server, statusOf: (service: string) => ServingStatus): () => void {
  const watches = new Set<grpc.ServerWritableStream<{ service: string }, unknown>>();
  server.addService(loadHealthService().service, {
    Check: (call: grpc.ServerUnaryCall<{ service: string }, unknown>, callback: grpc.sendUnaryData<unknown>) => {
      const status = statusOf(call.request.service);
      if (status === 'SERVICE_UNKNOWN') callback({ code: grpc.status.NOT_FOUND, details: `unknown service '${call.request.service}'` });
      else callback(null, { status });
    },
    Watch: (call: grpc.ServerWritableStream<{ service: string }, unknown>) => {
      let last: ServingStatus | null = null;
      const send = () => {
        const status = statusOf(call.request.service);
        if (status !== last) call.write({ status });
        last = status;
      };
      send();
      const timer = setInterval(send, WATCH_INTERVAL_MS);
      watches.add(call);
      const stop = () => { clearInterval(timer); watches.delete(call); };
      call.once('cancelled', stop);
      call.once('close', stop);
      call.once('error', stop);
      call.once('finish', stop);
    },
  });
  return () => {
    for (const call of watches) {
      // The server's last word: it is going away.
      call.write({ status: 'NOT_SERVING' });
      call.end();
    }
  };
}
