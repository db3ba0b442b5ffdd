// Fuzzes the servers' request parsing at volume: seeded random mutations of valid requests
// (gateway/test/fuzz-mutator.ts: type swaps, deletions, huge numbers, NaN-like strings, lone
// surrogates, deep nesting, random bytes, truncation) sent to real listening servers, counted by
// status. Any 5xx (or gRPC INTERNAL / UNKNOWN / DATA_LOSS / UNAVAILABLE), any request left
// unanswered, any uncaught exception in this process (which hosts the servers) fails the run.
//
//   npm run fuzz [-- --count 100000 --target openai|kserve-http|kserve-grpc|all --seed N --concurrency 32]
//
// Targets (--count is split evenly between them with `all`):
// - openai: the gateway over the test harness's ScriptedEngine; chat, completions, Responses,
//   tokenize, detokenize bodies.
// - kserve-http: KServe v2 over HTTP on models/ (digits, fraud, digits_pipeline): JSON infer
//   bodies, binary-tensor bodies with a mutated Inference-Header-Content-Length, repository calls.
// - kserve-grpc: KServe v2 over gRPC on models/, with API keys: ModelInfer messages with mutated
//   fields, and raw damaged protobuf bytes, both sent through a generic client call, alone (5 in
//   8), as 1-3 requests on a ModelStreamInfer stream (2 in 8; half with triton_grpc_error), or the
//   messages of the RPCs naming a model or administering the server (1 in 8: ModelReady,
//   ModelMetadata, ModelConfig, ModelStatistics, RepositoryIndex, RepositoryModelLoad,
//   LogSettings, TraceSetting, SystemSharedMemoryRegister). A stream must answer each of its requests.
// Over HTTP, 1 case in 6 sends its body with Content-Encoding (gzip or deflate, sometimes damaged,
// sometimes a bomb: a small body that decompresses far past the limit, which must be a 413). Over
// gRPC, each case's `authorization` metadata is picked among none, malformed, a wrong key, a user
// key and an admin key: a call answered OK without a valid key, or an administrative RPC answered
// OK without an admin key, fails the run as a 5xx does; 1 case in 8 goes gzip-compressed, and
// 1 in 64 is a message that decompresses past the message limit (RESOURCE_EXHAUSTED).
import os from 'node:os';
import { parseArgs } from 'node:util';
import { deflateSync, gzipSync } from 'node:zlib';
import * as grpc from '@grpc/grpc-js';
import { AccessControl } from '../gateway/admission.ts';
import { ModelRepository } from '../triton/index.ts';
import { loadInferenceService, startKServeGrpc } from '../gateway/kserve/grpc.ts';
import { MODELS_DIR, startKServeServer, binaryBody } from '../gateway/kserve/test/harness.ts';
import { Mutator, rng, serialize, type Json } from '../gateway/test/fuzz-mutator.ts';
import { MODEL_NAME, startTestGateway } from '../gateway/test/harness.ts';

const TARGETS = ['openai', 'kserve-http', 'kserve-grpc'] as const;
type Target = (typeof TARGETS)[number];
/** A request unanswered this long counts as a hang (they take milliseconds). */
const HANG_MS = 30_000;
/** Large enough that deep nesting reaches the parsers instead of the body limit. */
const FUZZ_BODY_LIMIT_BYTES = 1024 * 1024;
/** gRPC statuses that are the server's fault, as a 5xx is over HTTP. */
const GRPC_FAILURES = new Set([grpc.status.INTERNAL, grpc.status.UNKNOWN, grpc.status.DATA_LOSS, grpc.status.UNAVAILABLE]);
const MAX_REPORTED_KINDS = 20;
/** Decompressed, far past FUZZ_BODY_LIMIT_BYTES (and the gRPC message limit); compressed, a few kilobytes. */
const BOMB_BYTES = 16 * FUZZ_BODY_LIMIT_BYTES;
const HTTP_BOMB = gzipSync(Buffer.alloc(BOMB_BYTES, 0x20), { level: 9 });
/** The kserve-grpc target's keys: calls carry one of them, a wrong one, or none. */
const USER_KEY = 'fuzz-user-key';
const ADMIN_KEY = 'fuzz-admin-key';
/** RPCs that only an admin key may call (gateway/kserve/grpc-access.ts). */
const ADMIN_RPCS = new Set(['RepositoryModelLoad', 'RepositoryModelUnload', 'LogSettings', 'TraceSetting', 'SystemSharedMemoryRegister']);

