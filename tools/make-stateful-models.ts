// Makes the stateful model that ships in models/: `accumulator`, a running sum kept by Triton's
// implicit state. The graph adds the request's INPUT to the state the sequence batcher hands it
// (ACCUMULATOR_IN: zeros at a sequence's START, else the last request's ACCUMULATOR_OUT) and
// returns the sum as OUTPUT and as the next state. It is written as an ONNX graph
// (tools/onnx/writer.ts), then run through ONNX Runtime over two sequences carried by hand, so
// the shipped file is checked, not only the code that wrote it.
//
//   node --import tsx tools/make-stateful-models.ts [models-dir]
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import ort from 'onnxruntime-node';
import { writeModel } from './onnx/writer.ts';

const ONNX_FLOAT = 1;

export function writeAccumulator(file: string): void {
  mkdirSync(path.dirname(file), { recursive: true });
  writeModel(file, {
    name: 'accumulator',
    docString: 'OUTPUT = ACCUMULATOR_IN + INPUT, ACCUMULATOR_OUT = OUTPUT: a running sum over a sequence, its state kept by the sequence batcher; made by tools/make-stateful-models.ts',
    nodes: [
      { opType: 'Add', inputs: ['ACCUMULATOR_IN', 'INPUT'], outputs: ['OUTPUT'] },
      { opType: 'Identity', inputs: ['OUTPUT'], outputs: ['ACCUMULATOR_OUT'] },
    ],
    initializers: [],
    inputs: [
      { name: 'INPUT', elemType: ONNX_FLOAT, dims: ['batch', 1] },
      { name: 'ACCUMULATOR_IN', elemType: ONNX_FLOAT, dims: ['batch', 1] },
    ],
    outputs: [
      { name: 'OUTPUT', elemType: ONNX_FLOAT, dims: ['batch', 1] },
      { name: 'ACCUMULATOR_OUT', elemType: ONNX_FLOAT, dims: ['batch', 1] },
    ],
  });
}

/** Two sequences, as two batch rows, stepped three times with the state carried by hand. */
async function checkAccumulator(file: string): Promise<void> {
  const session = await ort.InferenceSession.create(file);
  const steps = [[1, 10], [2, 20], [3, 30]];
  let state: Float32Array = new Float32Array(2);
  for (const step of steps) {
    const result = await session.run({
      INPUT: new ort.Tensor('float32', Float32Array.from(step), [2, 1]),
      ACCUMULATOR_IN: new ort.Tensor('float32', state, [2, 1]),
    });
    state = result.ACCUMULATOR_OUT.data as Float32Array;
  }
  await session.release();
  if (state[0] !== 6 || state[1] !== 60) throw new Error(`accumulator: expected sums [6, 60], got [${state.join(', ')}]`);
}

async function main() {
  const modelsDir = path.resolve(process.argv[2] ?? 'models');
  const file = path.join(modelsDir, 'accumulator', '1', 'model.onnx');
  writeAccumulator(file);
  await checkAccumulator(file);
  console.log(`wrote ${file}; two sequences summed to [6, 60] in ONNX Runtime`);
}

if (import.meta.url === `file://${process.argv[1]}`) await main();
