// KServe v2 over gRPC (`inference.GRPCInferenceService` from proto/grpc_service.proto) on its
// own port (8001), for the model repository's models. Unary errors are gRPC statuses from the
// error catalogue; ModelStreamInfer reports a request's error in `error_message` and keeps going.
// Shared memory, trace and log settings share their state with the HTTP routes (KServeControl).
// Every call gets a request id and access lines as HTTP requests do (grpc-access-log.ts), and
// passes the same keys and limits (grpc-access.ts).
import path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { pino } from 'pino';
import { packageRoot } from '../../package-root.ts';
import { ClassicError, fromConfigDataType, toRaw, type ModelConfig, type ModelRepository, type ServedVersion } from '../../triton/index.ts';
import { AccessControl } from '../admission.ts';
import type { ApiKeySpec } from '../auth.ts';
import type { UsageAccount } from '../generation.ts';
import { KServeControl, type OutputTarget } from './control.ts';
import { admitRequest, callerOf, checkRpcRole } from './grpc-access.ts';
import { toKServeError } from './errors.ts';
import { CallLog, clip, goneStatus, type GrpcLogger, type ModelRef } from './grpc-access-log.ts';
import { controlHandlers } from './grpc-control.ts';
import { decodeInputs, plainParameters, type WireInputTensor, type WireParameter } from './grpc-tensors.ts';
import { EXTENSIONS, SERVER_NAME } from './server-metadata.ts';
import { isLlmReady, isServerReady, type LlmWorkers } from './readiness.ts';
import { sequenceOfGrpc } from './sequence-params.ts';
import { sharedMemoryRefOf } from './shared-memory.ts';
import { runLlmInfer } from './grpc-llm.ts';
import { addHealthService } from './grpc-health.ts';
import type { KServeLlms } from './llm-models.ts';

const PROTO_DIR = path.join(packageRoot, 'proto');

/** Triton's own Node client loads the protos with these options; so do we. */
export const LOADER_OPTIONS: protoLoader.Options = { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true, includeDirs: [PROTO_DIR] };

export function loadInferenceService(): grpc.ServiceClientConstructor {
  const definition = protoLoader.loadSync(path.join(PROTO_DIR, 'grpc_service.proto'), LOADER_OPTIONS);
  const root = grpc.loadPackageDefinition(definition) as unknown as { inference: { GRPCInferenceService: grpc.ServiceClientConstructor } };
  return root.inference.GRPCInferenceService;
}

/** A GRPCInferenceService client: each RPC by its proto name, called as grpc-js calls unary methods. */
export type InferenceClient = grpc.Client & Record<string, (...args: any[]) => any>;

/** A GRPCInferenceService client over plaintext, as Triton's own clients connect to a local server. */
export function connectInferenceClient(address: string): InferenceClient {
  return new (loadInferenceService())(address, grpc.credentials.createInsecure()) as unknown as InferenceClient;
}

type Parameter = WireParameter;

interface WireInferRequest {
  model_name: string;
  model_version: string;
  id: string;
  parameters: Record<string, Parameter>;
  inputs: WireInputTensor[];
  outputs: Array<{ name: string; parameters: Record<string, Parameter> }>;
  raw_input_contents: Uint8Array[];
}

function parameterNumber(parameter: Parameter | undefined, name: string): number {
  if (parameter === undefined) return 0;
  const value = parameter.int64_param ?? parameter.uint64_param;
  const number = Number(value);
  if (parameter.parameter_choice !== 'int64_param' && parameter.parameter_choice !== 'uint64_param' || !Number.isSafeInteger(number) || number < 0) {
    throw new ClassicError('INVALID_ARG', `parameter '${name}' must be a non-negative integer`);
  }
  return number;
}

function versionOf(version: string): number | null {
  if (version === '') return null;
  if (!/^\d+$/.test(version)) throw new ClassicError('INVALID_ARG', `invalid model version '${version}'`);
  return Number(version);
}