const { values } = parseArgs({
  options: {
    count: { type: 'string', default: '100000' },
    target: { type: 'string', default: 'all' },
    seed: { type: 'string' },
    concurrency: { type: 'string', default: '32' },
  },
});
const targets: readonly Target[] = values.target === 'all' ? TARGETS : [values.target as Target];
if (!targets.every((target) => TARGETS.includes(target))) throw new Error(`--target must be one of ${TARGETS.join(', ')} or all, not ${values.target}`);
const seed = Number(values.seed ?? process.env.CONDUIT_TEST_SEED ?? Math.floor(Math.random() * 2 ** 31));
const numInFlight = Number(values.concurrency);

/**
 * Past this a tree's JSON is no body worth making: a mutation that would grow one past it is
 * dropped. Copies multiply (an array of 3,000 copies of an array of 3,000 copies of an object
 * nested 1,000 deep), and one such tree kept the fuzzer in JSON.stringify for minutes (seed
 * 20261205, openai, near case 16,500), every lane waiting behind it.
 */
const MAX_TREE_JSON_CHARS = 8 * 1024 * 1024;

/** About how long a tree's JSON is, without making it: a subtree shared by many copies is measured once. */
function jsonLength(value: Json, measured = new Map<object, number>()): number {
  if (value === null || typeof value !== 'object') return typeof value === 'string' ? value.length + 2 : 24;
  const known = measured.get(value);
  if (known !== undefined) return known;
  let length = 2;
  if (Array.isArray(value)) for (const item of value) length += jsonLength(item, measured) + 1;
  else for (const [key, item] of Object.entries(value)) length += key.length + 4 + jsonLength(item, measured);
  measured.set(value, length);
  return length;
}

/** numMutations mutations of a tree, but one that would make its JSON huge is dropped. */
function mutated(mutator: Mutator, tree: Json, numMutations: number): Json {
  for (let n = numMutations; n > 0; n--) {
    const next = mutator.mutate(tree);
    if (jsonLength(next) <= MAX_TREE_JSON_CHARS) tree = next;
  }
  return tree;
}

/** What one case got back: an HTTP status, a gRPC status name, or `no answer`; what came back and, after it, the request. */
interface Outcome { label: string; failed: boolean; detail: string; request?: string }

/** One fuzz case: sends itself and says what came back. */
type Case = () => Promise<Outcome>;

/** A target's server and its cases, made one at a time (a case can hold a megabyte of body). */
interface FuzzTarget {
  nextCase(): Case;
  close(): Promise<void>;
}

/** Failures grouped by what came back (its first 100 characters): a count and the first case. */
const failures = new Map<string, { count: number; example: string }>();

function recordFailure(kind: string, example: string): void {
  const known = failures.get(kind);
  if (known !== undefined) known.count++;
  else if (failures.size < MAX_REPORTED_KINDS) failures.set(kind, { count: 1, example });
}
let numCrashes = 0;
/** Servers left open because a call in them never finished: they keep the process alive. */
let numHungCloses = 0;
// The servers run in this process: an uncaught error anywhere in them is the crash we look for.
process.on('uncaughtException', (err) => {
  numCrashes++;
  recordFailure(`uncaught exception: ${err.message}`, err.stack ?? '');
});
process.on('unhandledRejection', (err) => {
  numCrashes++;
  recordFailure(`unhandled rejection: ${(err as Error)?.message ?? err}`, String((err as Error)?.stack ?? err));
});

async function httpOutcome(url: string, init: RequestInit): Promise<Outcome> {
  try {
    const response = await fetch(url, { ...init, signal: AbortSignal.timeout(HANG_MS) });
    const text = await response.text();
    const failed = response.status >= 500;
    let detail = text.slice(0, 300);
    // Every refusal carries an error body: OpenAI's envelope or Triton's {"error": "..."}.
    if (!failed && response.status >= 400) {
      try {
        const { error } = JSON.parse(text);
        if (error === undefined) return { label: String(response.status), failed: true, detail: `no error in the body: ${detail}` };
      } catch {
        return { label: String(response.status), failed: true, detail: `a body that is not JSON: ${detail}` };
      }
    }
    if (failed) detail = `${response.status} ${detail}`;
    return { label: String(response.status), failed, detail };
  } catch (err) {
    return { label: 'no answer', failed: true, detail: (err as Error).message };
  }
}

