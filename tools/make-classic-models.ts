// Makes the ordinary models that ship in models/: `digits` (an MLP over scikit-learn's 8x8
// handwritten digits, UCI optdigits) and `fraud` (a logistic-regression scorer over synthetic card
// transactions). Each is trained here in plain Float64Array math from a documented dataset (the
// digits from Debian's python3-sklearn, or --digits-csv), written as an ONNX graph
// (tools/onnx/writer.ts), then run through ONNX Runtime on its held-out split: the accuracy in
// the model card is measured on the written .onnx file, not on the training code's weights.
//
//   node --import tsx tools/make-classic-models.ts [models-dir] [--digits-csv digits.csv.gz]
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { gunzipSync } from 'node:zlib';
import ort from 'onnxruntime-node';
import { createRng } from '../loadtest/random.ts';
import { writeModel } from './onnx/writer.ts';

// ---- digits ------------------------------------------------------------------------------

export const NUM_PIXELS = 64;
export const NUM_CLASSES = 10;

/**
 * scikit-learn's bundled copy of UCI optdigits (1,797 images of 8x8 pixels, 0-16, then the label,
 * one image per line), where Debian's python3-sklearn installs it. Only this tool reads it; the
 * held-out split ships in models/digits, so tests and benchmarks run without scikit-learn.
 */
const SKLEARN_DIGITS_CSV = '/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz';
const HELD_OUT_CSV = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', 'models', 'digits', 'heldout.csv');
/** optdigits counts on-pixels in 4x4 blocks: 0 to 16. */
const MAX_OPTDIGITS_VALUE = 16;
const NUM_HELD_OUT = 450;

interface Digits {
  images: Uint8Array[];
  labels: number[];
}

/** optdigits lines (64 values 0-16, then the label) as 0-255 images, the range clients send. */
function parseDigits(lines: readonly string[]): Digits {
  const images: Uint8Array[] = [];
  const labels: number[] = [];
  for (const line of lines) {
    const values = line.split(',').map(Number);
    if (values.length !== NUM_PIXELS + 1 || values.some((value) => !Number.isInteger(value))) throw new Error(`not an optdigits line: ${line}`);
    images.push(Uint8Array.from(values.slice(0, NUM_PIXELS), (value) => Math.round((value * 255) / MAX_OPTDIGITS_VALUE)));
    labels.push(values[NUM_PIXELS]);
  }
  return { images, labels };
}

function csvLines(text: string): string[] {
  return text.split('\n').filter((line) => line.trim() !== '');
}

/** numImages of the held-out optdigits images that ship with the model (a seeded choice), 0-255. */
export function heldOutDigits(numImages: number, seed: number): Digits {
  const lines = csvLines(readFileSync(HELD_OUT_CSV, 'utf8'));
  const random = createRng(seed);
  return parseDigits(Array.from({ length: numImages }, () => lines[Math.floor(random() * lines.length)]));
}

/** The optdigits lines split by a seeded shuffle into training and held-out lines. */
function splitDigits(csvFile: string, seed: number): { trainLines: string[]; heldOutLines: string[] } {
  const lines = csvLines(gunzipSync(readFileSync(csvFile)).toString('utf8'));
  const random = createRng(seed);
  for (let i = lines.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [lines[i], lines[j]] = [lines[j], lines[i]];
  }
  return { trainLines: lines.slice(NUM_HELD_OUT), heldOutLines: lines.slice(0, NUM_HELD_OUT) };
}

interface Mlp { w1: Float64Array; b1: Float64Array; w2: Float64Array; b2: Float64Array; numHidden: number }

