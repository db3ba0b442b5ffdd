// Fuzzed bodies: seeded random mutations of valid chat, completions, tokenize and Responses
// requests (type swaps, deletions, huge numbers, NaN-like strings, lone surrogates, deep nesting,
// random bytes, truncation), over HTTP and as WebSocket mode's response.create events. None may
// get a 5xx (or a 5xx error event) or hang, and the server still answers a valid request after
// them all. A failure names its seed; CONDUIT_TEST_SEED=<seed> replays it.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { WebSocket } from 'ws';
import { MODEL_NAME, startTestGateway, type TestGateway } from './harness.ts';

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

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

/** Tiny deterministic PRNG, so a failing seed replays. */
function rng(seed: number): () => number {
  let state = seed >>> 0 || 1;
  return () => {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    return (state >>> 0) / 2 ** 32;
  };
}

const oddValues: Json[] = [
  null, true, false, 0, -1, -0.5, 1.5, 2 ** 31, 2 ** 53 + 1, 1e308, -1e308, 5e-324,
  'NaN', 'Infinity', '-Infinity', '1e309', '-0', '', ' ', '\u0000', '\ud800', 'x\udfffy', '🎉', 'null', 'true',
  'x'.repeat(5000), [], {}, [null], [1, 2, 3], ['a', 1, null], { a: 1 }, { model: MODEL_NAME },
  [{ role: 'user', content: 'hi' }], { type: 'text', text: 'hi' },
];
const oddKeys = ['model', 'n', 'stream', 'logprobs', 'prompt', 'messages', 'input', 'tokens', '__proto__', 'constructor', '', 'x'.repeat(300)];

class Mutator {
  private readonly random: () => number;

  constructor(random: () => number) {
    this.random = random;
  }

  int(max: number): number {
    return Math.floor(this.random() * max);
  }

  pick<T>(items: readonly T[]): T {
    return items[this.int(items.length)];
  }

  /** A structural mutation at a random place in the tree; returns the new tree. */
  mutate(value: Json): Json {
    const isContainer = value !== null && typeof value === 'object';
    // Descend into a child most of the time, so mutations land at every depth.
    if (isContainer && this.random() < 0.7) {
      const keys = Array.isArray(value) ? value.map((_, index) => index) : Object.keys(value);
      if (keys.length > 0) {
        const key = this.pick<string | number>(keys);
        const copy: any = Array.isArray(value) ? [...value] : { ...value };
        copy[key] = this.mutate(copy[key]);
        return copy;
      }
    }
    switch (this.int(isContainer ? 7 : 4)) {
      case 0:
        return this.pick(oddValues);
      case 1:
        return this.nest(value);
      case 2:
        return typeof value === 'number' ? this.pick([-value, value * 1e9, value + 0.5, -1, 1e21]) : this.pick(oddValues);
      case 3:
        return typeof value === 'string' ? value.repeat(1 + this.int(50)) + this.pick(['\ud800', '\u0000', '"', '\\']) : [value];
      case 4: {
        // Delete a child.
        const copy: any = Array.isArray(value) ? [...(value as Json[])] : { ...(value as object) };
        const keys = Object.keys(copy);
        if (keys.length === 0) return copy;
        if (Array.isArray(copy)) copy.splice(this.int(copy.length), 1);
        else delete copy[this.pick(keys)];
        return copy;
      }
      case 5: {
        // Add a child.
        if (Array.isArray(value)) return [...value, ...Array(1 + this.int(3)).fill(this.pick(oddValues))];
        return { ...(value as object), [this.pick(oddKeys)]: this.pick(oddValues) };
      }
      default:
        // Many copies of a child: long arrays.
        return Array.isArray(value) && value.length > 0 ? Array(1 + this.int(3000)).fill(value[0]) : this.pick(oddValues);
    }
  }

  /** The value wrapped in arrays or objects, a few deep to as deep as JSON.stringify goes (deeper: damage). */
  private nest(value: Json): Json {
    const depth = this.pick([2, 30, 1000]);
    const inObjects = this.random() < 0.5;
    let nested = value;
    for (let level = 0; level < depth; level++) nested = inObjects ? { a: nested } : [nested];
    return nested;
  }