/**
 * A body as sent, with its Content-Encoding header when compressed (1 case in 6): gzip or
 * deflate, sometimes damaged after compressing, sometimes the bomb, which must be a 413.
 */
function encodedBody(mutator: Mutator, bytes: Buffer, headers: Record<string, string>): { bytes: Buffer; isBomb: boolean } {
  if (mutator.int(6) !== 0) return { bytes, isBomb: false };
  const kind = mutator.int(8);
  if (kind === 0) {
    headers['content-encoding'] = 'gzip';
    return { bytes: HTTP_BOMB, isBomb: true };
  }
  headers['content-encoding'] = kind % 2 === 0 ? 'gzip' : 'deflate';
  const compressed = kind % 2 === 0 ? gzipSync(bytes) : deflateSync(bytes);
  return { bytes: kind === 1 || kind === 2 ? mutator.damage(compressed) : compressed, isBomb: false };
}

/** A bomb must be refused at the limit: anything but a 413 fails the case. */
function bombOutcome(outcome: Outcome, isBomb: boolean): Outcome {
  if (!isBomb || outcome.label === '413') return outcome;
  return { ...outcome, failed: true, detail: `a gzip bomb answered ${outcome.label}: ${outcome.detail}` };
}

// ---- openai -------------------------------------------------------------------------------

const openaiBases: { route: string; body: Json }[] = [
  {
    route: '/v1/chat/completions',
    body: {
      model: MODEL_NAME,
      messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: [{ type: 'text', text: 'Grüße 🎉' }] }],
      max_tokens: 4, temperature: 0.5, top_p: 0.9, n: 2, stop: ['\n', 'END'], logprobs: true, top_logprobs: 2, seed: 7,
      presence_penalty: 0.1, frequency_penalty: 0.1, logit_bias: { '13': 1 }, stream: true,
      stream_options: { include_usage: true, continuous_usage_stats: true }, user: 'fuzz', min_p: 0.05, min_tokens: 1,
      stop_token_ids: [13], include_stop_str_in_output: true,
      tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { a: { type: 'string' } } } } }],
      response_format: { type: 'json_object' },
    },
  },
  {
    route: '/v1/completions',
    body: {
      model: MODEL_NAME, prompt: ['Once upon', 'a time'], max_tokens: 3, echo: true, logprobs: 2, n: 2, stop: 'x',
      ignore_eos: false, priority: 0, cache_salt: 'salt', prompt_logprobs: 1, stream: false,
    },
  },
  { route: '/v1/completions', body: { model: MODEL_NAME, prompt: [[1, 2, 3], [4, 5]], stream: true, stream_options: { include_usage: true } } },
  { route: '/tokenize', body: { model: MODEL_NAME, messages: [{ role: 'user', content: 'hi' }], add_generation_prompt: true } },
  { route: '/detokenize', body: { model: MODEL_NAME, tokens: [1, 2, 3] } },
  {
    route: '/v1/responses',
    body: {
      model: MODEL_NAME, input: [{ role: 'user', content: [{ type: 'input_text', text: 'hi' }] }], instructions: 'Answer.',
      max_output_tokens: 5, temperature: 0.2, stream: true, store: true,
    },
  },
];

async function openaiTarget(mutator: Mutator): Promise<FuzzTarget> {
  const gateway = await startTestGateway(() => ({ steps: [gateway.tokens(' Hello'), gateway.tokens(' world')], finishReason: 'stop' }), {
    bodyLimitBytes: FUZZ_BODY_LIMIT_BYTES,
  });
  const nextCase = (): Case => {
    const { route, body } = mutator.pick(openaiBases);
    let tree = body;
    tree = mutated(mutator, tree, 1 + mutator.int(3));
    const headers: Record<string, string> = { 'content-type': 'application/json' };
    const { bytes, isBomb } = encodedBody(mutator, mutator.int(5) === 0 ? mutator.damage(serialize(tree)) : serialize(tree), headers);
    return async () => {
      const outcome = await httpOutcome(`${gateway.baseUrl}${route}`, { method: 'POST', headers, body: new Uint8Array(bytes) });
      return { ...bombOutcome(outcome, isBomb), request: `POST ${route} ${JSON.stringify(headers)} ${bytes.subarray(0, 300).toString('utf8')}` };
    };
  };
  return { nextCase, close: () => gateway.close() };
}

