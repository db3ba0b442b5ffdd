// Fuzzed bodies: seeded random mutations of valid chat, completions, tokenize and Responses
// requests (type swaps, deletions, huge numbers, NaN-like strings, lone surrogates, deep nesting,
// random bytes, truncation). None may get a 5xx or hang, and the server still answers a valid
// request after them all. A failure names its seed; CONDUIT_TEST_SEED=<seed> replays it.
// WebSocket mode's events: fuzz-websocket.test.ts.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { testSeed } from '../../test/seed.ts';
import { Mutator, rng, serialize, type Json } from './fuzz-mutator.ts';
import { MODEL_NAME, startTestGateway, type TestGateway } from './harness.ts';

const NUM_REQUESTS = 2000;
const NUM_IN_FLIGHT = 8;
/** A request unanswered this long counts as a hang (they take milliseconds). */
const HANG_MS = 20_000;
/** Large enough that deep nesting reaches the parsers instead of the body limit. */
const FUZZ_BODY_LIMIT_BYTES = 1024 * 1024;

let gateway: TestGateway;
before(async () => {
  gateway = await startTestGateway(() => ({ steps: [gateway.tokens(' Hello'), gateway.tokens(' world')], finishReason: 'stop' }), {
    bodyLimitBytes: FUZZ_BODY_LIMIT_BYTES,
  });
});
after(() => gateway.close());

/** Valid requests of every route, using as many parameters as each takes. */
const bases: { route: string; body: Json }[] = [
  {
    route: '/v1/chat/completions',
    body: {
      model: MODEL_NAME,
      messages: [
        { role: 'system', content: 'Be brief.' },
        { role: 'user', content: [{ type: 'text', text: 'Grüße 🎉' }] },
      ],
      max_tokens: 4,
      temperature: 0.5,
      top_p: 0.9,
      n: 2,
      stop: ['\n', 'END'],
      logprobs: true,
      top_logprobs: 2,
      seed: 7,
      presence_penalty: 0.1,
      frequency_penalty: 0.1,
      logit_bias: { '13': 1 },
      stream: true,
      stream_options: { include_usage: true, continuous_usage_stats: true },
      user: 'fuzz',
      min_p: 0.05,
      min_tokens: 1,
      stop_token_ids: [13],
      include_stop_str_in_output: true,
    },
  },
  {
    route: '/v1/completions',
    body: {
      model: MODEL_NAME,
      prompt: ['Once upon', 'a time'],
      max_tokens: 3,
      echo: true,
      logprobs: 2,
      n: 2,
      stop: 'x',
      ignore_eos: false,
      priority: 0,
      cache_salt: 'salt',
      prompt_logprobs: 1,
      stream: false,
    },
  },
  { route: '/v1/completions', body: { model: MODEL_NAME, prompt: 'Hi', stream: true, stream_options: { include_usage: true } } },
  { route: '/tokenize', body: { model: MODEL_NAME, messages: [{ role: 'user', content: 'hi' }], add_generation_prompt: true } },
  { route: '/detokenize', body: { model: MODEL_NAME, tokens: [1, 2, 3] } },
  {
    route: '/v1/responses',
    body: {
      model: MODEL_NAME,
      input: [{ role: 'user', content: [{ type: 'input_text', text: 'hi' }] }],
      instructions: 'Answer.',
      max_output_tokens: 5,
      temperature: 0.2,
      stream: true,
    },
  },
];


async function send(route: string, body: Buffer): Promise<{ status: number; text: string }> {
  const response = await fetch(`${gateway.baseUrl}${route}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: new Uint8Array(body),
    signal: AbortSignal.timeout(HANG_MS),
  });
  return { status: response.status, text: await response.text() };
}

test('every base request is valid (the mutations start from working requests)', async () => {
  for (const { route, body } of bases) {
    const { status, text } = await send(route, serialize(body));
    assert.equal(status, 200, `${route}: ${text}`);
  }
});

// No deadline on the whole: every request has its own (HANG_MS, naming the seed and the case),
// and the whole takes what the machine gives it: ~12 s of CPU, 133 s of wall time at a load of 27
// on 2 cores (seed 31676, 2026-12-07), where a 100 s deadline failed it naming nothing.
test(`${NUM_REQUESTS} fuzzed bodies: never a 5xx, never a hang, and the server serves after`, async (t) => {
  const seed = testSeed(t);
  const mutator = new Mutator(rng(seed));
  const cases = Array.from({ length: NUM_REQUESTS }, () => {
    const { route, body } = mutator.pick(bases);
    let tree = body;
    for (let count = 1 + mutator.int(3); count > 0; count--) tree = mutator.mutate(tree);
    const bytes = serialize(tree);
    return { route, bytes: mutator.int(5) === 0 ? mutator.damage(bytes) : bytes };
  });
  const statuses = new Map<number, number>();
  let next = 0;
  const runLane = async () => {
    while (next < cases.length) {
      const index = next++;
      const { route, bytes } = cases[index];
      const label = () => `seed ${seed}, case ${index}: POST ${route} ${bytes.subarray(0, 400).toString('utf8')}`;
      let answer: { status: number; text: string };
      try {
        answer = await send(route, bytes);
      } catch (err) {
        // fetch says only "fetch failed"; its cause (a reset, a socket closed under a reused
        // keep-alive connection, a timeout) tells a server fault from the client's side of it.
        const cause = (err as Error & { cause?: unknown }).cause;
        assert.fail(`${label()}: no answer (${(err as Error).message}${cause === undefined ? '' : `: ${String(cause)}`})`);
      }
      assert.ok(answer.status < 500, `${label()}: ${answer.status} ${answer.text.slice(0, 400)}`);
      if (answer.status >= 400) {
        const { error } = JSON.parse(answer.text);
        assert.equal(typeof error.message, 'string', label());
        assert.equal(typeof error.code, 'string', label());
      }
      statuses.set(answer.status, (statuses.get(answer.status) ?? 0) + 1);
    }
  };
  await Promise.all(Array.from({ length: NUM_IN_FLIGHT }, runLane));
  t.diagnostic(`seed ${seed}: statuses ${JSON.stringify([...statuses].sort())}`);
  // The mutations must reach past validation now and then, or the test only tested the parser.
  assert.ok((statuses.get(200) ?? 0) > NUM_REQUESTS / 50, `seed ${seed}: statuses ${JSON.stringify([...statuses])}`);
  assert.ok((statuses.get(400) ?? 0) > NUM_REQUESTS / 4, `seed ${seed}: statuses ${JSON.stringify([...statuses])}`);
  const ok = await send('/v1/chat/completions', serialize({ model: MODEL_NAME, messages: [{ role: 'user', content: 'hi' }] }));
  assert.equal(ok.status, 200, `seed ${seed}: ${ok.text}`);
});
