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

/** How often the Watches look at the status again: readiness changes are rare and have no event of their own. */
const WATCH_INTERVAL_MS = 1000;
/**
 * Watches open at once: each is held until its client leaves, and Health needs no key (as
 * /health), so their number is bounded; past it a Watch ends with RESOURCE_EXHAUSTED.
 */
export const MAX_WATCHES = 256;

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
  type WatchCall = grpc.ServerWritableStream<{ service: string }, unknown>;
  /** Each open Watch with the status it was last sent. */
  const watches = new Map<WatchCall, ServingStatus | null>();
  let timer: NodeJS.Timeout | null = null;
  const send = (call: WatchCall) => {
    const status = statusOf(call.request.service);
    if (status !== watches.get(call)) call.write({ status });
    watches.set(call, status);
  };
  server.addService(loadHealthService().service, {
    Check: (call: grpc.ServerUnaryCall<{ service: string }, unknown>, callback: grpc.sendUnaryData<unknown>) => {
      const status = statusOf(call.request.service);
      if (status === 'SERVICE_UNKNOWN') callback({ code: grpc.status.NOT_FOUND, details: `unknown service '${call.request.service}'` });
      else callback(null, { status });
    },
    Watch: (call: WatchCall) => {
      if (watches.size >= MAX_WATCHES) {
        call.emit('error', { code: grpc.status.RESOURCE_EXHAUSTED, details: `${MAX_WATCHES} health Watches are open already` });
        return;
      }
      watches.set(call, null);
      send(call);
      // One timer for every Watch, running while any is open.
      timer ??= setInterval(() => { for (const open of watches.keys()) send(open); }, WATCH_INTERVAL_MS);
      const stop = () => {
        watches.delete(call);
        if (watches.size > 0 || timer === null) return;
        clearInterval(timer);
        timer = null;
      };
      call.once('cancelled', stop);
      call.once('close', stop);
      call.once('error', stop);
      call.once('finish', stop);
    },
  });
  return () => {
    for (const call of watches.keys()) {
      // The server's last word: it is going away.
      call.write({ status: 'NOT_SERVING' });
      call.end();
    }
  };
}