// ---- kserve-http --------------------------------------------------------------------------

const pixels = Array.from({ length: 64 }, (_, i) => (i % 17) / 16);
const rawPixels = Array.from({ length: 64 }, (_, i) => (i * 7) % 17);
const features = [0.1, 0.5, 0.2, 0.9, 0.3, 0.0, 1.0, 0.4];

const kserveJsonBases: { route: string; body: Json }[] = [
  {
    route: '/v2/models/digits/infer',
    body: {
      id: 'fuzz', parameters: { priority: 0 },
      inputs: [{ name: 'pixels', shape: [1, 64], datatype: 'FP32', data: pixels }],
      outputs: [{ name: 'probabilities', parameters: { binary_data: false } }],
    },
  },
  { route: '/v2/models/fraud/versions/1/infer', body: { inputs: [{ name: 'features', shape: [2, 8], datatype: 'FP32', data: [...features, ...features] }] } },
  {
    route: '/v2/models/digits_pipeline/infer',
    body: { inputs: [{ name: 'RAW_PIXELS', shape: [1, 64], datatype: 'UINT8', data: rawPixels }], outputs: [{ name: 'LABEL' }, { name: 'PROBABILITIES' }] },
  },
  { route: '/v2/repository/index', body: { ready: true } },
  // A model the repository does not hold: the body is parsed and checked, and nothing loads.
  { route: '/v2/repository/models/absent/load', body: { parameters: { config: '{"max_batch_size": 8}' } } },
];

/** Header lengths around the right one, and values no parser should take. */
function headerLengthFor(mutator: Mutator, right: number, bodyLength: number): string | null {
  return mutator.pick([
    String(right), String(right), null, '0', '-1', String(right - 1), String(right + 1), String(bodyLength), String(bodyLength + 10),
    'abc', '1e3', ` ${right}`, `${right}.0`, '', '0x10', '99999999999999999999', String(2 ** 31), `${right},${right}`,
  ]);
}

async function kserveHttpTarget(mutator: Mutator): Promise<FuzzTarget> {
  // Explicit mode, every model loaded: load requests are parsed rather than refused outright.
  const server = await startKServeServer(MODELS_DIR, 'explicit', ['*']);
  const nextCase = (): Case => {
    const binary = mutator.int(3) === 0;
    let route: string;
    let bytes: Buffer;
    const headers: Record<string, string> = { 'content-type': 'application/json' };
    if (binary) {
      // The binary extension: a JSON header, then the tensors' bytes, split where the header says.
      const [model, input, datatype, tensor] = mutator.pick([
        ['digits', 'pixels', 'FP32', Buffer.from(new Float32Array(pixels).buffer)],
        ['fraud', 'features', 'FP32', Buffer.from(new Float32Array(features).buffer)],
        ['digits_pipeline', 'RAW_PIXELS', 'UINT8', Buffer.from(rawPixels)],
      ] as const);
      route = `/v2/models/${model}/infer`;
      let header: Json = {
        inputs: [{ name: input, shape: [1, datatype === 'UINT8' ? 64 : tensor.byteLength / 4], datatype, parameters: { binary_data_size: tensor.byteLength } }],
        outputs: [{ name: model === 'digits_pipeline' ? 'LABEL' : model === 'digits' ? 'probabilities' : 'fraud_probability', parameters: { binary_data: true } }],
      };
      header = mutated(mutator, header, mutator.int(3));
      let tensorBytes: Buffer = tensor;
      if (mutator.int(4) === 0) tensorBytes = mutator.damage(tensor);
      const built = binaryBody(header, [tensorBytes]);
      bytes = mutator.int(8) === 0 ? mutator.damage(built.body) : built.body;
      const headerLength = headerLengthFor(mutator, built.headerLength, bytes.byteLength);
      headers['content-type'] = 'application/octet-stream';
      if (headerLength !== null) headers['inference-header-content-length'] = headerLength;
    } else {
      const base = mutator.pick(kserveJsonBases);
      route = base.route;
      let tree = base.body;
      tree = mutated(mutator, tree, 1 + mutator.int(3));
      bytes = mutator.int(5) === 0 ? mutator.damage(serialize(tree)) : serialize(tree);
    }
    const encoded = encodedBody(mutator, bytes, headers);
    return async () => {
      const outcome = await httpOutcome(`${server.baseUrl}${route}`, { method: 'POST', headers, body: new Uint8Array(encoded.bytes) });
      return { ...bombOutcome(outcome, encoded.isBomb), request: `POST ${route} ${JSON.stringify(headers)} ${encoded.bytes.subarray(0, 300).toString('utf8')}` };
    };
  };
  return { nextCase, close: () => server.close() };
}

