// Every bad request gets the catalogue's status and OpenAI's error envelope, and the server
// keeps serving everyone else.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { deflateSync, gzipSync } from 'node:zlib';
import type { EngineErrorCode } from '../../engine/errors.ts';
import { BODY_LIMIT_BYTES, MAX_MODEL_LEN, MODEL_NAME, oneTokenPerStep, sseEvents, startTestGateway, type TestGateway } from './harness.ts';
import type { Script } from './scripted-engine.ts';

let gateway: TestGateway;
let script: Script = { steps: [] };
before(async () => {
  gateway = await startTestGateway(() => script);
});
after(() => gateway.close());

const messages = [{ role: 'user', content: 'hi' }];

async function expectError(response: Response, status: number, code: string, param: string | null) {
  assert.equal(response.status, status);
  const body = await response.json();
  assert.deepEqual(Object.keys(body), ['error']);
  assert.deepEqual(Object.keys(body.error).sort(), ['code', 'message', 'param', 'type']);
  assert.equal(body.error.code, code);
  assert.equal(body.error.param, param);
  assert.equal(typeof body.error.message, 'string');
  return body.error as { message: string; type: string };
}

test('malformed JSON is a 400', async () => {
  const error = await expectError(await gateway.post('/v1/chat/completions', '{"model": "tiny", '), 400, 'invalid_json', null);
  assert.match(error.message, /not valid JSON/);
  assert.equal(error.type, 'invalid_request_error');
});

test('invalid UTF-8 in the body is a 400', async () => {
  const body = Buffer.concat([Buffer.from('{"model": "tiny", "prompt": "'), Buffer.from([0xc3, 0x28]), Buffer.from('"}')]);
  await expectError(await gateway.post('/v1/completions', body), 400, 'invalid_utf8', null);
});

test('a body over the limit is a 413', async () => {
  const prompt = 'x'.repeat(BODY_LIMIT_BYTES);
  await expectError(await gateway.post('/v1/completions', { model: MODEL_NAME, prompt }), 413, 'body_too_large', null);
});

