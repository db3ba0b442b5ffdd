// WebSocket mode's response.create events, fuzzed as fuzz.test.ts fuzzes bodies: none may get a
// 5xx error event or go unanswered, and the connection (or a new one, where a frame over the size
// limit closed it) still serves a valid event after. CONDUIT_TEST_SEED=<seed> replays a failure.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { WebSocket } from 'ws';
import { testSeed } from '../../test/seed.ts';
import { within } from '../../test/wait.ts';
import { Mutator, rng, serialize, type Json } from './fuzz-mutator.ts';
import { MODEL_NAME, startTestGateway, type TestGateway } from './harness.ts';

/** An event unanswered this long counts as a hang (they take milliseconds). */
const HANG_MS = 20_000;
/** Large enough that deep nesting reaches the parsers instead of the frame limit. */
const FUZZ_BODY_LIMIT_BYTES = 1024 * 1024;

let gateway: TestGateway;
before(async () => {
  gateway = await startTestGateway(() => ({ steps: [gateway.tokens(' Hello'), gateway.tokens(' world')], finishReason: 'stop' }), {
    bodyLimitBytes: FUZZ_BODY_LIMIT_BYTES,
  });
});
after(() => gateway.close());

const NUM_WEBSOCKET_EVENTS = 300;

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

// No deadline on the whole: every event has its own (HANG_MS, naming the seed and the event), as
// in fuzz.test.ts, whose whole outran a 100 s deadline on a loaded machine.
test(`${NUM_WEBSOCKET_EVENTS} fuzzed response.create events in WebSocket mode: never a 5xx error event, never a hang`, async (t) => {
  const seed = testSeed(t);
  const mutator = new Mutator(rng(seed));
  const url = `${gateway.baseUrl.replace(/^http/, 'ws')}/v1/responses`;
  const base = { model: MODEL_NAME, input: [{ role: 'user', content: [{ type: 'input_text', text: 'hi' }] }], instructions: 'Answer.', max_output_tokens: 5 };
  let socket = new FuzzSocket(url);
  await within(socket.opened, `seed ${seed}: the first socket opening`);
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
      await within(socket.opened, `seed ${seed}: a new socket opening after event ${index}`);
    }
  }
  t.diagnostic(`seed ${seed}: endings ${JSON.stringify([...endings].sort())}`);
  const valid = await within(socket.send(serialize({ type: 'response.create', ...base })), `seed ${seed}: the valid event's answer`);
  assert.ok(valid !== null && valid.type.startsWith('response.'), `seed ${seed}: ${JSON.stringify(valid)}`);
  socket.close();
});
