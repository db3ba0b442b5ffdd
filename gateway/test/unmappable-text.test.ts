// Text a tokenizer cannot encode (a word-level vocabulary without an unknown token) is a 400
// naming the first piece it could not map, on /tokenize and on every generation surface, and
// nothing reaches a worker; the server serves the text it can encode as before.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { WebSocket } from 'ws';
import { MODEL_NAME, startTestGateway, type TestGateway } from './harness.ts';
import type { Script } from './scripted-engine.ts';

const WORD_LEVEL = {
  version: '1.0',
  added_tokens: ['<|user|>', '<eos>', '<|assistant|>'].map((content, i) => ({
    id: 2 + i, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
  })),
  normalizer: null,
  pre_tokenizer: { type: 'Whitespace' },
  post_processor: null,
  decoder: null,
  model: { type: 'WordLevel', vocab: { hello: 0, world: 1, '<|user|>': 2, '<eos>': 3, '<|assistant|>': 4 } },
};
const EXPECTED = 'The text cannot be tokenized: it has no token for "there" and no unknown token to stand for it.';

let gateway: TestGateway;
const script: Script = { steps: [[1]], finishReason: 'stop' };
before(async () => {
  gateway = await startTestGateway(() => script, {
    tokenizerJson: WORD_LEVEL,
    chatTemplate: "{% for m in messages %}<|{{ m.role }}|> {{ m.content }} {% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}",
  });
});
after(() => gateway?.close());

test('/tokenize and every generation surface refuse the text with 400, naming the first unmapped piece', async () => {
  const numRequestsBefore = gateway.engine.requests.length;
  const surfaces: [route: string, body: Record<string, unknown>, errorOf: (body: any) => string][] = [
    ['/tokenize', { model: MODEL_NAME, prompt: 'hello there big world' }, (body) => body.error.message],
    ['/v1/completions', { model: MODEL_NAME, prompt: 'hello there big world' }, (body) => body.error.message],
    ['/v1/completions', { model: MODEL_NAME, prompt: ['hello world', 'hello there'], stream: true }, (body) => body.error.message],
    // Long enough to be tokenized in an offload thread: the error crosses back as it is.
    ['/v1/completions', { model: MODEL_NAME, prompt: `${'hello '.repeat(600)}there` }, (body) => body.error.message],
    ['/v1/chat/completions', { model: MODEL_NAME, messages: [{ role: 'user', content: 'hello there' }] }, (body) => body.error.message],
    ['/v1/responses', { model: MODEL_NAME, input: 'hello there' }, (body) => body.error.message],
    ['/v2/models/tiny/generate', { text_input: 'hello there' }, (body) => body.error],
    ['/v2/models/tiny/generate_stream', { text_input: 'hello there' }, (body) => body.error],
  ];
  for (const [route, body, errorOf] of surfaces) {
    const response = await gateway.post(route, body);
    assert.equal(response.status, 400, route);
    assert.equal(errorOf(await response.json()), EXPECTED, route);
  }
  assert.equal(gateway.engine.requests.length, numRequestsBefore, 'nothing reached the worker');
  // The first unmapped piece is named, not a later one.
  const later = await gateway.post('/tokenize', { model: MODEL_NAME, prompt: 'hello world big there' });
  assert.match(((await later.json()) as { error: { message: string } }).error.message, /no token for "big"/);
  // Text it can encode still works, on the same connection pool.
  const tokenized = await gateway.post('/tokenize', { model: MODEL_NAME, prompt: 'hello world' });
  assert.deepEqual(((await tokenized.json()) as { tokens: number[] }).tokens, [0, 1]);
  const completion = await gateway.post('/v1/completions', { model: MODEL_NAME, prompt: 'hello world', max_tokens: 1 });
  assert.equal(completion.status, 200);
});

test("the Responses API's WebSocket mode answers with an error event, and the socket serves on", async () => {
  const socket = new WebSocket(`${gateway.baseUrl.replace('http', 'ws')}/v1/responses`);
  await new Promise((resolve, reject) => {
    socket.once('open', resolve);
    socket.once('error', reject);
  });
  try {
    const next = () => new Promise<Record<string, any>>((resolve) => socket.once('message', (data) => resolve(JSON.parse(String(data)))));
    let event = next();
    socket.send(JSON.stringify({ type: 'response.create', model: MODEL_NAME, input: 'hello there' }));
    const error = await event;
    assert.equal(error.type, 'error');
    assert.equal(error.error.message, EXPECTED);
    event = next();
    socket.send(JSON.stringify({ type: 'response.create', model: MODEL_NAME, input: 'hello world', max_output_tokens: 1 }));
    assert.equal((await event).type, 'response.created');
  } finally {
    socket.close();
  }
});
