// The dynamic batcher on `digits`, in one run: the same ONNX model served twice from one
// repository, `digits_batched` (dynamic_batching, --preferred sizes, --delay-us queue
// delay) and `digits_unbatched` (no dynamic_batching: one execution per request), each with
// --instances instances, at 1 to 128 concurrent clients. Two transports: the repository called
// in-process (the batcher and ONNX Runtime alone) and KServe v2 over HTTP with binary tensors
// (the gateway in this process, clients too, so the HTTP figures include client cost).
// Each client sends one image per request and waits for the answer before the next.
//
// Checks the bar at 64 clients: batched throughput >= 4x unbatched, and batched p99 <=
// the queue delay + 2x the single-request latency (unbatched p50 at 1 client).
//
//   npm run bench:batcher [-- --seconds 1.5 --clients 1,8,32,64,128 --delay-us 2000 --preferred 32,64 --instances 2]
import { cpSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';
import { ModelRepository } from '../triton/index.ts';
import { createGateway } from '../gateway/server.ts';
import { describeCpu } from './bench-model.ts';
import { heldOutDigits } from './make-classic-models.ts';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

const { values } = parseArgs({
  options: {
    seconds: { type: 'string', default: '1.5' },
    clients: { type: 'string', default: '1,8,32,64,128' },
    'delay-us': { type: 'string', default: '2000' },
    instances: { type: 'string', default: '2' },
    preferred: { type: 'string', default: '32,64' },
  },
});
const durationMs = Number(values.seconds) * 1000;
const clientCounts = values.clients.split(',').map(Number);
const delayUs = Number(values['delay-us']);
const numInstances = Number(values.instances);
const preferredSizes = values.preferred.split(',').map(Number);

function makeRepo(): string {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-bench-batcher-'));
  const io = 'input [ { name: "pixels" data_type: TYPE_FP32 dims: [ 64 ] } ]\noutput [ { name: "probabilities" data_type: TYPE_FP32 dims: [ 10 ] } ]';
  const configs = {
    digits_batched: `platform: "onnxruntime_onnx"\nmax_batch_size: 128\n${io}\ninstance_group [ { count: ${numInstances} } ]\ndynamic_batching { preferred_batch_size: [ ${preferredSizes.join(', ')} ] max_queue_delay_microseconds: ${delayUs} }`,
    digits_unbatched: `platform: "onnxruntime_onnx"\nmax_batch_size: 128\n${io}\ninstance_group [ { count: ${numInstances} } ]`,
  };
  for (const [name, config] of Object.entries(configs)) {
    mkdirSync(path.join(dir, name, '1'), { recursive: true });
    cpSync(path.join(repoRoot, 'models', 'digits', '1', 'model.onnx'), path.join(dir, name, '1', 'model.onnx'));
    writeFileSync(path.join(dir, name, 'config.pbtxt'), config);
  }
  return dir;
}

interface Result { requestsPerSecond: number; p50Ms: number; p99Ms: number }

async function measure(numClients: number, send: (image: Float32Array) => Promise<void>, images: Float32Array[]): Promise<Result> {
  const latenciesMs: number[] = [];
  const endMs = performance.now() + durationMs;
  await Promise.all(Array.from({ length: numClients }, async (_, client) => {
    for (let i = client; performance.now() < endMs; i += numClients) {
      const startMs = performance.now();
      await send(images[i % images.length]);
      latenciesMs.push(performance.now() - startMs);
    }
  }));
  latenciesMs.sort((a, b) => a - b);
  const at = (q: number) => latenciesMs[Math.min(latenciesMs.length - 1, Math.floor(q * latenciesMs.length))];
  return { requestsPerSecond: latenciesMs.length / (durationMs / 1000), p50Ms: at(0.5), p99Ms: at(0.99) };
}

async function main() {
  const repoDir = makeRepo();
  const repository = new ModelRepository({ repoDir, mode: 'none', pollIntervalMs: 60_000, startupModels: [] });
  await repository.start();
  const gateway = await createGateway({ models: [], bodyLimitBytes: 1 << 20, classic: { repository, version: 'bench' } });
  const baseUrl = await gateway.listen({ host: '127.0.0.1', port: 0 });
  const images = heldOutDigits(256, 5).images.map((image) => Float32Array.from(image, (v) => v / 255));

  const inProcess = (model: string) => async (image: Float32Array) => {
    await repository.infer(model, null, { inputs: { pixels: { datatype: 'FP32', shape: [1, 64], data: image } }, requestedOutputs: null, priority: 0, timeoutUs: 0 });
  };
  const header = Buffer.from(JSON.stringify({
    inputs: [{ name: 'pixels', shape: [1, 64], datatype: 'FP32', parameters: { binary_data_size: 256 } }],
    outputs: [{ name: 'probabilities', parameters: { binary_data: true } }],
  }));
  const overHttp = (model: string) => async (image: Float32Array) => {
    const response = await fetch(`${baseUrl}/v2/models/${model}/infer`, {
      method: 'POST',
      headers: { 'inference-header-content-length': String(header.byteLength), 'content-type': 'application/octet-stream' },
      body: Buffer.concat([header, Buffer.from(image.buffer, image.byteOffset, image.byteLength)]),
    });
    if (response.status !== 200) throw new Error(`HTTP ${response.status}: ${await response.text()}`);
    await response.arrayBuffer();
  };

  console.log(`bench:batcher: digits (64-32-10 MLP, ONNX Runtime), ${numInstances} instances, preferred sizes [${preferredSizes.join(', ')}], queue delay ${delayUs} µs, ${durationMs / 1000} s per point`);
  console.log(describeCpu());
  let passed = true;
  for (const [transport, sender] of [['in-process', inProcess], ['HTTP binary', overHttp]] as const) {
    console.log(`\n${transport}`);
    console.log('clients | unbatched req/s   p50 ms   p99 ms | batched req/s   p50 ms   p99 ms | speedup');
    const rows = new Map<number, { unbatched: Result; batched: Result }>();
    for (const numClients of clientCounts) {
      const unbatched = await measure(numClients, sender('digits_unbatched'), images);
      const batched = await measure(numClients, sender('digits_batched'), images);
      rows.set(numClients, { unbatched, batched });
      const fmt = (r: Result) => `${r.requestsPerSecond.toFixed(0).padStart(13)} ${r.p50Ms.toFixed(2).padStart(8)} ${r.p99Ms.toFixed(2).padStart(8)}`;
      console.log(`${String(numClients).padStart(7)} | ${fmt(unbatched)} | ${fmt(batched).padStart(13)} | ${(batched.requestsPerSecond / unbatched.requestsPerSecond).toFixed(2)}x`);
    }
    const at64 = rows.get(64);
    const single = rows.get(1);
    if (at64 !== undefined && single !== undefined) {
      const speedup = at64.batched.requestsPerSecond / at64.unbatched.requestsPerSecond;
      const p99BoundMs = delayUs / 1000 + 2 * single.unbatched.p50Ms;
      const speedupOk = speedup >= 4;
      const p99Ok = at64.batched.p99Ms <= p99BoundMs;
      passed &&= speedupOk && p99Ok;
      console.log(`at 64 clients: ${speedup.toFixed(2)}x the unbatched throughput (bar: 4x) ${speedupOk ? 'PASS' : 'FAIL'}; ` +
        `p99 ${at64.batched.p99Ms.toFixed(2)} ms against ${p99BoundMs.toFixed(2)} ms = delay + 2 x single-request p50 ${p99Ok ? 'PASS' : 'FAIL'}`);
    }
  }
  await gateway.close();
  await repository.close();
  rmSync(repoDir, { recursive: true, force: true });
  process.exitCode = passed ? 0 : 1;
}

await main();