test('a gzip or deflate body is read decompressed; one that decompresses past the limit is a 413, a broken one a 400, another encoding a 415', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens('Hi')), finishReason: 'stop' };
  const post = (body: Buffer, encoding: string) =>
    fetch(`${gateway.baseUrl}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'content-encoding': encoding }, body: new Uint8Array(body) });
  const json = JSON.stringify({ model: MODEL_NAME, prompt: 'Hello', max_tokens: 2 });
  for (const [encoding, compress] of [['gzip', gzipSync], ['deflate', deflateSync]] as const) {
    const response = await post(compress(json), encoding);
    assert.equal(response.status, 200, encoding);
    assert.equal(((await response.json()) as { choices: { text: string }[] }).choices[0].text, 'Hi');
  }
  // Under the limit as sent, 512 times it decompressed: stopped at the limit, after decompression.
  const bomb = gzipSync(Buffer.alloc(BODY_LIMIT_BYTES * 512, 0x20), { level: 9 });
  assert.ok(bomb.byteLength < BODY_LIMIT_BYTES, `${bomb.byteLength} bytes`);
  const error = await expectError(await post(bomb, 'gzip'), 413, 'body_too_large', null);
  assert.match(error.message, /larger than the \d+-byte limit once decompressed/);
  await expectError(await post(Buffer.from('not gzip at all'), 'gzip'), 400, 'invalid_request', null);
  await expectError(await post(Buffer.from(json), 'br'), 415, 'unsupported_content_encoding', null);
  // And the server serves on.
  assert.equal((await post(gzipSync(json), 'gzip')).status, 200);
});

test('a wrong type names the parameter', async () => {
  const error = await expectError(
    await gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages, temperature: 'hot' }),
    400,
    'invalid_request',
    'temperature',
  );
  assert.match(error.message, /temperature.*expected number, received string/);
  await expectError(
    await gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages: [{ role: 'user', content: 5 }] }),
    400,
    'invalid_request',
    'messages[0].content',
  );
  await expectError(
    await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x', stop: ['a', 'b', 'c', 'd', 'e'] }),
    400,
    'invalid_request',
    'stop',
  );
  await expectError(await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x', max_tokens: 0 }), 400, 'invalid_request', 'max_tokens');
});

test('a missing required parameter says so', async () => {
  const error = await expectError(await gateway.post('/v1/chat/completions', { model: MODEL_NAME }), 400, 'invalid_request', 'messages');
  assert.equal(error.message, "Missing required parameter: 'messages'.");
});

test('a body that is not a JSON object is a 400', async () => {
  await expectError(await gateway.post('/v1/completions', '[1, 2]'), 400, 'invalid_request', null);
});

test('prompt plus max_tokens over max_model_len is context_length_exceeded', async () => {
  const error = await expectError(
    await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'one two three', max_tokens: MAX_MODEL_LEN }),
    400,
    'context_length_exceeded',
    'max_tokens',
  );
  assert.match(error.message, new RegExp(`maximum context length is ${MAX_MODEL_LEN} tokens`));
  await expectError(
    await gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages, max_completion_tokens: MAX_MODEL_LEN }),
    400,
    'context_length_exceeded',
    'max_completion_tokens',
  );
  await expectError(
    await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'word '.repeat(MAX_MODEL_LEN) }),
    400,
    'context_length_exceeded',
    'prompt',
  );
});

test('token ids outside the vocabulary and empty prompts are refused', async () => {
  await expectError(await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: [1, 60000] }), 400, 'invalid_request', 'prompt');
  await expectError(await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: '' }), 400, 'invalid_request', 'prompt');
});

test('an unknown model is a 404 model_not_found', async () => {
  await expectError(await fetch(`${gateway.baseUrl}/v1/models/nope`), 404, 'model_not_found', 'model');
  const error = await expectError(
    await gateway.post('/v1/chat/completions', { model: 'nope', messages }),
    404,
    'model_not_found',
    'model',
  );
  assert.match(error.message, /`nope` does not exist/);
});

test('parameters Conduit cannot honour yet are refused clearly, unknown ones are ignored', async () => {
  await expectError(await gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages, n: 129 }), 400, 'invalid_request', 'n');
  await expectError(await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x', suffix: 'y' }), 400, 'unsupported_parameter', 'suffix');
  await expectError(await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x', best_of: 2 }), 400, 'unsupported_parameter', 'best_of');
  const tool = { type: 'function', function: { name: 'f', parameters: {} } };
  await expectError(await gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages, functions: [tool.function] }), 400, 'unsupported_parameter', 'functions');
  await expectError(await gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages, tool_choice: 'required' }), 400, 'invalid_request', 'tool_choice');
  await expectError(
    await gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages, tools: [tool], tool_choice: { type: 'function', function: { name: 'g' } } }),
    400,
    'invalid_request',
    'tool_choice',
  );
  await expectError(await gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages, tools: [{ type: 'web_search' }] }), 400, 'invalid_request', 'tools[0].type');
  await expectError(
    await gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages, response_format: { type: 'xml' } }),
    400,
    'invalid_request',
    'response_format.type',
  );
  script = { steps: [gateway.tokens('ok')] };
  const response = await gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages, n: 1, some_future_param: { x: 1 } });
  assert.equal(response.status, 200);
});

test('sampling extensions out of range name the parameter', async () => {
  const cases: [string, Record<string, unknown>, string][] = [
    ['/v1/chat/completions', { messages, logprobs: true, top_logprobs: 21 }, 'top_logprobs'],
    ['/v1/chat/completions', { messages, top_logprobs: 2 }, 'top_logprobs'],
    ['/v1/completions', { prompt: 'x', logprobs: 21 }, 'logprobs'],
    ['/v1/completions', { prompt: 'x', prompt_logprobs: 1, stream: true }, 'prompt_logprobs'],
    ['/v1/chat/completions', { messages, prompt_logprobs: 1, stream: true }, 'prompt_logprobs'],
    ['/v1/completions', { prompt: 'x', logit_bias: { '50257': 1 } }, 'logit_bias'],
    ['/v1/completions', { prompt: 'x', logit_bias: { abc: 1 } }, 'logit_bias.abc'],
    ['/v1/completions', { prompt: 'x', logit_bias: { '5': 101 } }, 'logit_bias.5'],
    ['/v1/completions', { prompt: 'x', presence_penalty: 2.5 }, 'presence_penalty'],
    ['/v1/completions', { prompt: 'x', repetition_penalty: 0 }, 'repetition_penalty'],
    ['/v1/completions', { prompt: 'x', min_p: 1.5 }, 'min_p'],
    ['/v1/completions', { prompt: 'x', max_tokens: 4, min_tokens: 5 }, 'min_tokens'],
    ['/v1/completions', { prompt: 'x', stop_token_ids: [50257] }, 'stop_token_ids'],
    ['/v1/completions', { prompt: 'x', priority: 1.5 }, 'priority'],
    ['/v1/completions', { prompt: 'x', cache_salt: '' }, 'cache_salt'],
  ];
  for (const [route, fields, param] of cases) {
    await expectError(await gateway.post(route, { model: MODEL_NAME, ...fields }), 400, 'invalid_request', param);
  }
});

test('a chat request to a model without a chat template is a 400', async () => {
  await expectError(await gateway.post('/v1/chat/completions', { model: 'plain', messages }), 400, 'chat_template_missing', 'messages');
});

test('an unknown route is a 404 in the same envelope', async () => {
  await expectError(await fetch(`${gateway.baseUrl}/v1/nothing`), 404, 'route_not_found', null);
});

test('a worker error before any output keeps its HTTP status, even for a stream', async () => {
  script = { steps: [], error: { code: 'kv_cache_too_small', message: 'The prompt needs 9 blocks; the cache has 8.' } };
  const error = await expectError(
    await gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages, stream: true }),
    400,
    'kv_cache_too_small',
    null,
  );
  assert.match(error.message, /9 blocks/);
  // A worker newer than this gateway may emit a code it does not know.
  script = { steps: [], error: { code: 'something_new' as EngineErrorCode, message: 'boom' } };
  await expectError(await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x' }), 500, 'internal_error', null);
});

test('a worker error mid-stream is an SSE error event, then [DONE]', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens('Hello world')), error: { code: 'internal_error', message: 'the runner failed' } };
  const response = await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'x', stream: true });
  assert.equal(response.status, 200);
  const events = sseEvents(await response.text());
  assert.equal(events.pop(), '[DONE]');
  // The worker's own text may carry internals; the client reads the catalogue's message.
  assert.deepEqual(events.pop(), {
    error: { message: 'The server failed while running the request.', type: 'server_error', param: null, code: 'internal_error' },
  });
});

test('after all of the above the server still serves', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens('still here')), finishReason: 'stop' };
  const body = await (await gateway.post('/v1/chat/completions', { model: MODEL_NAME, messages })).json();
  assert.equal(body.choices[0].message.content, 'still here');
});

test('a JSON body is read whatever its content-type says, as curl -d sends it', async () => {
  script = { steps: [gateway.tokens('ok')], finishReason: 'stop' };
  for (const contentType of ['application/x-www-form-urlencoded', 'text/plain', null]) {
    const response = await fetch(`${gateway.baseUrl}/v1/completions`, {
      method: 'POST',
      headers: contentType === null ? {} : { 'content-type': contentType },
      body: JSON.stringify({ model: MODEL_NAME, prompt: 'x' }),
    });
    assert.equal(response.status, 200, `content-type ${contentType}`);
    assert.equal((await response.json()).choices[0].text, 'ok');
  }
});
