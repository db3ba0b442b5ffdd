// The seed's scene: one `conduit serve` with conduit-tiny (OpenAI API) and the model repository
// (digits, fraud, digits_pipeline over KServe v2 HTTP and gRPC) at once.
import assert from 'node:assert/strict';
import path from 'node:path';
import { after, before, test } from 'node:test';
import OpenAI from 'openai';
import { serve, type RunningServer } from '../../bin/serve.ts';
import { validateConfig } from '../../configs/schema.ts';
import { heldOutDigits } from '../../tools/make-classic-models.ts';
import { defaultModelDir, repoRoot } from './harness.ts';
import { connectInferenceClient } from '../../gateway/kserve/test/grpc-client.ts';

let server: RunningServer;
before(async () => {
  const config = validateConfig({
    server: { host: '127.0.0.1', http_port: 0, metrics_port: 0, grpc_port: 0 },
    models: [{ path: defaultModelDir, max_num_seqs: 4, kv_cache_bytes: 16 * 1024 * 1024 }],
    model_repository: { path: path.join(repoRoot, 'models') },
  }, path.join(repoRoot, 'test', 'integration', 'inline.yaml'));
  server = await serve(config);
});
after(() => server.close());

test('conduit-tiny, digits and fraud answer at once on one server, over HTTP and gRPC', async () => {
  const openai = new OpenAI({ baseURL: `${server.httpAddress}/v1`, apiKey: 'unused' });
  const { images, labels } = heldOutDigits(2, 31);
  const client = connectInferenceClient(server.grpcAddress!);
  try {
    const [completion, digits, fraud, label] = await Promise.all([
      openai.completions.create({ model: 'conduit-tiny', prompt: 'In the beginning', max_tokens: 4, temperature: 0 }),
      fetch(`${server.httpAddress}/v2/models/digits/infer`, {
        method: 'POST',
        body: JSON.stringify({ inputs: [{ name: 'pixels', shape: [2, 64], datatype: 'FP32', data: images.flatMap((image) => Array.from(image, (v) => v / 255)) }] }),
      }).then((r) => r.json() as Promise<any>),
      fetch(`${server.httpAddress}/v2/models/fraud/infer`, {
        method: 'POST',
        body: JSON.stringify({ inputs: [{ name: 'features', shape: [1, 8], datatype: 'FP32', data: [900, 3, 400, 0.95, 9, 1, 0, 5] }] }),
      }).then((r) => r.json() as Promise<any>),
      new Promise<any>((resolve, reject) => client.ModelInfer({
        model_name: 'digits_pipeline', inputs: [{ name: 'RAW_PIXELS', datatype: 'UINT8', shape: [1, 64] }], outputs: [{ name: 'LABEL' }],
        raw_input_contents: [Buffer.from(images[0])],
      }, (err: Error | null, response: unknown) => (err ? reject(err) : resolve(response)))),
    ]);
    assert.equal(completion.choices[0].finish_reason, 'length');
    const probs: number[] = digits.outputs[0].data;
    const predicted = [0, 1].map((i) => probs.indexOf(Math.max(...probs.slice(i * 10, i * 10 + 10))) - i * 10);
    // Accuracy is triton's test (97.8 % held out); here, that each path answers, and agrees.
    assert.equal(predicted.length, labels.length);
    assert.ok(fraud.outputs[0].data[0] > 0.5);
    assert.equal(label.raw_output_contents[0].subarray(4).toString(), String(predicted[0]), "the pipeline's label is the classifier's answer");
  } finally {
    client.close();
  }
});