async function runInfer(repository: ModelRepository, control: KServeControl, request: WireInferRequest, apiKey: ApiKeySpec | null) {
  const served = repository.get(request.model_name, versionOf(request.model_version));
  const sequence = sequenceOfGrpc(request.parameters);
  const sharedMemory = control.sharedMemoryFor(apiKey);
  const inputs = decodeInputs(request.inputs, request.raw_input_contents, sharedMemory);
  const requested = request.outputs.length > 0
    ? request.outputs
    : served.config.output.map((output) => ({ name: output.name, parameters: {} as Record<string, Parameter> }));
  const names = requested.map((output) => output.name);
  const priority = parameterNumber(request.parameters.priority, 'priority');
  const timeoutUs = parameterNumber(request.parameters.timeout, 'timeout');
  // Held from now on, so an unregister while the model runs cannot pull a region away.
  const targets: OutputTarget[] = [];
  try {
    for (const output of requested) {
      const ref = sharedMemoryRefOf(plainParameters(output.parameters), `output '${output.name}'`);
      const classification = output.parameters.classification === undefined ? 0 : parameterNumber(output.parameters.classification, 'classification');
      targets.push({ name: output.name, sharedMemory: ref === null ? null : sharedMemory.lease(ref), classification });
    }
  } catch (err) {
    for (const target of targets) target.sharedMemory?.release();
    throw err;
  }
  const outputs = await control.infer(served, { inputs, requestedOutputs: names, priority, timeoutUs, sequence }, request.id, targets);
  return {
    model_name: served.config.name,
    model_version: String(served.version),
    id: request.id,
    outputs: names.map((name) => ({ name, datatype: outputs[name].datatype, shape: outputs[name].shape })),
    // An output in shared memory keeps its (empty) entry, so the others stay at their index.
    raw_output_contents: targets.map(({ name, sharedMemory }) => (sharedMemory === null ? toRaw(outputs[name]) : Buffer.alloc(0))),
  };
}

function tensorMetadata(config: ModelConfig, list: ModelConfig['input'] | ModelConfig['output']) {
  return list.map((t) => ({ name: t.name, datatype: fromConfigDataType(t.data_type), shape: config.max_batch_size > 0 ? [-1, ...t.dims] : t.dims }));
}

/** Our config in ModelConfig's proto shape (oneofs as their set field). */
function configMessage(config: ModelConfig) {
  const { dynamic_batching: batching, ensemble_scheduling: ensemble } = config;
  return {
    name: config.name,
    platform: config.platform ?? '',
    backend: config.backend === 'ensemble' ? '' : config.backend,
    version_policy: config.version_policy,
    max_batch_size: config.max_batch_size,
    input: config.input,
    output: config.output,
    instance_group: config.instance_group,
    default_model_filename: config.default_model_filename ?? '',
    parameters: config.parameters,
    model_warmup: config.model_warmup,
    batch_input: config.batch_input,
    ...(config.response_cache === undefined ? {} : { response_cache: config.response_cache }),
    ...(batching === undefined ? {} : { dynamic_batching: batching }),
    ...(config.sequence_batching === undefined ? {} : { sequence_batching: config.sequence_batching }),
    ...(ensemble === undefined ? {} : { ensemble_scheduling: ensemble }),
  };
}

function stringParameter(parameters: Record<string, Parameter & { bytes_param?: Buffer }>, name: string): string | null {
  const parameter = parameters[name];
  if (parameter === undefined) return null;
  if (parameter.parameter_choice !== 'string_param') throw new ClassicError('INVALID_ARG', `parameter '${name}' must be a string`);
  return parameter.string_param!;
}

type Unary = (call: grpc.ServerUnaryCall<unknown, unknown>, callback: grpc.sendUnaryData<unknown>) => void;

/** A request message that did not decode as protobuf: the client's fault, where grpc-js would answer INTERNAL. */
class MalformedMessage {
  constructor(readonly reason: string) {}
}

function decoded<Req>(request: Req | MalformedMessage): Req {
  if (request instanceof MalformedMessage) throw new ClassicError('INVALID_ARG', `malformed request message: ${request.reason}`);
  return request;
}

/** Each decoded request message's size in bytes, for the estimate its admission charges. */
const messageBytes = new WeakMap<object, number>();

function messageBytesOf(request: unknown): number {
  return typeof request === 'object' && request !== null ? messageBytes.get(request) ?? 0 : 0;
}

