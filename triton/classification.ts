// Triton's classification extension: an output asked for with `classification: k` comes back as
// BYTES, the k largest values of each batch row (of the whole tensor without batching) as
// "value:index" or "value:index:label", labels from the output's label_filename (one a line, in
// the model's folder). Values print as C++'s std::to_string prints them (6 decimals for floats).
import { readFileSync } from 'node:fs';
import type { ModelConfig } from './model-config.ts';
import { ClassicError } from './errors.ts';
import { fileInRepository, shownPath } from './repository-paths.ts';
import type { Tensor } from './tensor.ts';

/** Each output's labels, for the outputs that name a label_filename; read at load, so a missing file fails the load. */
export function readLabels(config: ModelConfig, modelDir: string): Map<string, string[]> {
  const labels = new Map<string, string[]>();
  for (const output of config.output) {
    if (output.label_filename === undefined) continue;
    let text: string;
    try {
      text = readFileSync(fileInRepository(modelDir, output.label_filename), 'utf8');
    } catch (err) {
      if (err instanceof ClassicError) throw err;
      throw new ClassicError('INVALID_ARG', `output '${output.name}': cannot read label_filename ${shownPath(modelDir, output.label_filename)}`);
    }
    labels.set(output.name, text.split(/\r?\n/).filter((line, i, lines) => line !== '' || i < lines.length - 1));
  }
  return labels;
}

const FLOATS = new Set(['FP32', 'FP64']);
const INTEGERS = new Set(['UINT8', 'UINT16', 'UINT32', 'UINT64', 'INT8', 'INT16', 'INT32', 'INT64']);
const encoder = new TextEncoder();

/**
 * The top `count` classes of each row. batched: the first dimension is the batch (max_batch_size > 0),
 * so the answer is [batch, k]; otherwise [k].
 */
export function classify(tensor: Tensor, name: string, count: number, batched: boolean, labels: readonly string[] | undefined): Tensor {
  const isFloat = FLOATS.has(tensor.datatype);
  if (!isFloat && !INTEGERS.has(tensor.datatype)) {
    throw new ClassicError('INVALID_ARG', `class result not available for output '${name}' due to unsupported type '${tensor.datatype}'`);
  }
  const values = Array.from(tensor.data as ArrayLike<number | bigint>, Number);
  const numRows = batched ? tensor.shape[0] ?? 0 : 1;
  const rowLength = numRows === 0 ? 0 : values.length / numRows;
  const k = Math.min(count, rowLength);
  const data: Uint8Array[] = [];
  for (let row = 0; row < numRows; row++) {
    const start = row * rowLength;
    // Stable: equal values keep the lower index first.
    const indices = Array.from({ length: rowLength }, (_, i) => i).sort((a, b) => values[start + b] - values[start + a] || a - b);
    for (const index of indices.slice(0, k)) {
      const value = values[start + index];
      const label = labels?.[index];
      const text = `${isFloat ? value.toFixed(6) : String(value)}:${index}${label === undefined ? '' : `:${label}`}`;
      data.push(encoder.encode(text));
    }
  }
  return { datatype: 'BYTES', shape: batched ? [numRows, k] : [k], data };
}