// ---- kserve-grpc --------------------------------------------------------------------------

const grpcBases: Json[] = [
  {
    model_name: 'digits', model_version: '', id: 'fuzz',
    inputs: [{ name: 'pixels', datatype: 'FP32', shape: ['1', '64'], contents: { fp32_contents: pixels } }],
    outputs: [{ name: 'probabilities' }],
  },
  {
    model_name: 'fraud', model_version: '1',
    inputs: [{ name: 'features', datatype: 'FP32', shape: ['1', '8'] }],
    raw_input_contents: [Buffer.from(new Float32Array(features).buffer).toString('base64')],
    parameters: { priority: { int64_param: '0' }, timeout: { int64_param: '0' } },
  },
  {
    model_name: 'digits_pipeline',
    inputs: [{ name: 'RAW_PIXELS', datatype: 'UINT8', shape: ['1', '64'], contents: { uint_contents: rawPixels } }],
    outputs: [{ name: 'LABEL' }, { name: 'PROBABILITIES' }],
  },
];

/** Field values a ModelInfer request can hold that a server must refuse cleanly. */
const grpcOddFields: [string[], Json[]][] = [
  [['inputs', '0', 'datatype'], ['FP64', 'INT64', 'BYTES', 'BOOL', 'FP16', 'BF16', 'UINT8', 'INT8', 'garbage', '']],
  [['inputs', '0', 'shape'], [[], ['-1', '64'], ['0'], ['1', '1', '64'], ['9223372036854775807'], ['1', '-9223372036854775808'], ['4294967297', '64']]],
  [['inputs', '0', 'name'], ['', 'nope', 'pixels', 'features', 'RAW_PIXELS']],
  [['model_name'], ['', 'digits', 'fraud', 'nope', '../digits', 'digits_preprocess']],
  [['model_version'], ['', '1', '2', '-1', 'x', '99999999999999999999']],
  [['raw_input_contents'], [[], [''], ['AAAA'], ['AAAA', 'AAAA'], [Buffer.alloc(257).toString('base64')]]],
  [['inputs', '0', 'contents'], [{}, { int64_contents: ['1', '2'] }, { bytes_contents: ['AA=='] }, { bool_contents: [true] }, { fp64_contents: [1.5] }, { uint64_contents: ['18446744073709551615'] }]],
  [['parameters'], [{ sequence_id: { int64_param: '1' } }, { priority: { double_param: 1.5 } }, { timeout: { int64_param: '-1' } }, { binary_data_output: { bool_param: true } }]],
];

function setPath(tree: Json, at: string[], value: Json): Json {
  if (at.length === 0) return value;
  if (tree === null || typeof tree !== 'object') return tree;
  const copy: any = Array.isArray(tree) ? [...tree] : { ...tree };
  copy[at[0]] = setPath(copy[at[0]] ?? (at.length > 1 ? {} : null), at.slice(1), value);
  return copy;
}

/** The RPCs besides ModelInfer that read a model's name from their message, with a valid request of each. */
const grpcControlBases: [string, Json][] = [
  ['ModelReady', { name: 'digits', version: '' }],
  ['ModelMetadata', { name: 'digits', version: '1' }],
  ['ModelConfig', { name: 'digits_pipeline', version: '' }],
  ['ModelStatistics', { name: 'fraud', version: '1' }],
  ['RepositoryIndex', { repository_name: '', ready: true }],
  ['RepositoryModelLoad', { model_name: 'absent', parameters: { config: { string_param: '{"max_batch_size": 8}' } } }],
  // Administrative: a key that is not admin must be refused, whatever the message holds.
  ['LogSettings', { settings: { log_verbose_level: { uint32_param: 0 } } }],
  ['TraceSetting', { model_name: '', settings: {} }],
  ['SystemSharedMemoryRegister', { name: 'fuzz', key: '/fuzz_absent', offset: '0', byte_size: '8' }],
];

/** Who a call says it is: its authorization metadata, and what that allows. */
interface Caller { metadata: grpc.Metadata; describe: string; isKnown: boolean; isAdmin: boolean }

