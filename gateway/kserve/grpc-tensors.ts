// gRPC tensor contents to and from plain tensors: `raw_input_contents` (little-endian, as the
// HTTP binary extension) or the typed `contents` fields, never both; outputs always raw, one
// `raw_output_contents` entry per output, which is what Triton's clients read. An input may name
// a system shared-memory region instead; raw_input_contents then holds the other inputs' bytes.
import { ClassicError, elementCount, fromRaw, isDataType, type DataType, type Tensor } from '../../triton/index.ts';
import { readSharedMemoryInput, sharedMemoryRefOf, type SharedMemoryAccess } from './shared-memory.ts';

/** InferParameter as @grpc/proto-loader decodes it (oneofs: the set field's name in parameter_choice). */
export type WireParameter = { parameter_choice?: string; bool_param?: boolean; int64_param?: string; string_param?: string; double_param?: number; uint64_param?: string };

/** A parameter map as plain values (64-bit integers as their decimal strings, as the loader gives them). */
export function plainParameters(parameters: Record<string, WireParameter>): Record<string, unknown> {
  const plain: Record<string, unknown> = {};
  for (const [name, parameter] of Object.entries(parameters)) {
    const choice = parameter.parameter_choice as keyof WireParameter | undefined;
    plain[name] = choice === undefined ? undefined : parameter[choice];
  }
  return plain;
}

/** InferTensorContents as @grpc/proto-loader decodes it (longs as strings). */
export interface WireContents {
  bool_contents: boolean[];
  int_contents: number[];
  int64_contents: string[];
  uint_contents: number[];
  uint64_contents: string[];
  fp32_contents: number[];
  fp64_contents: number[];
  bytes_contents: Uint8Array[];
}

export interface WireInputTensor {
  name: string;
  datatype: string;
  shape: string[];
  parameters: Record<string, WireParameter>;
  contents: WireContents | null;
}

const invalid = (message: string) => new ClassicError('INVALID_ARG', message);

function typedContents(datatype: DataType, shape: number[], contents: WireContents | null, what: string): Tensor {
  const numElements = elementCount(shape);
  const pick = <T>(values: T[] | undefined, field: string): T[] => {
    const list = values ?? [];
    if (list.length !== numElements) {
      throw invalid(`${what}: expected ${numElements} elements in ${field} for shape [${shape.join(',')}], got ${list.length}`);
    }
    return list;
  };
  switch (datatype) {
    case 'BOOL': return { datatype, shape, data: Uint8Array.from(pick(contents?.bool_contents, 'bool_contents'), (v) => (v ? 1 : 0)) };
    case 'INT8': return { datatype, shape, data: Int8Array.from(pick(contents?.int_contents, 'int_contents')) };
    case 'INT16': return { datatype, shape, data: Int16Array.from(pick(contents?.int_contents, 'int_contents')) };
    case 'INT32': return { datatype, shape, data: Int32Array.from(pick(contents?.int_contents, 'int_contents')) };
    case 'INT64': return { datatype, shape, data: BigInt64Array.from(pick(contents?.int64_contents, 'int64_contents'), (v) => BigInt(v)) };
    case 'UINT8': return { datatype, shape, data: Uint8Array.from(pick(contents?.uint_contents, 'uint_contents')) };
    case 'UINT16': return { datatype, shape, data: Uint16Array.from(pick(contents?.uint_contents, 'uint_contents')) };
    case 'UINT32': return { datatype, shape, data: Uint32Array.from(pick(contents?.uint_contents, 'uint_contents')) };
    case 'UINT64': return { datatype, shape, data: BigUint64Array.from(pick(contents?.uint64_contents, 'uint64_contents'), (v) => BigInt(v)) };
    case 'FP32': return { datatype, shape, data: Float32Array.from(pick(contents?.fp32_contents, 'fp32_contents')) };
    case 'FP64': return { datatype, shape, data: Float64Array.from(pick(contents?.fp64_contents, 'fp64_contents')) };
    case 'BYTES': return { datatype, shape, data: pick(contents?.bytes_contents, 'bytes_contents').map((b) => new Uint8Array(b)) };
    case 'FP16': case 'BF16':
      throw invalid(`${what}: ${datatype} must be sent in raw_input_contents`);
  }
}

function hasContents(contents: WireContents | null): boolean {
  if (contents === null) return false;
  return Object.values(contents).some((list) => Array.isArray(list) && list.length > 0);
}

export function decodeInputs(inputs: WireInputTensor[], raw: Uint8Array[], sharedMemory: SharedMemoryAccess): Record<string, Tensor> {
  const refs = inputs.map((input) => sharedMemoryRefOf(plainParameters(input.parameters ?? {}), `input '${input.name}'`));
  const numRawInputs = refs.filter((ref) => ref === null).length;
  if (raw.length > 0 && raw.length !== numRawInputs) {
    throw invalid(`raw_input_contents has ${raw.length} entries for ${numRawInputs} inputs not in shared memory`);
  }
  const tensors: Record<string, Tensor> = {};
  let rawIndex = 0;
  inputs.forEach((input, i) => {
    const what = `input '${input.name}'`;
    if (!isDataType(input.datatype)) throw invalid(`${what}: invalid datatype '${input.datatype}'`);
    const shape = input.shape.map(Number);
    if (shape.some((dim) => !Number.isSafeInteger(dim) || dim < 0)) throw invalid(`${what}: invalid shape [${input.shape.join(',')}]`);
    if (tensors[input.name] !== undefined) throw invalid(`${what} is given more than once`);
    const ref = refs[i];
    if (ref !== null) {
      if (hasContents(input.contents)) throw invalid(`contents field must not be specified when using shared memory for '${input.name}'`);
      tensors[input.name] = readSharedMemoryInput(sharedMemory, ref, input.datatype, shape, what);
    } else if (raw.length > 0) {
      if (hasContents(input.contents)) {
        throw invalid(`contents field must not be specified when using raw_input_contents for '${input.name}' for model`);
      }
      tensors[input.name] = fromRaw(input.datatype, shape, raw[rawIndex++], what);
    } else {
      tensors[input.name] = typedContents(input.datatype, shape, input.contents, what);
    }
  });
  return tensors;
}
