// JSON tensor data nested far deeper than any shape: a 400 with Triton's error body, not the 500
// that a recursive walk's stack overflow gave (found by `npm run fuzz -- --target kserve-http`);
// /v2 bodies are parsed as /v1's, so the depth bound refuses them before anything walks them.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { MODELS_DIR, startKServeServer, type KServeTestServer } from './harness.ts';

/** Within the 1 MiB body limit as objects ({"a": per level), far past the call stack as recursion. */
const DEPTH = 100_000;

let server: KServeTestServer;
before(async () => { server = await startKServeServer(MODELS_DIR, 'none'); });
after(() => server.close());

async function infer(data: string): Promise<{ status: number; error: string }> {
  const response = await fetch(`${server.baseUrl}/v2/models/fraud/infer`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: `{"inputs":[{"name":"features","shape":[1,8],"datatype":"FP32","data":${data}}]}`,
  });
  return { status: response.status, error: (await response.json() as { error: string }).error };
}

test(`data nested ${DEPTH.toLocaleString('en')} arrays deep is a 400`, async () => {
  const { status, error } = await infer(`${'['.repeat(DEPTH)}0.5${']'.repeat(DEPTH)}`);
  assert.equal(status, 400, error);
  assert.equal(error, 'The request body nests JSON objects and arrays more than 128 deep.');
});

test(`an element that is an object ${DEPTH.toLocaleString('en')} deep is a 400`, async () => {
  const { status, error } = await infer(`[0.1,0.2,0.3,0.4,0.5,0.6,0.7,${'{"a":'.repeat(DEPTH)}0${'}'.repeat(DEPTH)}]`);
  assert.equal(status, 400, error);
  assert.equal(error, 'The request body nests JSON objects and arrays more than 128 deep.');
});

test('an element that is an object within the bound is a 400 naming the element', async () => {
  const { status, error } = await infer(`[0.1,0.2,0.3,0.4,0.5,0.6,0.7,${'{"a":'.repeat(50)}0${'}'.repeat(50)}]`);
  assert.equal(status, 400, error);
  assert.match(error, /element 7 is an object; expected a finite number within ±3\.4028234663852886e\+38 for FP32/);
});

test('the model still serves after them', async () => {
  const response = await fetch(`${server.baseUrl}/v2/models/fraud/infer`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ inputs: [{ name: 'features', shape: [1, 8], datatype: 'FP32', data: [[0.1, 0.5, 0.2, 0.9], [0.3, 0, 1, 0.4]] }] }),
  });
  assert.equal(response.status, 200);
});