function callerFor(mutator: Mutator): Caller {
  const metadata = new grpc.Metadata();
  const [value, describe, isKnown, isAdmin] = mutator.pick([
    [null, 'no key', false, false],
    // Most calls carry a valid key, so that most reach the parsers behind the check.
    [`Bearer ${USER_KEY}`, 'a user key', true, false],
    [`Bearer ${USER_KEY}`, 'a user key', true, false],
    [`Bearer ${USER_KEY}`, 'a user key', true, false],
    [`Bearer ${ADMIN_KEY}`, 'an admin key', true, true],
    [`Bearer ${ADMIN_KEY}`, 'an admin key', true, true],
    [`bearer   ${ADMIN_KEY}`, 'an admin key, its scheme in lower case', true, true],
    ['Bearer wrong-key', 'a wrong key', false, false],
    [`Basic ${ADMIN_KEY}`, 'Basic auth', false, false],
    ['Bearer', 'an empty Bearer', false, false],
    [`Bearer ${ADMIN_KEY} ${ADMIN_KEY}`, 'a malformed Bearer', false, false],
  ] as const);
  // One value only: HTTP/2 refuses to send two (the client's session fails, every call on it with it).
  if (value !== null) metadata.set('authorization', value);
  return { metadata, describe, isKnown, isAdmin };
}

/** An OK the caller's key does not allow is an access-control failure, as a 5xx is a crash. */
function checkAccess(outcome: Outcome, rpc: string, caller: Caller): Outcome {
  if (outcome.label !== 'OK' && outcome.label !== 'stream OK') return outcome;
  if (!caller.isKnown) return { ...outcome, failed: true, detail: `${rpc} answered OK with ${caller.describe}` };
  if (ADMIN_RPCS.has(rpc) && !caller.isAdmin) return { ...outcome, failed: true, detail: `administrative ${rpc} answered OK with ${caller.describe}` };
  return outcome;
}

/** A ModelInfer request's bytes: a base with an odd field and mutations, sometimes damaged; and the tree it came from. */
function grpcInferBytes(mutator: Mutator, requestSerialize: (value: Json) => Buffer): { tree: Json; bytes: Buffer } {
  let tree = mutator.pick(grpcBases);
  if (mutator.int(2) === 0) {
    const [at, choices] = mutator.pick(grpcOddFields);
    tree = setPath(tree, at, mutator.pick(choices));
  }
  tree = mutated(mutator, tree, mutator.int(3));
  let bytes: Buffer;
  try {
    bytes = requestSerialize(tree);
  } catch {
    // Not a ModelInferRequest protobuf can hold (a string where a number goes): send a valid
    // request's bytes damaged instead.
    bytes = mutator.damage(requestSerialize(mutator.pick(grpcBases)));
  }
  // Raw damage: random bytes, truncation, insertion, through the generic call.
  if (mutator.int(3) === 0) bytes = mutator.damage(bytes);
  return { tree, bytes };
}

const describeBytes = (bytes: Buffer) => `${bytes.byteLength} bytes: ${bytes.subarray(0, 64).toString('hex')}`;