/** The service with each request decoder's failure handed to the handler, so it is answered INVALID_ARGUMENT. */
function tolerantDecoding(service: grpc.ServiceDefinition): grpc.ServiceDefinition {
  return Object.fromEntries(Object.entries(service).map(([name, method]) => [name, {
    ...method,
    requestDeserialize: (bytes: Buffer) => {
      try {
        // As a plain Uint8Array, protobufjs reads it with its checked reader: from a Buffer, a
        // string whose length runs past the end was cut short and decoded anyway. Bytes fields
        // come out as Uint8Array views of the message.
        const request = method.requestDeserialize(new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength) as Buffer);
        messageBytes.set(request, bytes.byteLength);
        return request;
      } catch (err) {
        return new MalformedMessage((err as Error).message);
      }
    },
  }]));
}

/** The fields naming a model (and a version, where the message has one) in each RPC's request that names one. */
const MODEL_FIELDS: Readonly<Record<string, readonly [model: string, version: string | null]>> = {
  ModelReady: ['name', 'version'],
  ModelMetadata: ['name', 'version'],
  ModelConfig: ['name', 'version'],
  ModelStatistics: ['name', 'version'],
  ModelInfer: ['model_name', 'model_version'],
  ModelStreamInfer: ['model_name', 'model_version'],
  RepositoryModelLoad: ['model_name', null],
  RepositoryModelUnload: ['model_name', null],
  TraceSetting: ['model_name', null],
};

/** The model a request names, for its access line; null for the RPCs that name none and for a malformed message. */
function modelOf(rpc: string, request: unknown): ModelRef | null {
  const fields = MODEL_FIELDS[rpc];
  if (fields === undefined || request instanceof MalformedMessage) return null;
  const message = request as Record<string, unknown>;
  const [model, version] = fields;
  return { model: String(message[model] ?? ''), version: version === null ? '' : String(message[version] ?? '') };
}

/**
 * The most characters of an error message a status carries. Its details travel in an HTTP/2
 * trailer, percent-encoded (up to 9 bytes a character), and a message quoting a huge client
 * string (a 100 kB model name) made a header block past the client's limit: that call and every
 * later one on the connection went unanswered (found by `npm run fuzz`). Over the stream,
 * `error_message` is a message field and keeps the whole text.
 */
const MAX_STATUS_DETAILS_CHARS = 1024;

/**
 * Half a surrogate pair, which grpc-js's encodeURI of the details throws on, in its own event
 * handler: an uncaught exception, and the call never answered. JSON.parse's message quotes one
 * (`Unexpected token '\ud83c'` for a config of "🎉"; found by `npm run fuzz`).
 */
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g;

function statusOf(error: { grpcStatus: grpc.status; message: string }): Partial<grpc.StatusObject> {
  const message = error.message.replace(LONE_SURROGATE, '\ufffd');
  const details = message.length <= MAX_STATUS_DETAILS_CHARS ? message : `${clip(message, MAX_STATUS_DETAILS_CHARS)}... (cut from ${message.length} characters)`;
  return { code: error.grpcStatus, details };
}

/** The catalogue's error for a failure; one the server did not expect is logged in full, under the call's request id. */
function failureOf(err: unknown, callLog: CallLog) {
  const error = toKServeError(err);
  if (error.code === 'internal_error') callLog.log.error({ err }, 'kserve grpc request failed');
  return error;
}

/** A ModelInferResponse names the version that ran, which the request may have left to the server. */
const isInferResponse = (response: unknown): response is { model_name: string; model_version: string } =>
  typeof (response as { model_version?: unknown } | null)?.model_version === 'string';

/** What a unary handler knows of its call beyond the request. */
interface CallContext {
  apiKey: ApiKeySpec | null;
  /** Charged with the tokens an LLM's generation uses (the key's per-minute quota). */
  account: UsageAccount | undefined;
  /** Aborted when the client cancels the call or its connection goes. */
  signal: AbortSignal;
}

type Handler = (request: any, apiKey: ApiKeySpec | null, context: CallContext) => unknown;

/**
 * Wraps a handler so every call is authenticated and admitted first, every failure is a gRPC
 * status from the catalogue, and every call leaves an access line.
 */
