// FP32 [N, 10] probabilities -> BYTES [N, 1]: the argmax digit as text ("0" ... "9").
import type { TensorMap } from '../../../triton/backend.ts';

const LABELS = Array.from({ length: 10 }, (_, digit) => new TextEncoder().encode(String(digit)));

export function execute(inputs: TensorMap): TensorMap {
  const probs = inputs.PROBABILITIES;
  const numRows = probs.shape[0];
  const numClasses = probs.shape[1];
  const data = probs.data as Float32Array;
  const labels: Uint8Array[] = [];
  for (let row = 0; row < numRows; row++) {
    let best = 0;
    for (let c = 1; c < numClasses; c++) if (data[row * numClasses + c] > data[row * numClasses + best]) best = c;
    labels.push(LABELS[best]);
  }
  return { LABEL: { datatype: 'BYTES', shape: [numRows, 1], data: labels } };
}
