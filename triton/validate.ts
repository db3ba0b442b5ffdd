// Checks a request against its model's config before it is queued, with Triton's messages.
import type { TensorMap } from './backend.ts';
import { fromConfigDataType } from './datatype.ts';
import { ClassicError } from './errors.ts';
import type { ModelConfig } from './model-config.ts';

const BATCH_DIM_NOTE = 'NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be prepended to each input shape. If you want to specify the full shape including the batch dim in your input dims config, try setting max_batch_size to zero. See the model configuration docs for more info on max_batch_size.';

function shapeMatches(shape: readonly number[], dims: readonly number[]): boolean {
  return shape.length === dims.length && dims.every((dim, i) => dim === -1 || dim === shape[i]);
}

/** Returns the request's batch size (1 when the model does not batch). */
export function validateRequest(config: ModelConfig, inputs: TensorMap, requestedOutputs: readonly string[] | null): number {
  const model = config.name;
  const batched = config.max_batch_size > 0;
  let batchSize = 0;
  for (const [name, tensor] of Object.entries(inputs)) {
    const declared = config.input.find((input) => input.name === name);
    if (declared === undefined) throw new ClassicError('INVALID_ARG', `unexpected inference input '${name}' for model '${model}'`);
    const expectedType = fromConfigDataType(declared.data_type);
    if (tensor.datatype !== expectedType) {
      throw new ClassicError('INVALID_ARG', `inference input '${name}' data-type is '${tensor.datatype}', but model '${model}' expects '${expectedType}'`);
    }
    const expected = batched ? [-1, ...declared.dims] : declared.dims;
    if (!declared.allow_ragged_batch && !shapeMatches(tensor.shape, expected)) {
      throw new ClassicError('INVALID_ARG', `unexpected shape for input '${name}' for model '${model}'. Expected [${expected.join(',')}], got [${tensor.shape.join(',')}]. ${batched ? BATCH_DIM_NOTE : ''}`.trimEnd());
    }
    if (batched) {
      const rows = tensor.shape[0];
      if (batchSize !== 0 && rows !== batchSize) {
        throw new ClassicError('INVALID_ARG', `input '${name}' has batch size ${rows}, but another input of model '${model}' has ${batchSize}`);
      }
      batchSize = rows;
    }
  }
  const missing = config.input.filter((input) => !input.optional && inputs[input.name] === undefined).map((input) => input.name);
  if (missing.length > 0) {
    throw new ClassicError('INVALID_ARG', `expected ${config.input.length} inputs but got ${Object.keys(inputs).length} inputs for model '${model}'. Got input(s) [${Object.keys(inputs).map((n) => `'${n}'`).join(', ')}], but missing required input(s) [${missing.map((n) => `'${n}'`).join(', ')}]. Please provide all required input(s).`);
  }
  if (batched && (batchSize < 1 || batchSize > config.max_batch_size)) {
    throw new ClassicError('INVALID_ARG', `inference request batch-size must be <= ${config.max_batch_size} for '${model}'${batchSize < 1 ? ' and at least 1' : ''}`);
  }
  for (const name of requestedOutputs ?? []) {
    if (!config.output.some((output) => output.name === name)) throw new ClassicError('INVALID_ARG', `unexpected inference output '${name}' for model '${model}'`);
  }
  return batched ? batchSize : 1;
}