  /** Byte-level damage to the serialized body: truncation, random bytes, a JS-only literal, nesting far too deep. */
  damage(bytes: Buffer): Buffer {
    switch (this.int(5)) {
      case 0:
        return bytes.subarray(0, this.int(bytes.length));
      case 1: {
        const damaged = Buffer.from(bytes);
        for (let count = 1 + this.int(4); count > 0; count--) damaged[this.int(damaged.length)] = this.int(256);
        return damaged;
      }
      case 2: {
        const at = this.int(bytes.length);
        const noise = Buffer.from(Array.from({ length: 1 + this.int(16) }, () => this.int(256)));
        return Buffer.concat([bytes.subarray(0, at), noise, bytes.subarray(at)]);
      }
      case 3: {
        const text = bytes.toString('utf8');
        return Buffer.from(text.replace(/\d+(\.\d+)?/, this.pick(['NaN', 'Infinity', '-Infinity', '0x10', '1e999', '+1', '01'])));
      }
      default: {
        // A field's value becomes arrays or objects nested deeper than any recursive walk survives.
        const depth = this.pick([20_000, 100_000, 400_000]);
        const [open, close] = this.random() < 0.5 ? ['[', ']'] : ['{"a":', '}'];
        const text = bytes.toString('utf8');
        const colons = [...text.matchAll(/":/g)].map((match) => match.index + 2);
        if (colons.length === 0) return bytes;
        const at = this.pick(colons);
        return Buffer.from(`${text.slice(0, at)}${open.repeat(depth)}0${close.repeat(depth)},"pad":${text.slice(at)}`);
      }
    }
  }
}

function serialize(value: Json): Buffer {
  return Buffer.from(JSON.stringify(value));
}

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

test(`${NUM_REQUESTS} fuzzed bodies: never a 5xx, never a hang, and the server serves after`, { timeout: 300_000 }, async (t) => {
  const seed = Number(process.env.CONDUIT_TEST_SEED ?? Math.floor(Math.random() * 2 ** 31));
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
        assert.fail(`${label()}: no answer (${(err as Error).message})`);
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

const NUM_WEBSOCKET_EVENTS = 400;

/** One socket's answers, one response.create at a time: resolves with its terminal event, or null when the socket closed. */
class FuzzSocket {
  private readonly socket: WebSocket;
  private waiter: ((event: { type: string; status?: number } | null) => void) | null = null;
  readonly opened: Promise<void>;

  constructor(url: string) {
    this.socket = new WebSocket(url);
    this.opened = new Promise((resolve, reject) => this.socket.once('open', () => resolve()).once('error', reject));
    this.socket.on('message', (data) => {
      const event = JSON.parse(data.toString());
      const isEnd = event.type === 'error' || event.type === 'response.completed' || event.type === 'response.incomplete' || event.type === 'response.failed';
      if (isEnd) this.settle(event);
    });
    this.socket.on('close', () => this.settle(null));
    this.socket.on('error', () => {});
  }

  get isOpen(): boolean {
    return this.socket.readyState === WebSocket.OPEN;
  }

  send(frame: Buffer): Promise<{ type: string; status?: number } | null> {
    return new Promise((resolve) => {
      this.waiter = resolve;
      this.socket.send(frame.toString('utf8'));
    });
  }

  close() {
    this.socket.close();
  }

  private settle(event: { type: string; status?: number } | null) {
    const waiter = this.waiter;
    this.waiter = null;
    waiter?.(event);
  }
}

test(`${NUM_WEBSOCKET_EVENTS} fuzzed response.create events in WebSocket mode: never a 5xx error event, never a hang`, { timeout: 120_000 }, async (t) => {
  const seed = Number(process.env.CONDUIT_TEST_SEED ?? Math.floor(Math.random() * 2 ** 31));
  const mutator = new Mutator(rng(seed));
  const url = `${gateway.baseUrl.replace(/^http/, 'ws')}/v1/responses`;
  const base = { model: MODEL_NAME, input: [{ role: 'user', content: [{ type: 'input_text', text: 'hi' }] }], instructions: 'Answer.', max_output_tokens: 5 };
  let socket = new FuzzSocket(url);
  await socket.opened;
  const endings = new Map<string, number>();
  for (let index = 0; index < NUM_WEBSOCKET_EVENTS; index++) {
    let tree: Json = base;
    for (let count = 1 + mutator.int(3); count > 0; count--) tree = mutator.mutate(tree);
    const event = tree !== null && typeof tree === 'object' && !Array.isArray(tree) ? { type: 'response.create', ...tree } : tree;
    const bytes = serialize(event);
    const frame = mutator.int(5) === 0 ? mutator.damage(bytes) : bytes;
    const label = `seed ${seed}, event ${index}: ${frame.subarray(0, 400).toString('utf8')}`;
    const ending = await Promise.race([socket.send(frame), new Promise<'hang'>((resolve) => setTimeout(resolve, HANG_MS, 'hang'))]);
    assert.notEqual(ending, 'hang', `${label}: no answer`);
    const answer = ending as { type: string; status?: number } | null;
    assert.ok(answer === null || answer.type !== 'error' || answer.status! < 500, `${label}: ${JSON.stringify(answer)}`);
    const key = answer === null ? 'closed' : `${answer.type}${answer.status === undefined ? '' : ` ${answer.status}`}`;
    endings.set(key, (endings.get(key) ?? 0) + 1);
    if (!socket.isOpen) {
      socket = new FuzzSocket(url);
      await socket.opened;
    }
  }
  t.diagnostic(`seed ${seed}: endings ${JSON.stringify([...endings].sort())}`);
  const valid = await socket.send(serialize({ type: 'response.create', ...base }));
  assert.ok(valid !== null && valid.type.startsWith('response.'), `seed ${seed}: ${JSON.stringify(valid)}`);
  socket.close();
});