function unary(rpc: string, handler: Handler, logger: GrpcLogger, access: AccessControl): Unary {
  return (call, callback) => {
    const startMs = performance.now();
    const callLog = new CallLog(call, logger);
    const inferId = rpc === 'ModelInfer' && !(call.request instanceof MalformedMessage) ? (call.request as { id: string }).id : undefined;
    const complete = (code: grpc.status, model: ModelRef | null) => {
      const clientGone = call.cancelled;
      callLog.complete({ method: rpc, model, code: clientGone ? goneStatus(call) : code, inferId, clientGone }, startMs);
    };
    let endAdmission = () => {};
    // grpc-js emits 'cancelled' when the client cancels, its deadline passes or its connection closes.
    const gone = new AbortController();
    call.once('cancelled', () => gone.abort());
    Promise.resolve()
      .then(() => {
        const apiKey = callerOf(access, call.metadata);
        checkRpcRole(rpc, apiKey);
        const request = decoded(call.request);
        const admission = admitRequest(access, apiKey, messageBytesOf(call.request));
        endAdmission = admission.end;
        return handler(request, apiKey, { apiKey, account: admission.account, signal: gone.signal });
      })
      .then((response) => {
        callback(null, response);
        complete(grpc.status.OK, isInferResponse(response) ? { model: response.model_name, version: response.model_version } : modelOf(rpc, call.request));
      }, (err: unknown) => {
        const error = failureOf(err, callLog);
        callback(statusOf(error));
        complete(error.grpcStatus, modelOf(rpc, call.request));
      })
      .finally(() => endAdmission());
  };
}

const DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024;

export interface KServeGrpcServer {
  port: number;
  close(): Promise<void>;
}

export interface KServeGrpcOptions {
  repository: ModelRepository;
  /** The LLMs served beside the repository: they count for ServerReady and answer ModelReady. */
  llms: readonly LlmWorkers[];
  /** The LLMs as v2 models (the gateway's `kserveLlms`): metadata, config, infer, statistics. Without it they answer ModelReady only. */
  llmModels?: KServeLlms;
  version: string;
  host: string;
  port: number;
  /** Shared memory, trace and log settings, shared with the HTTP routes; the service's own (closed with it) when omitted. */
  control?: KServeControl;
  /** API keys and limits, shared with the HTTP gateway; without it, no key is needed and nothing is limited. */
  access?: AccessControl;
  /**
   * The largest request message in bytes, compressed and decompressed alike (`server.body_limit_bytes`,
   * as an HTTP body): a larger one is RESOURCE_EXHAUSTED; 8 MiB when omitted.
   */
  maxMessageBytes?: number;
  /** The gateway's life: ServerReady is false unless it is ready (while starting and draining). Ready when omitted. */
  readiness?: { readonly state: string };
  /**
   * The gateway's logger (fastify's `app.log`), for the access lines and errors; kept at the log
   * settings' level (LogSettings). Nothing is logged when omitted.
   */
  logger?: GrpcLogger;
}