async function kserveGrpcTarget(mutator: Mutator): Promise<FuzzTarget> {
  // Explicit mode, every model loaded: load requests are parsed rather than refused outright.
  const repository = new ModelRepository({ repoDir: MODELS_DIR, mode: 'explicit', pollIntervalMs: 1000, startupModels: ['*'] });
  await repository.start();
  const access = new AccessControl({
    apiKeys: [{ name: 'fuzz-user', key: USER_KEY, limits: {} }, { name: 'fuzz-admin', key: ADMIN_KEY, role: 'admin', limits: {} }],
  });
  const server = await startKServeGrpc({
    repository, llms: [], version: '0.1.0', host: '127.0.0.1', port: 0, access, maxMessageBytes: FUZZ_BODY_LIMIT_BYTES,
  });
  const Service = loadInferenceService();
  const client = new grpc.Client(`127.0.0.1:${server.port}`, grpc.credentials.createInsecure(), { 'grpc.max_receive_message_length': -1 });
  // A second channel whose messages go gzip-compressed.
  const gzipClient = new grpc.Client(`127.0.0.1:${server.port}`, grpc.credentials.createInsecure(), {
    'grpc.max_receive_message_length': -1, 'grpc.default_compression_algorithm': grpc.compressionAlgorithms.gzip,
  });
  // A ModelInfer message of BOMB_BYTES zeros: a few hundred kilobytes once gzip-compressed.
  const grpcBomb = Service.service.ModelInfer.requestSerialize({
    model_name: 'fraud', inputs: [{ name: 'features', datatype: 'FP32', shape: ['1', '8'] }], raw_input_contents: [Buffer.alloc(BOMB_BYTES)],
  });
  const inferSerialize = Service.service.ModelInfer.requestSerialize;
  const identity = (bytes: Buffer) => bytes;
  const statusOutcome = (code: grpc.status, details: string, prefix = ''): Outcome => {
    const name = grpc.status[code] ?? String(code);
    const hung = code === grpc.status.DEADLINE_EXCEEDED;
    return { label: hung ? 'no answer' : `${prefix}${name}`, failed: GRPC_FAILURES.has(code) || hung, detail: `${prefix}${name}: ${details}` };
  };
  const send = (rpc: string, bytes: Buffer, caller: Caller, channel: grpc.Client): Promise<Outcome> => new Promise((resolve) => {
    channel.makeUnaryRequest(`/inference.GRPCInferenceService/${rpc}`, identity, identity, bytes, caller.metadata, { deadline: Date.now() + HANG_MS }, (err) => {
      const outcome = err === null ? { label: 'OK', failed: false, detail: '' } : statusOutcome(err.code, err.details);
      resolve(checkAccess(outcome, rpc, caller));
    });
  });
  // A stream answers each request once (unless triton_grpc_error ends it on the first error).
  const sendStream = (messages: Buffer[], statusOnError: boolean, caller: Caller, channel: grpc.Client): Promise<Outcome> => new Promise((resolve) => {
    const metadata = caller.metadata.clone();
    if (statusOnError) metadata.set('triton_grpc_error', 'true');
    const call = channel.makeBidiStreamRequest('/inference.GRPCInferenceService/ModelStreamInfer', identity, identity, metadata, { deadline: Date.now() + HANG_MS });
    let numResponses = 0;
    call.on('data', () => { numResponses++; });
    // Its status says it all.
    call.on('error', () => {});
    call.on('status', ({ code, details }: grpc.StatusObject) => {
      const outcome = statusOutcome(code, details, 'stream ');
      if (code === grpc.status.OK && !caller.isKnown) {
        resolve({ label: outcome.label, failed: true, detail: `stream OK with ${caller.describe}` });
      } else if (code === grpc.status.OK && numResponses !== messages.length) {
        resolve({ label: outcome.label, failed: true, detail: `stream OK with ${numResponses} responses to ${messages.length} requests` });
      } else resolve(outcome);
    });
    for (const message of messages) call.write(message);
    call.end();
  });
  const nextCase = (): Case => {
    const caller = callerFor(mutator);
    // 1 in 8 compressed.
    const channel = mutator.int(8) === 0 ? gzipClient : client;
    if (mutator.int(64) === 0) {
      return async () => {
        const outcome = await send('ModelInfer', grpcBomb, caller, gzipClient);
        // A known caller's bomb stops at the limit; an unknown caller's is refused first, or at the limit.
        const isRefused = outcome.label === 'RESOURCE_EXHAUSTED' || (!caller.isKnown && outcome.label === 'UNAUTHENTICATED');
        return { ...outcome, failed: outcome.failed || !isRefused, detail: isRefused ? outcome.detail : `a gzip bomb answered ${outcome.label}: ${outcome.detail}`,
          request: `ModelInfer gzip bomb (${grpcBomb.byteLength} bytes decompressed) with ${caller.describe}` };
      };
    }
    const kind = mutator.int(8);
    if (kind === 0) {
      const [rpc, base] = mutator.pick(grpcControlBases);
      let tree = base;
      tree = mutated(mutator, tree, 1 + mutator.int(3));
      const { requestSerialize } = Service.service[rpc];
      let bytes: Buffer;
      try {
        bytes = requestSerialize(tree);
      } catch {
        bytes = mutator.damage(requestSerialize(base));
      }
      if (mutator.int(3) === 0) bytes = mutator.damage(bytes);
      return async () => ({ ...(await send(rpc, bytes, caller, channel)), request: `${rpc} with ${caller.describe} ${JSON.stringify(tree).slice(0, 300)} (${describeBytes(bytes)})` });
    }
    if (kind <= 2) {
      const requests = Array.from({ length: 1 + mutator.int(3) }, () => grpcInferBytes(mutator, inferSerialize));
      const statusOnError = mutator.int(2) === 0;
      return async () => ({
        ...(await sendStream(requests.map(({ bytes }) => bytes), statusOnError, caller, channel)),
        request: `ModelStreamInfer with ${caller.describe}${statusOnError ? ' (triton_grpc_error)' : ''} ${requests.map(({ tree, bytes }) => `${JSON.stringify(tree).slice(0, 150)} (${describeBytes(bytes)})`).join('; ')}`,
      });
    }
    const { tree, bytes } = grpcInferBytes(mutator, inferSerialize);
    return async () => ({ ...(await send('ModelInfer', bytes, caller, channel)), request: `ModelInfer with ${caller.describe} ${JSON.stringify(tree).slice(0, 300)} (${describeBytes(bytes)})` });
  };
  return {
    nextCase,
    async close() {
      client.close();
      gzipClient.close();
      await server.close();
      await repository.close();
    },
  };
}

