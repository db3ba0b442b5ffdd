// UINT8 [N, 64] pixels (0-255) -> FP32 [N, 64] in [0, 1], the input `digits` was trained on.
import type { TensorMap } from '../../../triton/backend.ts';

export function execute(inputs: TensorMap): TensorMap {
  const raw = inputs.RAW_PIXELS;
  const pixels = new Float32Array(raw.data.length);
  const bytes = raw.data as Uint8Array;
  for (let i = 0; i < bytes.length; i++) pixels[i] = bytes[i] / 255;
  return { PIXELS: { datatype: 'FP32', shape: raw.shape, data: pixels } };
}
