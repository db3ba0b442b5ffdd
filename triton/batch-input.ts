// Triton's batch inputs (ModelConfig.batch_input): tensors the server makes for each batch it
// forms, describing the requests in it, so a model taking ragged inputs (concatenated flat) can
// tell where each request's elements begin and end. Counts are per request, as Triton's backends
// compute them; element counts are of the request's whole source tensor (its batch dim included).
//   BATCH_ELEMENT_COUNT                       [n]: each request's element count
//   BATCH_ACCUMULATED_ELEMENT_COUNT           [n]: running totals
//   BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO [n + 1]: 0, then the running totals
//   BATCH_MAX_ELEMENT_COUNT_AS_SHAPE          [max count]: only the shape says anything (zeros)
//   BATCH_ITEM_SHAPE                          [items, rank - 1]: each batch item's shape (one per row)
//   BATCH_ITEM_SHAPE_FLATTEN                  [items * (rank - 1)]: the same, flat
import type { TensorMap } from './backend.ts';
import type { ModelConfig } from './model-config.ts';
import { elementCount, type Tensor } from './tensor.ts';

type BatchInputConfig = ModelConfig['batch_input'][number];

function tensorOf(spec: BatchInputConfig, shape: number[], values: number[]): Tensor {
  const data = spec.data_type === 'TYPE_FP32' ? Float32Array.from(values) : Int32Array.from(values);
  return { datatype: spec.data_type === 'TYPE_FP32' ? 'FP32' : 'INT32', shape, data };
}

function batchInput(spec: BatchInputConfig, requests: readonly TensorMap[], batched: boolean): Tensor {
  const sources = requests.map((inputs) => inputs[spec.source_input[0]]);
  const counts = sources.map((source) => elementCount(source.shape));
  let total = 0;
  const accumulated = counts.map((count) => (total += count));
  switch (spec.kind) {
    case 'BATCH_ELEMENT_COUNT': return tensorOf(spec, [counts.length], counts);
    case 'BATCH_ACCUMULATED_ELEMENT_COUNT': return tensorOf(spec, [counts.length], accumulated);
    case 'BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO': return tensorOf(spec, [counts.length + 1], [0, ...accumulated]);
    case 'BATCH_MAX_ELEMENT_COUNT_AS_SHAPE': {
      const max = Math.max(...counts);
      return tensorOf(spec, [max], new Array<number>(max).fill(0));
    }
    case 'BATCH_ITEM_SHAPE': case 'BATCH_ITEM_SHAPE_FLATTEN': {
      const itemShapes = sources.flatMap((source) => {
        const numItems = batched ? source.shape[0] : 1;
        const itemShape = batched ? source.shape.slice(1) : source.shape;
        return Array.from({ length: numItems }, () => itemShape);
      });
      const rank = itemShapes[0]?.length ?? 0;
      const values = itemShapes.flat();
      return tensorOf(spec, spec.kind === 'BATCH_ITEM_SHAPE' ? [itemShapes.length, rank] : [values.length], values);
    }
  }
}

/** The batch inputs of one batch, by target name; empty when the model has none. */
export function batchInputsOf(config: ModelConfig, requests: readonly TensorMap[]): TensorMap {
  const tensors: TensorMap = {};
  for (const spec of config.batch_input) {
    const tensor = batchInput(spec, requests, config.max_batch_size > 0);
    for (const target of spec.target_name) tensors[target] = tensor;
  }
  return tensors;
}
