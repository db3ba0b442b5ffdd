// The HTTP infer body in both forms: JSON, and JSON followed by raw tensors (the binary tensor
// data extension: Inference-Header-Content-Length, binary_data_size on inputs, binary_data on
// outputs; a header length of 0 is a raw binary request of the model's one input). Inputs and
// outputs may instead name a system shared-memory region (shared_memory_region and friends).
import { z } from 'zod';
import {
  bytesPerElement, ClassicError, elementCount, fromConfigDataType, fromJson, fromRaw, isDataType, rawByteLength, toJson, writeRaw,
  type ModelConfig, type SequenceFlags, type Tensor, type TensorMap,
} from '../../triton/index.ts';
import { sequenceOfJson } from './sequence-params.ts';
import { readSharedMemoryInput, sharedMemoryRefOf, type SharedMemoryLease, type SharedMemoryAccess } from './shared-memory.ts';

const parameterValue = z.union([z.string(), z.number(), z.boolean()]);
const parameters = z.record(z.string(), parameterValue);

const requestSchema = z.object({
  id: z.string().optional(),
  parameters: parameters.optional(),
  inputs: z.array(z.object({
    name: z.string(),
    shape: z.array(z.number().int().nonnegative()),
    datatype: z.string(),
    parameters: parameters.optional(),
    data: z.unknown().optional(),
  })).min(1),
  outputs: z.array(z.object({ name: z.string(), parameters: parameters.optional() })).optional(),
});

export interface RequestedOutput {
  name: string;
  binary: boolean;
  /** Set when the output goes into a shared-memory region: the response carries no data for it. */
  sharedMemory: SharedMemoryLease | null;
  /** The classification extension's class count; 0: the tensor itself. */
  classification?: number;
}

export interface DecodedInferRequest {
  id: string;
  inputs: TensorMap;
  /** null: every output, in the config's order. */
  outputs: RequestedOutput[] | null;
  binaryByDefault: boolean;
  priority: number;
  timeoutUs: number;
  sequence?: SequenceFlags;
}

const invalid = (message: string) => new ClassicError('INVALID_ARG', message);

function zodMessage(error: z.ZodError): string {
  const issue = error.issues[0];
  return `${issue.path.length > 0 ? issue.path.join('.') : 'request'}: ${issue.message}`;
}

function nonNegativeInteger(value: unknown, name: string): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < 0) throw invalid(`parameter '${name}' must be a non-negative integer`);
  return value;
}

/** A raw binary request: the body is the model's only input, batch 1, all outputs binary. */
function decodeRawRequest(body: Uint8Array, config: ModelConfig): DecodedInferRequest {
  if (config.input.length !== 1) {
    throw invalid(`raw binary request requires the model to have exactly one input, '${config.name}' has ${config.input.length}`);
  }
  const input = config.input[0];
  const shape = config.max_batch_size > 0 ? [1, ...input.dims] : [...input.dims];
  const datatype = fromConfigDataType(input.data_type);
  if (shape.includes(-1)) {
    if (datatype === 'BYTES' || shape.filter((dim) => dim === -1).length > 1) throw invalid(`raw binary request cannot infer the shape of input '${input.name}'`);
    const known = elementCount(shape.filter((dim) => dim !== -1));
    const rowBytes = known * bytesPerElement(datatype);
    shape[shape.indexOf(-1)] = body.byteLength / rowBytes;
  }
  return {
    id: '', inputs: { [input.name]: fromRaw(datatype, shape, body, `input '${input.name}'`) }, outputs: null,
    binaryByDefault: true, priority: 0, timeoutUs: 0,
  };
}

/** Releases the shared-memory regions the outputs of a request that failed to decode hold. */
function releaseOutputs(outputs: RequestedOutput[] | null): void {
  for (const output of outputs ?? []) output.sharedMemory?.release();
}