export async function startKServeGrpc(options: KServeGrpcOptions): Promise<KServeGrpcServer> {
  const { repository, llms } = options;
  const control = options.control ?? new KServeControl();
  // grpc-js applies the receive limit to a compressed message's decompressed size too, and stops
  // inflating it there (its zlib streams run off the event loop): a small message that would
  // decompress to gigabytes costs no more than the limit.
  const maxMessageBytes = options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
  const server = new grpc.Server({ 'grpc.max_receive_message_length': maxMessageBytes, 'grpc.max_send_message_length': -1 });
  const served = (name: string, version: string): ServedVersion => repository.get(name, versionOf(version));
  const llmOf = (name: string, version: string) => options.llmModels?.find(name, versionOf(version)) ?? null;
  /** One infer request for a repository model or an LLM; onResponse takes a streamed LLM's chunks. */
  const inferAny = (request: WireInferRequest, context: CallContext, onResponse?: (response: unknown) => void) => {
    const llm = llmOf(request.model_name, request.model_version);
    if (llm === null) return runInfer(repository, control, request, context.apiKey);
    // The admission's account learns the tokens used, as an HTTP request's; a call has no access line or session header.
    const origin = { arrivalMs: performance.now(), account: context.account, trace: undefined, affinityKey: undefined };
    return runLlmInfer(options.llmModels!, llm, request, control.sharedMemoryFor(context.apiKey), context.signal, origin, onResponse);
  };
  const logger = options.logger ?? pino({ level: 'silent' });
  const access = options.access ?? new AccessControl({ apiKeys: [] });
  // Triton's LogSettings move this logger's level, as /v2/logging moves the HTTP side's.
  if (options.logger !== undefined) control.logging.attach(options.logger);
  const unaryHandlers: Record<string, Handler> = {
    ServerLive: () => ({ live: true }),
    ServerReady: () => ({ ready: (options.readiness?.state ?? 'ready') === 'ready' && isServerReady(repository, llms) }),
    ModelReady: (request: { name: string; version: string }) => {
      const llm = llms.find((model) => model.name === request.name);
      // An LLM has one version (1, as its /v2 metadata says).
      if (llm !== undefined) return { ready: ['', '1'].includes(request.version) && isLlmReady(llm) };
      try {
        served(request.name, request.version);
        return { ready: true };
      } catch {
        return { ready: false };
      }
    },
    ServerMetadata: () => ({ name: SERVER_NAME, version: options.version, extensions: EXTENSIONS }),
    ModelMetadata: (request: { name: string; version: string }) => {
      const llm = llmOf(request.name, request.version);
      if (llm !== null) return options.llmModels!.metadata(llm);
      const { config } = served(request.name, request.version);
      return {
        name: config.name,
        versions: repository.index(true).filter((entry) => entry.name === config.name).map((entry) => entry.version),
        platform: config.platform ?? config.backend,
        inputs: tensorMetadata(config, config.input),
        outputs: tensorMetadata(config, config.output),
      };
    },
    ModelConfig: (request: { name: string; version: string }) => {
      const llm = llmOf(request.name, request.version);
      if (llm === null) return { config: configMessage(served(request.name, request.version).config) };
      return { config: { ...configMessage(options.llmModels!.config(llm)), model_transaction_policy: { decoupled: true } } };
    },
    ModelStatistics: (request: { name: string; version: string }) => {
      const llm = llmOf(request.name, request.version);
      if (llm !== null) return { model_stats: options.llmModels!.stats(llm.name) };
      const version = versionOf(request.version);
      if (request.name !== '') served(request.name, request.version);
      const modelStats = repository.loadedVersions()
        .filter((v) => request.name === '' || (v.config.name === request.name && (version === null || v.version === version)))
        .map((v) => v.stats.stats);
      return { model_stats: request.name === '' ? [...modelStats, ...options.llmModels?.stats(null) ?? []] : modelStats };
    },
    RepositoryIndex: (request: { ready: boolean }) => ({ models: [...repository.index(request.ready), ...options.llmModels?.index(request.ready) ?? []] }),
    RepositoryModelLoad: async (request: { model_name: string; parameters: Record<string, Parameter> }) => {
      if (Object.keys(request.parameters).some((key) => key.startsWith('file:'))) {
        throw new ClassicError('UNSUPPORTED', "loading model files through 'file:' parameters is not supported; put them in the repository");
      }
      await repository.load(request.model_name, stringParameter(request.parameters, 'config'));
      return {};
    },
    RepositoryModelUnload: async (request: { model_name: string; parameters: Record<string, Parameter> }) => {
      const parameter = request.parameters.unload_dependents;
      if (parameter !== undefined && parameter.parameter_choice !== 'bool_param') throw new ClassicError('INVALID_ARG', "parameter 'unload_dependents' must be a bool");
      await repository.unload(request.model_name, parameter?.bool_param === true);
      return {};
    },
    // An LLM's generation stops (its engine slot freed) when the client cancels or leaves.
    ModelInfer: (request: WireInferRequest, _apiKey, context) => inferAny(request, context),
    ...controlHandlers(control, repository),
  };
  server.addService(tolerantDecoding(loadInferenceService().service), {
    ...Object.fromEntries(Object.entries(unaryHandlers).map(([rpc, handler]) => [rpc, unary(rpc, handler, logger, access)])),
    // One access line per request message, as each finishes: a stream carries many independent
    // requests (each with its own model, `id` and outcome, most often in `error_message` under a
    // stream that stays OK) and may stay open for the client's whole life, so a line per stream
    // would come late, if ever, and hide every failure. The stream's request id is on each.
    ModelStreamInfer: (call: grpc.ServerDuplexStream<WireInferRequest | MalformedMessage, unknown>) => {
      const callLog = new CallLog(call, logger);
      const statusOnError = call.metadata.get('triton_grpc_error')[0] === 'true';
      // The key is the stream's, checked once as it opens; each request message is admitted on its own.
      let apiKey: ApiKeySpec | null;
      try {
        apiKey = callerOf(access, call.metadata);
      } catch (err) {
        const error = failureOf(err, callLog);
        callLog.complete({ method: 'ModelStreamInfer', model: null, code: error.grpcStatus }, performance.now());
        call.emit('error', statusOf(error));
        return;
      }
      let numInFlight = 0;
      // Cancels the LLM generations still running when the client leaves.
      const streamGone = new AbortController();
      call.once('cancelled', () => streamGone.abort());
      call.once('close', () => streamGone.abort());
      let ended = false;
      let failed = false;
      const maybeEnd = () => { if (ended && numInFlight === 0 && !failed) call.end(); };
      call.on('data', (request: WireInferRequest | MalformedMessage) => {
        if (failed) return;
        const startMs = performance.now();
        const inferId = request instanceof MalformedMessage ? undefined : request.id;
        // A request's answer is lost when the client has left, or the stream ended on an earlier request's error.
        const complete = (code: grpc.status, model: ModelRef | null) => {
          const clientGone = call.cancelled;
          const finalCode = clientGone ? goneStatus(call) : failed ? grpc.status.CANCELLED : code;
          callLog.complete({ method: 'ModelStreamInfer', model, code: finalCode, inferId, clientGone }, startMs);
        };
        numInFlight++;
        let endAdmission = () => {};
        Promise.resolve().then(() => {
          const message = decoded(request);
          const admission = admitRequest(access, apiKey, messageBytesOf(request));
          endAdmission = admission.end;
          return inferAny(message, { apiKey, account: admission.account, signal: streamGone.signal }, (chunk) => { if (!failed) call.write({ error_message: '', infer_response: chunk }); });
        }).then(
          (response) => {
            complete(grpc.status.OK, { model: response.model_name, version: response.model_version });
            if (!failed) call.write({ error_message: '', infer_response: response });
          },
          (err: unknown) => {
            const error = failureOf(err, callLog);
            complete(error.grpcStatus, modelOf('ModelStreamInfer', request));
            if (!statusOnError) {
              // As Triton: an infer_response holding only the request's id, so the client knows which one failed.
              call.write({ error_message: error.message, infer_response: { id: inferId ?? '' } });
              return;
            }
            failed = true;
            call.emit('error', statusOf(error));
          },
        ).finally(() => { endAdmission(); numInFlight--; maybeEnd(); });
      });
      call.on('end', () => { ended = true; maybeEnd(); });
    },
  });
  const isReady = () => (options.readiness?.state ?? 'ready') === 'ready';
  const endWatches = addHealthService(server, (service) => {
    if (service === '' || service === 'inference.GRPCInferenceService') return isReady() && isServerReady(repository, llms) ? 'SERVING' : 'NOT_SERVING';
    const llm = llms.find((model) => model.name === service);
    if (llm !== undefined) return isReady() && isLlmReady(llm) ? 'SERVING' : 'NOT_SERVING';
    if (!repository.index(false).some((entry) => entry.name === service)) return 'SERVICE_UNKNOWN';
    try {
      served(service, '');
      return isReady() ? 'SERVING' : 'NOT_SERVING';
    } catch {
      return 'NOT_SERVING';
    }
  });
  const port = await new Promise<number>((resolve, reject) => {
    server.bindAsync(`${options.host}:${options.port}`, grpc.ServerCredentials.createInsecure(), (err, boundPort) => (err ? reject(err) : resolve(boundPort)));
  });
  return {
    port,
    async close() {
      endWatches();
      await new Promise<void>((resolve) => server.tryShutdown(() => resolve()));
      if (options.control === undefined) control.close();
    },
  };
}