/** A 64-32-10 ReLU MLP trained with minibatch SGD on softmax cross-entropy. */
function trainDigits(inputs: Float64Array[], labels: number[], seed: number): Mlp {
  const numHidden = 32;
  const random = createRng(seed);
  const gaussian = () => Math.sqrt(-2 * Math.log(random() + 1e-12)) * Math.cos(2 * Math.PI * random());
  const mlp: Mlp = {
    numHidden,
    w1: Float64Array.from({ length: NUM_PIXELS * numHidden }, () => gaussian() * Math.sqrt(2 / NUM_PIXELS)),
    b1: new Float64Array(numHidden),
    w2: Float64Array.from({ length: numHidden * NUM_CLASSES }, () => gaussian() * Math.sqrt(2 / numHidden)),
    b2: new Float64Array(NUM_CLASSES),
  };
  const hidden = new Float64Array(numHidden);
  const probs = new Float64Array(NUM_CLASSES);
  const dHidden = new Float64Array(numHidden);
  const numEpochs = 40;
  const learningRate = 0.05;
  const order = inputs.map((_, i) => i);
  for (let epoch = 0; epoch < numEpochs; epoch++) {
    for (let i = order.length - 1; i > 0; i--) {
      const j = Math.floor(random() * (i + 1));
      [order[i], order[j]] = [order[j], order[i]];
    }
    for (const index of order) {
      const x = inputs[index];
      for (let h = 0; h < numHidden; h++) {
        let sum = mlp.b1[h];
        for (let p = 0; p < NUM_PIXELS; p++) sum += x[p] * mlp.w1[p * numHidden + h];
        hidden[h] = sum > 0 ? sum : 0;
      }
      let max = -Infinity;
      for (let c = 0; c < NUM_CLASSES; c++) {
        let sum = mlp.b2[c];
        for (let h = 0; h < numHidden; h++) sum += hidden[h] * mlp.w2[h * NUM_CLASSES + c];
        probs[c] = sum;
        max = Math.max(max, sum);
      }
      let total = 0;
      for (let c = 0; c < NUM_CLASSES; c++) total += (probs[c] = Math.exp(probs[c] - max));
      for (let c = 0; c < NUM_CLASSES; c++) probs[c] = probs[c] / total - (c === labels[index] ? 1 : 0);
      dHidden.fill(0);
      for (let h = 0; h < numHidden; h++) {
        for (let c = 0; c < NUM_CLASSES; c++) {
          dHidden[h] += probs[c] * mlp.w2[h * NUM_CLASSES + c];
          mlp.w2[h * NUM_CLASSES + c] -= learningRate * probs[c] * hidden[h];
        }
        if (hidden[h] === 0) dHidden[h] = 0;
      }
      for (let c = 0; c < NUM_CLASSES; c++) mlp.b2[c] -= learningRate * probs[c];
      for (let p = 0; p < NUM_PIXELS; p++) {
        if (x[p] === 0) continue;
        for (let h = 0; h < numHidden; h++) mlp.w1[p * numHidden + h] -= learningRate * dHidden[h] * x[p];
      }
      for (let h = 0; h < numHidden; h++) mlp.b1[h] -= learningRate * dHidden[h];
    }
  }
  return mlp;
}

// ---- fraud -------------------------------------------------------------------------------

export const FRAUD_FEATURES = [
  'amount_usd', 'hour_of_day', 'distance_from_home_km', 'merchant_risk', 'transactions_last_24h',
  'is_foreign', 'card_present', 'account_age_days',
] as const;

/**
 * Synthetic card transactions. Features are drawn independently (amount log-normal around $40,
 * hour uniform, distance exponential with mean 15 km, merchant risk uniform, transactions in the
 * last 24 h Poisson(3), 10% foreign, 70% card present, account age uniform over 10 years); the
 * label is Bernoulli(sigmoid(z)) with
 *   z = -5.5 + 0.9 ln(amount/40) + 1.3 [hour < 6] + 0.5 ln(1 + distance/10) + 2.5 risk
 *       + 0.25 transactions + 1.4 foreign - 1.6 card_present - 0.3 ln(1 + age/30).
 */
export function makeFraud(numSamples: number, seed: number): { features: Float64Array[]; labels: number[] } {
  const random = createRng(seed);
  const gaussian = () => Math.sqrt(-2 * Math.log(random() + 1e-12)) * Math.cos(2 * Math.PI * random());
  const poisson = (mean: number) => {
    let k = 0;
    for (let p = random(), limit = Math.exp(-mean); p > limit; p *= random()) k++;
    return k;
  };
  const features: Float64Array[] = [];
  const labels: number[] = [];
  for (let i = 0; i < numSamples; i++) {
    const amount = 40 * Math.exp(gaussian() * 1.1);
    const hour = Math.floor(random() * 24);
    const distance = -15 * Math.log(1 - random());
    const risk = random();
    const numTransactions = poisson(3);
    const foreign = random() < 0.1 ? 1 : 0;
    const cardPresent = random() < 0.7 ? 1 : 0;
    const ageDays = 1 + Math.floor(random() * 3650);
    const z = -5.5 + 0.9 * Math.log(amount / 40) + 1.3 * (hour < 6 ? 1 : 0) + 0.5 * Math.log1p(distance / 10) + 2.5 * risk
      + 0.25 * numTransactions + 1.4 * foreign - 1.6 * cardPresent - 0.3 * Math.log1p(ageDays / 30);
    features.push(Float64Array.of(amount, hour, distance, risk, numTransactions, foreign, cardPresent, ageDays));
    labels.push(random() < 1 / (1 + Math.exp(-z)) ? 1 : 0);
  }
  return { features, labels };
}

