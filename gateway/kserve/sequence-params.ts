// The sequence parameters of an infer request (sequence_id, sequence_start, sequence_end) in
// their two wire forms, with Triton's messages for values of the wrong type
// (src/http_server.cc, src/grpc/infer_handler.cc). A request without them has no sequence;
// sequence_id 0 or "" is "no correlation ID", which a stateful model refuses.
import { ClassicError, type SequenceFlags } from '../../triton/index.ts';
import type { WireParameter } from './grpc-tensors.ts';

const invalid = (message: string) => new ClassicError('INVALID_ARG', message);

/** KServe v2 JSON `parameters`: sequence_id an unsigned integer or a string, the flags booleans. */
export function sequenceOfJson(params: Record<string, unknown>): SequenceFlags | undefined {
  const { sequence_id: id, sequence_start: start, sequence_end: end } = params;
  if (id === undefined && start === undefined && end === undefined) return undefined;
  if (id !== undefined && typeof id !== 'string' && !(typeof id === 'number' && Number.isInteger(id) && id >= 0)) {
    throw invalid("Unable to parse 'sequence_id': expected an unsigned integer or a string");
  }
  // JSON.parse has already rounded a larger number: refuse it rather than address another sequence.
  if (typeof id === 'number' && !Number.isSafeInteger(id)) {
    throw invalid(`Unable to parse 'sequence_id': ${id} is larger than 2^53 - 1, the largest integer a JSON body carries exactly; send it over gRPC (uint64_param)`);
  }
  for (const [name, value] of [['sequence_start', start], ['sequence_end', end]] as const) {
    if (value !== undefined && typeof value !== 'boolean') throw invalid(`Unable to parse '${name}': expected a boolean`);
  }
  return { id: typeof id === 'string' ? id : BigInt(id ?? 0), start: start === true, end: end === true };
}

/** ModelInferRequest parameters: sequence_id int64_param, uint64_param or string_param, the flags bool_param. */
export function sequenceOfGrpc(params: Record<string, WireParameter>): SequenceFlags | undefined {
  const { sequence_id: id, sequence_start: start, sequence_end: end } = params;
  if (id === undefined && start === undefined && end === undefined) return undefined;
  let value: bigint | string = 0n;
  if (id !== undefined) {
    if (id.parameter_choice === 'string_param') value = id.string_param!;
    else if (id.parameter_choice === 'int64_param' || id.parameter_choice === 'uint64_param') value = BigInt(id[id.parameter_choice]!);
    else throw invalid("invalid value type for 'sequence_id' parameter, expected int64_param, uint64_param or string_param.");
    if (typeof value === 'bigint' && value < 0n) throw invalid(`invalid value for 'sequence_id' parameter: ${value} is negative; a sequence id is an unsigned integer or a string.`);
  }
  const flag = (name: string, parameter: WireParameter | undefined) => {
    if (parameter === undefined) return false;
    if (parameter.parameter_choice !== 'bool_param') throw invalid(`invalid value type for '${name}' parameter, expected bool_param.`);
    return parameter.bool_param === true;
  };
  return { id: value, start: flag('sequence_start', start), end: flag('sequence_end', end) };
}
