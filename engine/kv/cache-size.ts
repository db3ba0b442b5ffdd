// How many bytes one KV block takes, from config.json alone: the worker must size its cache
// in blocks before the runtime loads. Mirrors the runtime's layout (native/README.md): every
// layer holds K and V for each KV head, block slot and head dimension.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import type { DtypeSetting, WeightDtype } from '../../native/api.ts';

const BYTES_PER_ELEMENT: Readonly<Record<WeightDtype, number>> = { fp32: 4, bf16: 2, fp16: 2 };
const TORCH_DTYPES: Readonly<Record<string, WeightDtype>> = { float32: 'fp32', bfloat16: 'bf16', float16: 'fp16' };

function positiveInteger(config: Record<string, unknown>, key: string, file: string): number {
  const value = config[key];
  if (!(Number.isInteger(value) && (value as number) > 0)) {
    throw new Error(`${file}: expected a positive integer for ${key} but received ${JSON.stringify(value)}`);
  }
  return value as number;
}

export function kvBytesPerBlock(
  modelDir: string,
  dtype: DtypeSetting,
  kvCacheDtype: DtypeSetting,
  blockSizeTokens: number,
): number {
  const file = path.join(modelDir, 'config.json');
  const config = JSON.parse(readFileSync(file, 'utf8')) as Record<string, unknown>;
  const numLayers = positiveInteger(config, 'num_hidden_layers', file);
  const numHeads = positiveInteger(config, 'num_attention_heads', file);
  const numKvHeads = config.num_key_value_heads === undefined ? numHeads : positiveInteger(config, 'num_key_value_heads', file);
  const headDim = config.head_dim === undefined
    ? positiveInteger(config, 'hidden_size', file) / numHeads
    : positiveInteger(config, 'head_dim', file);
  const weightDtype = dtype === 'auto' ? TORCH_DTYPES[String(config.torch_dtype)] : dtype;
  const cacheDtype = kvCacheDtype === 'auto' ? weightDtype : kvCacheDtype;
  // Without torch_dtype the runtime follows the stored tensors; assuming the widest keeps the
  // cache within its byte budget whatever they turn out to be.
  const bytesPerElement = cacheDtype === undefined ? BYTES_PER_ELEMENT.fp32 : BYTES_PER_ELEMENT[cacheDtype];
  return 2 * numLayers * numKvHeads * headDim * blockSizeTokens * bytesPerElement;
}
