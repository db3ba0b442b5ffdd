// Triton's model warmup (ModelConfig.model_warmup): sample requests run on every instance at
// load, before the version serves, so the first real request does not pay for lazy
// initialization. Each sample's inputs are zero_data, random_data or input_data_file (one batch
// item's raw bytes, the binary extension's layout, in `<model>/warmup/<file>`, repeated
// batch_size times); a sample runs `count` times
// (0 means once). Warmup requests go straight to the instances: they are not in the statistics.
// A sample that fails validation or execution fails the load, naming the sample.
import { readFileSync } from 'node:fs';
import type { ModelInstance, TensorMap } from './backend.ts';
import { batchInputsOf } from './batch-input.ts';
import { fromConfigDataType, type DataType } from './datatype.ts';
import { ClassicError } from './errors.ts';
import { fileInRepository, shownPath } from './repository-paths.ts';
import type { ModelConfig } from './model-config.ts';
import { allocate, concatBatch, elementCount, fromRaw, TensorError, type Tensor } from './tensor.ts';
import { warmupSequenceInputs } from './sequence-inputs.ts';
import { validateRequest } from './validate.ts';

type WarmupSample = ModelConfig['model_warmup'][number];
type WarmupInput = WarmupSample['inputs'][string];

/** Deterministic filler for random_data (xorshift32): warmup needs plausible values, not entropy. */
function randomFiller(seed: number): () => number {
  let state = seed || 0x9e3779b9;
  return () => {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    return (state >>> 0) / 0x100000000;
  };
}

function randomTensor(datatype: DataType, shape: number[], random: () => number): Tensor {
  const numElements = elementCount(shape);
  const data = allocate(datatype, numElements);
  if (datatype === 'BYTES') return { datatype, shape, data };
  for (let i = 0; i < numElements; i++) {
    const value = random();
    switch (datatype) {
      case 'FP32': case 'FP64': (data as Float32Array)[i] = value; break;
      // Bit patterns of values in [0, 1): never NaN or infinite.
      case 'FP16': (data as Uint16Array)[i] = Math.floor(value * 0x3c00); break;
      case 'BF16': (data as Uint16Array)[i] = Math.floor(value * 0x3f80); break;
      case 'BOOL': (data as Uint8Array)[i] = value < 0.5 ? 0 : 1; break;
      case 'INT64': case 'UINT64': (data as BigInt64Array)[i] = BigInt(Math.floor(value * 128)); break;
      default: (data as Int32Array)[i] = Math.floor(value * 128);
    }
  }
  return { datatype, shape, data };
}

function sampleTensor(config: ModelConfig, modelDir: string, sample: WarmupSample, name: string, input: WarmupInput, seed: number): Tensor {
  const datatype = fromConfigDataType(input.data_type);
  const shape = config.max_batch_size > 0 ? [sample.batch_size, ...input.dims] : [...input.dims];
  if (input.zero_data === true) return { datatype, shape, data: allocate(datatype, elementCount(shape)) };
  // Random text is no more useful than empty text: BYTES get empty elements, as in Triton.
  if (input.random_data === true) return randomTensor(datatype, shape, randomFiller(seed));
  const parts = ['warmup', input.input_data_file!];
  let bytes: Buffer;
  try {
    bytes = readFileSync(fileInRepository(modelDir, ...parts));
  } catch (err) {
    if (err instanceof ClassicError) throw err;
    throw new ClassicError('INVALID_ARG', `input '${name}': cannot read ${shownPath(modelDir, ...parts)}: ${(err as NodeJS.ErrnoException).code ?? 'error'}`);
  }
  // The file holds one batch item, repeated batch_size times, as Triton does.
  const item = fromRaw(datatype, [...input.dims], bytes, `input '${name}' (${input.input_data_file})`);
  if (config.max_batch_size === 0) return item;
  const row = { ...item, shape: [1, ...item.shape] };
  return concatBatch(Array.from({ length: sample.batch_size }, () => row));
}

/** Runs every warmup sample on every instance; throws (failing the load) on the first failure. */
export async function warmUp(config: ModelConfig, modelDir: string, instances: readonly ModelInstance[]): Promise<void> {
  for (const [sampleIndex, sample] of config.model_warmup.entries()) {
    try {
      const inputs: TensorMap = {};
      for (const [name, input] of Object.entries(sample.inputs)) inputs[name] = sampleTensor(config, modelDir, sample, name, input, sampleIndex + 1);
      validateRequest(config, inputs, null);
      // The sample is a batch of its own: it gets the batch inputs the batcher would make.
      const numRows = config.max_batch_size > 0 ? sample.batch_size : 1;
      Object.assign(inputs, batchInputsOf(config, [{ ...inputs }]), warmupSequenceInputs(config, modelDir, numRows));
      for (const instance of instances) {
        for (let run = 0; run < Math.max(1, sample.count); run++) await instance.execute(inputs);
      }
    } catch (err) {
      const message = err instanceof ClassicError || err instanceof TensorError ? err.message : String(err);
      throw new ClassicError('INVALID_ARG', `model '${config.name}': warmup sample '${sample.name}' failed: ${message}`);
    }
  }
}
