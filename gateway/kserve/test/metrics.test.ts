// Triton's metric names and labels on the metrics server, after real requests.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import type { FastifyInstance } from 'fastify';
import { ModelRepository } from '../../../triton/index.ts';
import { createGateway, createMetricsServer, GatewayMetrics } from '../../server.ts';
import { registerTritonMetrics } from '../metrics.ts';
import { makeTestRepo, MODELS_DIR } from './harness.ts';

let repository: ModelRepository;
let gateway: FastifyInstance;
let metricsServer: FastifyInstance;
let baseUrl: string;
let metricsUrl: string;
before(async () => {
  repository = new ModelRepository({ repoDir: MODELS_DIR, mode: 'none', pollIntervalMs: 1000, startupModels: [] });
  await repository.start();
  const metrics = new GatewayMetrics([]);
  registerTritonMetrics(metrics.registry, repository);
  gateway = await createGateway({ models: [], bodyLimitBytes: 1 << 20, metrics, classic: { repository, version: '0.1.0' } });
  metricsServer = await createMetricsServer({ metrics });
  baseUrl = await gateway.listen({ host: '127.0.0.1', port: 0 });
  metricsUrl = await metricsServer.listen({ host: '127.0.0.1', port: 0 });
});
after(async () => {
  await gateway.close();
  await metricsServer.close();
  await repository.close();
});

function sample(text: string, line: string): number {
  const found = text.split('\n').find((l) => l.startsWith(`${line} `));
  assert.ok(found !== undefined, `no sample ${line}`);
  return Number(found.slice(line.length + 1));
}

test("requests, executions, failures and durations under Triton's names", async () => {
  const infer = (rows: number) => fetch(`${baseUrl}/v2/models/fraud/infer`, {
    method: 'POST',
    body: JSON.stringify({ inputs: [{ name: 'features', shape: [rows, 8], datatype: 'FP32', data: new Array(rows * 8).fill(1) }] }),
  });
  assert.equal((await infer(3)).status, 200);
  assert.equal((await infer(2)).status, 200);
  assert.equal((await infer(300)).status, 400);
  const text = await (await fetch(`${metricsUrl}/metrics`)).text();
  const labels = 'model="fraud",version="1"';
  assert.equal(sample(text, `nv_inference_request_success{${labels}}`), 2);
  assert.equal(sample(text, `nv_inference_count{${labels}}`), 5);
  assert.equal(sample(text, `nv_inference_exec_count{${labels}}`), 2);
  assert.equal(sample(text, `nv_inference_request_failure{${labels},reason="OTHER"}`), 1);
  assert.equal(sample(text, `nv_inference_request_failure{${labels},reason="REJECTED"}`), 0);
  assert.equal(sample(text, `nv_inference_request_failure{${labels},reason="BACKEND"}`), 0);
  assert.equal(sample(text, `nv_inference_request_failure{${labels},reason="CANCELED"}`), 0);
  assert.ok(sample(text, `nv_inference_request_duration_us{${labels}}`) > 0);
  assert.ok(sample(text, `nv_inference_compute_infer_duration_us{${labels}}`) > 0);
  for (const name of ['nv_inference_queue_duration_us', 'nv_inference_compute_input_duration_us', 'nv_inference_compute_output_duration_us']) {
    assert.ok(sample(text, `${name}{${labels}}`) >= 0);
  }
  assert.equal(sample(text, `nv_inference_pending_request_count{${labels}}`), 0);
  assert.match(text, /# TYPE nv_inference_request_success counter/);
  assert.match(text, /# TYPE nv_inference_pending_request_count gauge/);
  assert.equal(sample(text, 'nv_inference_request_success{model="digits",version="1"}'), 0);
});

test('response cache hits and misses: in the statistics (cache_hit, cache_miss) and as nv_cache_* per model', async () => {
  const testRepo = makeTestRepo({
    cached: {
      config: 'backend: "script"\nmax_batch_size: 4\ninput [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 2 ] } ]\noutput [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 2 ] } ]\nresponse_cache { enable: true }\n',
      script: 'export function execute(inputs) { return { OUTPUT: inputs.INPUT }; }\n',
    },
  });
  const cachedRepository = new ModelRepository({ repoDir: testRepo.dir, mode: 'none', pollIntervalMs: 1000, startupModels: [], responseCacheBytes: 1 << 16 });
  await cachedRepository.start();
  const metrics = new GatewayMetrics([]);
  registerTritonMetrics(metrics.registry, cachedRepository);
  const server = await createGateway({ models: [], bodyLimitBytes: 1 << 20, metrics, classic: { repository: cachedRepository, version: '0.1.0' } });
  const scrape = await createMetricsServer({ metrics });
  try {
    const url = await server.listen({ host: '127.0.0.1', port: 0 });
    const scrapeUrl = await scrape.listen({ host: '127.0.0.1', port: 0 });
    const infer = (values: number[]) => fetch(`${url}/v2/models/cached/infer`, {
      method: 'POST', body: JSON.stringify({ inputs: [{ name: 'INPUT', shape: [1, 2], datatype: 'INT32', data: values }] }),
    });
    for (const values of [[1, 2], [1, 2], [1, 2], [3, 4]]) {
      const response = await infer(values);
      assert.equal(response.status, 200);
      assert.deepEqual(((await response.json()) as any).outputs[0].data, values);
    }
    const stats = ((await (await fetch(`${url}/v2/models/cached/stats`)).json()) as any).model_stats[0];
    assert.equal(stats.inference_stats.cache_hit.count, 2);
    assert.equal(stats.inference_stats.cache_miss.count, 2);
    assert.equal(stats.inference_stats.success.count, 4);
    assert.equal(stats.execution_count, 2);
    const text = await (await fetch(`${scrapeUrl}/metrics`)).text();
    const labels = 'model="cached",version="1"';
    assert.equal(sample(text, `nv_cache_num_hits_per_model{${labels}}`), 2);
    assert.equal(sample(text, `nv_cache_num_misses_per_model{${labels}}`), 2);
    assert.ok(sample(text, `nv_cache_hit_duration_per_model{${labels}}`) >= 0);
    assert.ok(sample(text, `nv_cache_miss_duration_per_model{${labels}}`) >= 0);
    assert.equal(sample(text, `nv_inference_exec_count{${labels}}`), 2);
  } finally {
    await server.close();
    await scrape.close();
    await cachedRepository.close();
    testRepo.remove();
  }
});
