// The LLMs over gRPC: ModelInfer answers once with the whole text; ModelStreamInfer with `stream`
// answers once per text chunk and flags the last response `triton_final_response`, as Triton's
// decoupled models do (llm-models.ts holds what both protocols share).
import { toRaw, type TensorMap } from '../../triton/index.ts';
import type { LoadedModel } from '../served-model.ts';
import type { SharedMemoryAccess } from './shared-memory.ts';
import { decodeInputs, type WireInputTensor, type WireParameter } from './grpc-tensors.ts';
import type { KServeLlms } from './llm-models.ts';

export interface WireLlmRequest {
  id: string;
  parameters: Record<string, WireParameter>;
  inputs: WireInputTensor[];
  outputs: Array<{ name: string }>;
  raw_input_contents: Uint8Array[];
}

/** Parameters as plain values: int64s arrive as decimal strings (the protos load with longs: String). */
function parameterValues(parameters: Record<string, WireParameter>): Record<string, unknown> {
  const values: Record<string, unknown> = {};
  for (const [name, parameter] of Object.entries(parameters)) {
    const choice = parameter.parameter_choice as keyof WireParameter | undefined;
    if (choice === undefined) continue;
    const value = parameter[choice];
    values[name] = choice === 'int64_param' || choice === 'uint64_param' ? Number(value) : value;
  }
  return values;
}

function responseOf(model: LoadedModel, id: string, outputs: TensorMap, final: boolean | null) {
  const names = Object.keys(outputs);
  return {
    model_name: model.name,
    model_version: '1',
    id,
    ...(final === null ? {} : { parameters: { triton_final_response: { bool_param: final } } }),
    outputs: names.map((name) => ({ name, datatype: outputs[name].datatype, shape: outputs[name].shape })),
    raw_output_contents: names.map((name) => toRaw(outputs[name])),
  };
}

/**
 * One request for an LLM. With onResponse (a stream), a `stream` request sends each chunk through
 * it and resolves with the final response; without it, a `stream` request is refused.
 */
export async function runLlmInfer(
  llms: KServeLlms, model: LoadedModel, request: WireLlmRequest, sharedMemory: SharedMemoryAccess, signal: AbortSignal,
  onResponse?: (response: ReturnType<typeof responseOf>) => void,
) {
  const inputs = decodeInputs(request.inputs, request.raw_input_contents, sharedMemory);
  const infer = { id: request.id, inputs, parameters: parameterValues(request.parameters), requestedOutputs: request.outputs.map((o) => o.name) };
  const streamed = onResponse !== undefined && llms.isStreamed(infer);
  const outputs = await llms.infer(model, infer, streamed ? { onChunk: (chunk) => onResponse(responseOf(model, request.id, chunk, false)) } : {}, signal);
  return responseOf(model, request.id, outputs, streamed ? true : null);
}