// ---- run ----------------------------------------------------------------------------------

async function runTarget(target: Target, count: number): Promise<boolean> {
  const mutator = new Mutator(rng(seed + TARGETS.indexOf(target)));
  const { nextCase, close } = target === 'openai' ? await openaiTarget(mutator)
    : target === 'kserve-http' ? await kserveHttpTarget(mutator)
    : await kserveGrpcTarget(mutator);
  const counts = new Map<string, number>();
  let numFailed = 0;
  let next = 0;
  let numDone = 0;
  const startMs = performance.now();
  const lane = async () => {
    while (next < count) {
      const index = next++;
      // Made here, in index order whichever lane takes it, so a seed replays case for case.
      const outcome = await nextCase()();
      counts.set(outcome.label, (counts.get(outcome.label) ?? 0) + 1);
      if (++numDone % 10_000 === 0) console.log(`  ${target}: ${numDone} / ${count} (${((performance.now() - startMs) / 1000).toFixed(0)} s)`);
      if (outcome.failed) {
        numFailed++;
        recordFailure(`${target}: ${outcome.detail.slice(0, 100)}`, `seed ${seed}, case ${index}: ${outcome.request}`);
      }
    }
  };
  await Promise.all(Array.from({ length: numInFlight }, lane));
  const seconds = (performance.now() - startMs) / 1000;
  const table = [...counts].sort(([a], [b]) => a.localeCompare(b)).map(([label, n]) => `${label}: ${n}`).join(', ');
  console.log(`${target}: ${count} cases in ${seconds.toFixed(1)} s (${(count / seconds).toFixed(0)}/s); ${table}; ${numFailed} failed`);
  // A server closes once its calls are over: one that does not is holding a call it never finished.
  let timer: NodeJS.Timeout | undefined;
  const closed = await Promise.race([close().then(() => true), new Promise<false>((resolve) => { timer = setTimeout(resolve, HANG_MS, false); })]);
  clearTimeout(timer);
  if (!closed) {
    numHungCloses++;
    recordFailure(`${target}: the server did not close within ${HANG_MS} ms: a call it never finished`, `seed ${seed}`);
  }
  return numFailed === 0 && closed;
}

async function main(): Promise<number> {
  const total = Number(values.count);
  console.log(`CPU: ${os.cpus()[0]?.model.trim()}, ${os.availableParallelism()} CPUs; ${new Date().toISOString()}`);
  console.log(`fuzz: ${total} cases over ${targets.join(', ')}, seed ${seed} (replay: --seed ${seed}), ${numInFlight} in flight`);
  let passed = true;
  for (const [i, target] of targets.entries()) {
    const count = Math.floor(total / targets.length) + (i < total % targets.length ? 1 : 0);
    passed = (await runTarget(target, count)) && passed;
  }
  for (const [kind, { count, example }] of failures) console.log(`  FAIL x${count} ${kind}\n    first: ${example}`);
  passed &&= numCrashes === 0;
  console.log(`fuzz: ${passed ? 'pass' : 'FAIL'} (${numCrashes} crashes)`);
  return passed ? 0 : 1;
}

const exitCode = await main();
// A server that never closed holds the process open; its failure is reported already.
if (numHungCloses > 0) process.exit(exitCode);
process.exitCode = exitCode;
