// `conduit loadtest kserve`: closed-loop load on an ordinary model over KServe v2 (HTTP or
// gRPC), as perf_analyzer measures one: each of N clients sends a request with random inputs
// of the model's shapes and waits for the answer; throughput (inferences/s, requests/s) and
// latency percentiles per concurrency, optionally written to results.json.
import { mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { KServeGrpcTransport, KServeHttpTransport, type InferTransport, type PreparedInput, type TensorSpec } from './kserve-transport.ts';
import { createRng } from './random.ts';
import { summarize, type Summary } from './stats.ts';
import { RequestError } from './transport.ts';

export const KSERVE_USAGE = `usage: conduit loadtest kserve --url URL --model NAME [options]

  --url URL              HTTP base URL (http://127.0.0.1:8000), or HOST:PORT with --protocol grpc
  --model NAME           a model of the server's model repository
  --protocol P           http (binary tensors, default) | grpc (raw_input_contents)
  --concurrency N[,N..]  closed-loop clients per load point (default 1,8,64)
  --requests N           requests per load point (default 500)
  --batch-size N         rows per request for a model with a batch dimension (default 1)
  --timeout-s S          per-request timeout (default 30)
  --seed N               the random inputs' seed (default 1)
  --out DIR              write DIR/results.json`;

const BYTES_PER_ELEMENT: Record<string, number> = {
  BOOL: 1, UINT8: 1, INT8: 1, UINT16: 2, INT16: 2, FP16: 2, BF16: 2, UINT32: 4, INT32: 4, FP32: 4, UINT64: 8, INT64: 8, FP64: 8,
};

/** Random little-endian data for a tensor spec; -1 dims become batchSize (the first) or 1. */
export function prepareInput(spec: TensorSpec, batchSize: number, random: () => number): PreparedInput {
  const shape = spec.shape.map((dim, i) => (dim !== -1 ? dim : i === 0 ? batchSize : 1));
  const numElements = shape.reduce((a, b) => a * b, 1);
  if (spec.datatype === 'BYTES') {
    const parts = Array.from({ length: numElements }, () => {
      const text = Buffer.from(random().toString(36).slice(2, 10));
      const length = Buffer.alloc(4);
      length.writeUInt32LE(text.byteLength);
      return Buffer.concat([length, text]);
    });
    return { name: spec.name, datatype: spec.datatype, shape, bytes: Buffer.concat(parts) };
  }
  const size = BYTES_PER_ELEMENT[spec.datatype];
  if (size === undefined) throw new Error(`unknown datatype ${spec.datatype} for input ${spec.name}`);
  const bytes = Buffer.alloc(numElements * size);
  for (let i = 0; i < numElements; i++) {
    const offset = i * size;
    switch (spec.datatype) {
      case 'FP32': bytes.writeFloatLE(random(), offset); break;
      case 'FP64': bytes.writeDoubleLE(random(), offset); break;
      case 'FP16': bytes.writeUInt16LE(0x3800, offset); break; // 0.5
      case 'BF16': bytes.writeUInt16LE(0x3f00, offset); break; // 0.5
      case 'BOOL': bytes.writeUInt8(random() < 0.5 ? 1 : 0, offset); break;
      case 'INT64': case 'UINT64': bytes.writeBigInt64LE(BigInt(Math.floor(random() * 100)), offset); break;
      default: bytes.writeUIntLE(Math.floor(random() * 100), offset, size);
    }
  }
  return { name: spec.name, datatype: spec.datatype, shape, bytes };
}

export interface KServeLoadPoint {
  concurrency: number;
  numRequests: number;
  numFailed: number;
  failuresByType: Record<string, number>;
  durationS: number;
  requestsPerSecond: number;
  inferencesPerSecond: number;
  latencyMs: Summary;
}

export async function runLoadPoint(
  transport: InferTransport, model: string, inputSets: PreparedInput[][], concurrency: number, numRequests: number, batchSize: number, timeoutMs: number,
): Promise<KServeLoadPoint> {
  const latenciesMs: number[] = [];
  const failuresByType: Record<string, number> = {};
  let next = 0;
  const startMs = performance.now();
  await Promise.all(Array.from({ length: concurrency }, async () => {
    for (let i = next++; i < numRequests; i = next++) {
      const sentMs = performance.now();
      try {
        await transport.infer(model, inputSets[i % inputSets.length], timeoutMs);
        latenciesMs.push(performance.now() - sentMs);
      } catch (err) {
        const type = err instanceof RequestError ? err.type : 'other';
        failuresByType[type] = (failuresByType[type] ?? 0) + 1;
      }
    }
  }));
  const durationS = (performance.now() - startMs) / 1000;
  return {
    concurrency,
    numRequests,
    numFailed: numRequests - latenciesMs.length,
    failuresByType,
    durationS,
    requestsPerSecond: latenciesMs.length / durationS,
    inferencesPerSecond: (latenciesMs.length * batchSize) / durationS,
    latencyMs: summarize(latenciesMs),
  };
}

export async function kserveMain(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    strict: true,
    options: {
      url: { type: 'string' }, model: { type: 'string' }, protocol: { type: 'string', default: 'http' },
      concurrency: { type: 'string', default: '1,8,64' }, requests: { type: 'string', default: '500' },
      'batch-size': { type: 'string', default: '1' }, 'timeout-s': { type: 'string', default: '30' },
      seed: { type: 'string', default: '1' }, out: { type: 'string' }, help: { type: 'boolean' },
    },
  });
  if (values.help) {
    console.log(KSERVE_USAGE);
    return 0;
  }
  const concurrencies = values.concurrency.split(',').map(Number);
  const numRequests = Number(values.requests);
  const batchSize = Number(values['batch-size']);
  const timeoutMs = Number(values['timeout-s']) * 1000;
  const bad = (message: string) => { console.error(`conduit loadtest kserve: ${message}\n\n${KSERVE_USAGE}`); return 2; };
  if (values.url === undefined || values.model === undefined) return bad('--url and --model are required');
  if (values.protocol !== 'http' && values.protocol !== 'grpc') return bad(`--protocol must be http or grpc, not ${values.protocol}`);
  if (concurrencies.some((n) => !Number.isInteger(n) || n < 1)) return bad('--concurrency takes positive integers');
  if (!Number.isInteger(numRequests) || numRequests < 1) return bad('--requests takes a positive integer');
  if (!Number.isInteger(batchSize) || batchSize < 1) return bad('--batch-size takes a positive integer');

  const transport: InferTransport = values.protocol === 'grpc'
    ? new KServeGrpcTransport(values.url.replace(/^grpc:\/\//, ''))
    : new KServeHttpTransport(values.url, Math.max(...concurrencies));
  try {
    const metadata = await transport.metadata(values.model);
    const batched = metadata.inputs.length > 0 && metadata.inputs.every((input) => input.shape[0] === -1);
    const rows = batched ? batchSize : 1;
    const random = createRng(Number(values.seed));
    const inputSets = Array.from({ length: 16 }, () => metadata.inputs.map((input) => prepareInput(input, rows, random)));
    const points: KServeLoadPoint[] = [];
    console.log(`${transport.name} ${values.url} model ${values.model}, ${rows} row${rows > 1 ? 's' : ''} per request`);
    console.log('concurrency   infer/s     req/s   p50 ms   p90 ms   p99 ms  failed');
    for (const concurrency of concurrencies) {
      const point = await runLoadPoint(transport, values.model, inputSets, concurrency, numRequests, rows, timeoutMs);
      points.push(point);
      const { latencyMs: l } = point;
      console.log(`${String(concurrency).padStart(11)} ${point.inferencesPerSecond.toFixed(1).padStart(9)} ${point.requestsPerSecond.toFixed(1).padStart(9)} ` +
        `${l.p50.toFixed(2).padStart(8)} ${l.p90.toFixed(2).padStart(8)} ${l.p99.toFixed(2).padStart(8)} ${String(point.numFailed).padStart(7)}` +
        (point.numFailed > 0 ? ` ${JSON.stringify(point.failuresByType)}` : ''));
    }
    if (values.out !== undefined) {
      await mkdir(values.out, { recursive: true });
      const results = { transport: transport.name, url: values.url, model: values.model, batch_size: rows, points };
      await writeFile(path.join(values.out, 'results.json'), `${JSON.stringify(results, null, 2)}\n`);
    }
    return points.every((point) => point.numFailed === point.numRequests) ? 1 : 0;
  } catch (err) {
    console.error(`conduit loadtest kserve: ${(err as Error).message}`);
    return 1;
  } finally {
    transport.close();
  }
}
