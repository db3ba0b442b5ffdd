// Keys, limits and the drain on the real server (`serve` over a real engine worker on
// conduit-tiny), with the official `openai` client: a key from the configuration and one from
// CONDUIT_API_KEYS, a requests-per-minute limit, and a stream that finishes while close() drains.
import assert from 'node:assert/strict';
import path from 'node:path';
import { after, before, test } from 'node:test';
import OpenAI from 'openai';
import { API_KEYS_ENV } from '../../configs/api-keys.ts';
import { validateConfig } from '../../configs/schema.ts';
import { serve, type RunningServer } from '../../bin/serve.ts';
import { defaultModelDir, repoRoot } from './harness.ts';

const MODEL_NAME = 'conduit-tiny';
const CONFIG_KEY = 'sk-config-5e1d';
const ENV_KEY = 'sk-env-8a2c';
let server: RunningServer;
let isClosed = false;

before(async () => {
  process.env[API_KEYS_ENV] = ENV_KEY;
  const config = validateConfig(
    {
      server: {
        host: '127.0.0.1',
        http_port: 0,
        metrics_port: 0,
        api_keys: [{ key: CONFIG_KEY, name: 'ci', requests_per_minute: 2 }],
      },
      models: [{ path: defaultModelDir, num_workers: 1, threads_per_worker: 1, kv_cache_blocks: 64, max_num_seqs: 4 }],
    },
    path.join(repoRoot, 'test', 'integration', 'inline.yaml'),
  );
  server = await serve(config);
});
after(async () => {
  delete process.env[API_KEYS_ENV];
  if (!isClosed) await server?.close();
});

function client(apiKey: string) {
  return new OpenAI({ baseURL: `${server.httpAddress}/v1`, apiKey, maxRetries: 0 });
}

const completion = { model: MODEL_NAME, prompt: 'Hello', max_tokens: 4, temperature: 0 };

test('without the right key: 401; with a key from the configuration or the environment: answers', async () => {
  const refused = await client('sk-wrong').completions.create(completion).catch((err) => err);
  assert.ok(refused instanceof OpenAI.AuthenticationError);
  assert.equal(refused.code, 'invalid_api_key');
  const health = await fetch(`${server.httpAddress}/health`);
  assert.equal(health.status, 200);
  assert.equal((await health.json()).state, 'ready');

  const answer = await client(ENV_KEY).completions.create(completion);
  assert.equal(answer.usage?.completion_tokens, 4);
  const { data, response } = await client(CONFIG_KEY).completions.create(completion).withResponse();
  assert.equal(data.usage?.completion_tokens, 4);
  assert.equal(response.headers.get('x-ratelimit-limit-requests'), '2');
  assert.equal(response.headers.get('x-ratelimit-remaining-requests'), '1');
});

test("the configured key's requests per minute: the third in a minute is a RateLimitError", async () => {
  await client(CONFIG_KEY).models.list();
  const refused = await client(CONFIG_KEY).models.list().catch((err) => err);
  assert.ok(refused instanceof OpenAI.RateLimitError);
  assert.equal(refused.type, 'requests');
  assert.ok(Number(refused.headers.get('retry-after')) >= 1);
  // The key from the environment has no limits.
  assert.equal((await client(ENV_KEY).models.list()).data[0].id, MODEL_NAME);
});

test('close() drains: a stream in flight runs to its end, a new request meanwhile gets 503', async () => {
  const stream = await client(ENV_KEY).completions.create({ ...completion, max_tokens: 200, ignore_eos: true, stream: true } as OpenAI.CompletionCreateParamsStreaming);
  const chunks = stream[Symbol.asyncIterator]();
  let text = (await chunks.next()).value?.choices[0]?.text ?? '';
  const closed = server.close();
  isClosed = true;
  // The stream has most of its 200 tokens to go: the port is still open, in our envelope.
  const refused = await client(ENV_KEY).models.list().catch((err) => err);
  assert.ok(refused instanceof OpenAI.InternalServerError, String(refused));
  assert.equal(refused.status, 503);
  assert.equal(refused.code, 'server_draining');
  assert.equal(refused.headers.get('retry-after'), '5');
  let finishReason: string | null = null;
  for (let next = await chunks.next(); !next.done; next = await chunks.next()) {
    text += next.value.choices[0]?.text ?? '';
    finishReason = next.value.choices[0]?.finish_reason ?? finishReason;
  }
  assert.equal(finishReason, 'length');
  assert.ok(text.length > 0);
  await closed;
});