/** Logistic regression over standardized features, full-batch gradient descent. */
function trainFraud(features: Float64Array[], labels: number[]) {
  const numFeatures = FRAUD_FEATURES.length;
  const mean = new Float64Array(numFeatures);
  const std = new Float64Array(numFeatures);
  for (const row of features) for (let f = 0; f < numFeatures; f++) mean[f] += row[f] / features.length;
  for (const row of features) for (let f = 0; f < numFeatures; f++) std[f] += (row[f] - mean[f]) ** 2 / features.length;
  for (let f = 0; f < numFeatures; f++) std[f] = Math.sqrt(std[f]) || 1;
  const weights = new Float64Array(numFeatures);
  let bias = 0;
  const gradient = new Float64Array(numFeatures);
  for (let step = 0; step < 300; step++) {
    gradient.fill(0);
    let gradientBias = 0;
    features.forEach((row, i) => {
      let z = bias;
      for (let f = 0; f < numFeatures; f++) z += weights[f] * (row[f] - mean[f]) / std[f];
      const error = 1 / (1 + Math.exp(-z)) - labels[i];
      for (let f = 0; f < numFeatures; f++) gradient[f] += error * (row[f] - mean[f]) / std[f];
      gradientBias += error;
    });
    for (let f = 0; f < numFeatures; f++) weights[f] -= 0.5 * gradient[f] / features.length;
    bias -= 0.5 * gradientBias / features.length;
  }
  return { mean, std, weights, bias };
}

/** Area under the ROC curve: the chance a random positive scores above a random negative. */
export function rocAuc(scores: ArrayLike<number>, labels: readonly number[]): number {
  const order = labels.map((_, i) => i).sort((a, b) => scores[a] - scores[b]);
  let rankSumPositives = 0;
  let numPositives = 0;
  order.forEach((index, rank) => {
    if (labels[index] === 1) { rankSumPositives += rank + 1; numPositives++; }
  });
  const numNegatives = labels.length - numPositives;
  return (rankSumPositives - numPositives * (numPositives + 1) / 2) / (numPositives * numNegatives);
}

// ---- main --------------------------------------------------------------------------------

const f32 = (data: Float64Array) => Float32Array.from(data);

async function runOnnx(file: string, inputName: string, rows: Float64Array[] | Uint8Array[], width: number, outputName: string) {
  const session = await ort.InferenceSession.create(file);
  const data = new Float32Array(rows.length * width);
  rows.forEach((row, i) => { for (let j = 0; j < width; j++) data[i * width + j] = inputName === 'pixels' ? row[j] / 255 : row[j]; });
  const result = await session.run({ [inputName]: new ort.Tensor('float32', data, [rows.length, width]) });
  await session.release();
  return result[outputName].data as Float32Array;
}

