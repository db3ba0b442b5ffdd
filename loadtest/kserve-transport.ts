// KServe v2 inference for the load generator: ordinary models (classifiers, scorers) over HTTP
// (binary tensor extension, as perf_analyzer sends) or gRPC (raw_input_contents), so one tool
// measures LLMs and ordinary models alike. The gRPC client is built from proto/ with the loader
// options of Triton's own Node client.
import http from 'node:http';
import path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { packageRoot } from '../package-root.ts';
import { RequestError } from './transport.ts';

export interface TensorSpec { name: string; datatype: string; shape: number[] }
export interface ModelMetadata { name: string; inputs: TensorSpec[]; outputs: TensorSpec[] }
/** An input ready to send: its shape (batch filled in) and little-endian bytes. */
export interface PreparedInput { name: string; datatype: string; shape: number[]; bytes: Buffer }

export interface InferTransport {
  readonly name: string;
  metadata(model: string): Promise<ModelMetadata>;
  /** Resolves when the answer has arrived in full; rejects with a RequestError. */
  infer(model: string, inputs: readonly PreparedInput[], timeoutMs: number): Promise<void>;
  close(): void;
}

export class KServeHttpTransport implements InferTransport {
  readonly name = 'kserve-http';
  private readonly agent: http.Agent;

  constructor(private readonly baseUrl: string, maxSockets: number) {
    this.agent = new http.Agent({ keepAlive: true, maxSockets, maxFreeSockets: maxSockets });
  }

  private request(method: string, route: string, headers: http.OutgoingHttpHeaders, body: Buffer | null, timeoutMs: number): Promise<Buffer> {
    return new Promise((resolve, reject) => {
      const req = http.request(new URL(route, this.baseUrl), { method, headers, agent: this.agent, timeout: timeoutMs }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (chunk: Buffer) => chunks.push(chunk));
        res.on('end', () => {
          const bytes = Buffer.concat(chunks);
          if (res.statusCode !== 200) reject(new RequestError(`http_${res.statusCode}`, bytes.toString().slice(0, 300)));
          else resolve(bytes);
        });
        res.on('error', (err) => reject(new RequestError('connection', err.message)));
      });
      req.on('timeout', () => req.destroy(new RequestError('timeout', `no answer within ${timeoutMs} ms`)));
      req.on('error', (err) => reject(err instanceof RequestError ? err : new RequestError('connection', err.message)));
      req.end(body ?? undefined);
    });
  }

  async metadata(model: string): Promise<ModelMetadata> {
    return JSON.parse((await this.request('GET', `/v2/models/${encodeURIComponent(model)}`, {}, null, 30_000)).toString()) as ModelMetadata;
  }

  async infer(model: string, inputs: readonly PreparedInput[], timeoutMs: number): Promise<void> {
    const header = Buffer.from(JSON.stringify({
      inputs: inputs.map((input) => ({ name: input.name, datatype: input.datatype, shape: input.shape, parameters: { binary_data_size: input.bytes.byteLength } })),
      parameters: { binary_data_output: true },
    }));
    await this.request('POST', `/v2/models/${encodeURIComponent(model)}/infer`, {
      'content-type': 'application/octet-stream',
      'inference-header-content-length': String(header.byteLength),
    }, Buffer.concat([header, ...inputs.map((input) => input.bytes)]), timeoutMs);
  }

  close(): void {
    this.agent.destroy();
  }
}

const PROTO_DIR = path.join(packageRoot, 'proto');

type Client = grpc.Client & Record<string, (request: unknown, options: grpc.CallOptions, callback: (err: grpc.ServiceError | null, response: any) => void) => void>;

export class KServeGrpcTransport implements InferTransport {
  readonly name = 'kserve-grpc';
  private readonly client: Client;

  constructor(address: string) {
    const definition = protoLoader.loadSync(path.join(PROTO_DIR, 'grpc_service.proto'), {
      keepCase: true, longs: String, enums: String, defaults: true, oneofs: true, includeDirs: [PROTO_DIR],
    });
    const { inference } = grpc.loadPackageDefinition(definition) as unknown as { inference: { GRPCInferenceService: grpc.ServiceClientConstructor } };
    this.client = new inference.GRPCInferenceService(address, grpc.credentials.createInsecure(), {
      'grpc.max_receive_message_length': -1, 'grpc.max_send_message_length': -1,
    }) as unknown as Client;
  }

  private call(rpc: string, request: unknown, timeoutMs: number): Promise<any> {
    return new Promise((resolve, reject) => {
      this.client[rpc](request, { deadline: Date.now() + timeoutMs }, (err, response) => {
        if (err === null) resolve(response);
        else if (err.code === grpc.status.DEADLINE_EXCEEDED) reject(new RequestError('timeout', err.details));
        else if (err.code === grpc.status.UNAVAILABLE && /connect|socket/i.test(err.details)) reject(new RequestError('connection', err.details));
        else reject(new RequestError(`grpc_${grpc.status[err.code]}`, err.details));
      });
    });
  }

  async metadata(model: string): Promise<ModelMetadata> {
    const response = await this.call('ModelMetadata', { name: model, version: '' }, 30_000);
    const specs = (list: Array<{ name: string; datatype: string; shape: string[] }>) => list.map((t) => ({ name: t.name, datatype: t.datatype, shape: t.shape.map(Number) }));
    return { name: response.name, inputs: specs(response.inputs), outputs: specs(response.outputs) };
  }

  async infer(model: string, inputs: readonly PreparedInput[], timeoutMs: number): Promise<void> {
    await this.call('ModelInfer', {
      model_name: model,
      inputs: inputs.map((input) => ({ name: input.name, datatype: input.datatype, shape: input.shape })),
      raw_input_contents: inputs.map((input) => input.bytes),
    }, timeoutMs);
  }

  close(): void {
    this.client.close();
  }
}