/** header: the JSON before the binary tensors (or the whole body), already parsed (gateway/json-body.ts). */
export function decodeInferRequest(
  body: Uint8Array, headerLength: number | null, header: unknown, config: ModelConfig, sharedMemory: SharedMemoryAccess,
): DecodedInferRequest {
  if (headerLength === 0) return decodeRawRequest(body, config);
  const jsonLength = headerLength ?? body.byteLength;
  if (jsonLength > body.byteLength) {
    throw invalid(`Inference-Header-Content-Length ${jsonLength} is larger than the body (${body.byteLength} bytes)`);
  }
  const parsed = requestSchema.safeParse(header);
  if (!parsed.success) throw invalid(`invalid inference request: ${zodMessage(parsed.error)}`);
  const request = parsed.data;
  const params = request.parameters ?? {};
  const sequence = sequenceOfJson(params);
  if (params.binary_data_output !== undefined && typeof params.binary_data_output !== 'boolean') {
    throw invalid("parameter 'binary_data_output' must be a boolean");
  }
  let offset = jsonLength;
  const inputs: TensorMap = {};
  for (const input of request.inputs) {
    const what = `input '${input.name}'`;
    if (!isDataType(input.datatype)) throw invalid(`${what}: invalid datatype '${input.datatype}'`);
    if (inputs[input.name] !== undefined) throw invalid(`input '${input.name}' is given more than once`);
    const binarySize = input.parameters?.binary_data_size;
    const shmRef = sharedMemoryRefOf(input.parameters, what);
    let tensor: Tensor;
    if (shmRef !== null) {
      if (input.data !== undefined || binarySize !== undefined) throw invalid(`${what} has both shared memory and data`);
      tensor = readSharedMemoryInput(sharedMemory, shmRef, input.datatype, input.shape, what);
    } else if (binarySize !== undefined) {
      const numBytes = nonNegativeInteger(binarySize, 'binary_data_size');
      if (input.data !== undefined) throw invalid(`${what} has both data and binary_data_size`);
      if (offset + numBytes > body.byteLength) throw invalid(`${what}: binary_data_size ${numBytes} runs past the end of the body`);
      tensor = fromRaw(input.datatype, input.shape, body.subarray(offset, offset + numBytes), what);
      offset += numBytes;
    } else {
      if (input.data === undefined) throw invalid(`${what} has no data and no binary_data_size`);
      tensor = fromJson(input.datatype, input.shape, input.data, what);
    }
    inputs[input.name] = tensor;
  }
  if (offset !== body.byteLength) throw invalid(`the body has ${body.byteLength - offset} bytes after the last input's binary data`);
  const binaryByDefault = params.binary_data_output === true;
  const outputs: RequestedOutput[] | null = request.outputs === undefined ? null : [];
  try {
    for (const output of request.outputs ?? []) {
      const binary = output.parameters?.binary_data;
      if (binary !== undefined && typeof binary !== 'boolean') throw invalid(`output '${output.name}': binary_data must be a boolean`);
      const classification = output.parameters?.classification;
      if (classification !== undefined && (typeof classification !== 'number' || !Number.isSafeInteger(classification) || classification < 1)) {
        throw invalid(`output '${output.name}': classification must be a positive integer (the number of classes)`);
      }
      const shmRef = sharedMemoryRefOf(output.parameters, `output '${output.name}'`);
      // Held from now on, so an unregister while the model runs cannot pull the region away.
      outputs!.push({
        name: output.name, binary: binary ?? binaryByDefault, sharedMemory: shmRef === null ? null : sharedMemory.lease(shmRef), classification: classification ?? 0,
      });
    }
  } catch (err) {
    releaseOutputs(outputs);
    throw err;
  }
  return {
    id: request.id ?? '',
    inputs,
    outputs,
    binaryByDefault,
    priority: params.priority === undefined ? 0 : nonNegativeInteger(params.priority, 'priority'),
    timeoutUs: params.timeout === undefined ? 0 : nonNegativeInteger(params.timeout, 'timeout'),
    sequence,
  };
}

export interface EncodedInferResponse {
  body: Buffer;
  /** Set when binary outputs follow the JSON. */
  jsonLength: number | null;
}

export function encodeInferResponse(
  modelName: string, version: number, id: string, outputs: TensorMap, order: RequestedOutput[],
): EncodedInferResponse {
  const binaries: Tensor[] = [];
  let numBinaryBytes = 0;
  const json = {
    ...(id === '' ? {} : { id }),
    model_name: modelName,
    model_version: String(version),
    outputs: order.map(({ name, binary, sharedMemory }) => {
      const tensor = outputs[name];
      const head = { name, datatype: tensor.datatype, shape: tensor.shape };
      if (sharedMemory !== null) return head;
      if (!binary) return { ...head, data: toJson(tensor) };
      const numBytes = rawByteLength(tensor);
      binaries.push(tensor);
      numBinaryBytes += numBytes;
      return { ...head, parameters: { binary_data_size: numBytes } };
    }),
  };
  const header = Buffer.from(JSON.stringify(json));
  if (binaries.length === 0) return { body: header, jsonLength: null };
  const body = Buffer.allocUnsafe(header.byteLength + numBinaryBytes);
  header.copy(body, 0);
  let offset = header.byteLength;
  for (const tensor of binaries) offset = writeRaw(tensor, body, offset);
  return { body, jsonLength: header.byteLength };
}