async function main() {
  const { values, positionals } = parseArgs({ allowPositionals: true, options: { 'digits-csv': { type: 'string', default: SKLEARN_DIGITS_CSV } } });
  const modelsDir = path.resolve(positionals[0] ?? 'models');

  // digits
  const digitsSeed = 8;
  const { trainLines, heldOutLines } = splitDigits(values['digits-csv'], digitsSeed);
  mkdirSync(path.join(modelsDir, 'digits'), { recursive: true });
  writeFileSync(path.join(modelsDir, 'digits', 'heldout.csv'), `${heldOutLines.join('\n')}\n`);
  const train = parseDigits(trainLines);
  const test = parseDigits(heldOutLines);
  const mlp = trainDigits(train.images.map((image) => Float64Array.from(image, (v) => v / 255)), train.labels, digitsSeed);
  const digitsFile = path.join(modelsDir, 'digits', '1', 'model.onnx');
  mkdirSync(path.dirname(digitsFile), { recursive: true });
  writeModel(digitsFile, {
    name: 'digits',
    docString: 'A 64-32-10 ReLU MLP over 8x8 digit images scaled to [0, 1]; made by tools/make-classic-models.ts',
    nodes: [
      { opType: 'MatMul', inputs: ['pixels', 'w1'], outputs: ['h0'] },
      { opType: 'Add', inputs: ['h0', 'b1'], outputs: ['h1'] },
      { opType: 'Relu', inputs: ['h1'], outputs: ['h2'] },
      { opType: 'MatMul', inputs: ['h2', 'w2'], outputs: ['h3'] },
      { opType: 'Add', inputs: ['h3', 'b2'], outputs: ['logits'] },
      { opType: 'Softmax', inputs: ['logits'], outputs: ['probabilities'], intAttributes: { axis: 1 } },
    ],
    initializers: [
      { name: 'w1', dims: [NUM_PIXELS, mlp.numHidden], data: f32(mlp.w1) },
      { name: 'b1', dims: [mlp.numHidden], data: f32(mlp.b1) },
      { name: 'w2', dims: [mlp.numHidden, NUM_CLASSES], data: f32(mlp.w2) },
      { name: 'b2', dims: [NUM_CLASSES], data: f32(mlp.b2) },
    ],
    inputs: [{ name: 'pixels', elemType: 1, dims: ['batch', NUM_PIXELS] }],
    outputs: [{ name: 'probabilities', elemType: 1, dims: ['batch', NUM_CLASSES] }],
  });
  const probs = await runOnnx(digitsFile, 'pixels', test.images, NUM_PIXELS, 'probabilities');
  let numCorrect = 0;
  test.labels.forEach((label, i) => {
    const row = probs.subarray(i * NUM_CLASSES, (i + 1) * NUM_CLASSES);
    if (row.indexOf(Math.max(...row)) === label) numCorrect++;
  });
  const digitsAccuracy = numCorrect / test.labels.length;

  // fraud
  const fraudSeed = 1999;
  const fraudTrain = makeFraud(20000, fraudSeed);
  const fraudTest = makeFraud(5000, fraudSeed + 1);
  const scorer = trainFraud(fraudTrain.features, fraudTrain.labels);
  const fraudFile = path.join(modelsDir, 'fraud', '1', 'model.onnx');
  mkdirSync(path.dirname(fraudFile), { recursive: true });
  const numFeatures = FRAUD_FEATURES.length;
  writeModel(fraudFile, {
    name: 'fraud',
    docString: `Logistic regression over ${FRAUD_FEATURES.join(', ')}; made by tools/make-classic-models.ts`,
    nodes: [
      { opType: 'Sub', inputs: ['features', 'mean'], outputs: ['centered'] },
      { opType: 'Div', inputs: ['centered', 'std'], outputs: ['standardized'] },
      { opType: 'MatMul', inputs: ['standardized', 'weights'], outputs: ['z0'] },
      { opType: 'Add', inputs: ['z0', 'bias'], outputs: ['z'] },
      { opType: 'Sigmoid', inputs: ['z'], outputs: ['fraud_probability'] },
    ],
    initializers: [
      { name: 'mean', dims: [numFeatures], data: f32(scorer.mean) },
      { name: 'std', dims: [numFeatures], data: f32(scorer.std) },
      { name: 'weights', dims: [numFeatures, 1], data: f32(scorer.weights) },
      { name: 'bias', dims: [1], data: Float32Array.of(scorer.bias) },
    ],
    inputs: [{ name: 'features', elemType: 1, dims: ['batch', numFeatures] }],
    outputs: [{ name: 'fraud_probability', elemType: 1, dims: ['batch', 1] }],
  });
  const scores = await runOnnx(fraudFile, 'features', fraudTest.features, numFeatures, 'fraud_probability');
  const fraudAuc = rocAuc(scores, fraudTest.labels);
  let fraudCorrect = 0;
  fraudTest.labels.forEach((label, i) => { if ((scores[i] >= 0.5 ? 1 : 0) === label) fraudCorrect++; });
  const fraudRate = fraudTest.labels.reduce((a, b) => a + b, 0) / fraudTest.labels.length;

  const report = {
    digits: { train: train.labels.length, test: test.labels.length, accuracy: digitsAccuracy },
    fraud: { train: fraudTrain.labels.length, test: fraudTest.labels.length, rocAuc: fraudAuc, accuracyAt05: fraudCorrect / fraudTest.labels.length, fraudRate },
  };
  writeFileSync(path.join(modelsDir, 'digits', 'metrics.json'), `${JSON.stringify(report.digits, null, 2)}\n`);
  writeFileSync(path.join(modelsDir, 'fraud', 'metrics.json'), `${JSON.stringify(report.fraud, null, 2)}\n`);
  console.log(JSON.stringify(report));
}

if (import.meta.url === `file://${process.argv[1]}`) await main();
