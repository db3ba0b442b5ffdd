// The SSE framing the gateway writes survives any split: a raw reader (the WHATWG event-stream
// rules, over bytes) and the official SDK's reader, fed a real stream's bytes split at every byte
// position, reassemble the same events, multi-byte UTF-8 and keep-alive comments included.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Stream } from 'openai/core/streaming';
import { MODEL_NAME, oneTokenPerStep, startTestGateway, type TestGateway } from './harness.ts';
import type { Script } from './scripted-engine.ts';

const KEEP_ALIVE_MS = 50;
const CHAT_TEXT = 'Grüße 👋 東京 🎉 €';
const COMPLETION_TEXT = 'Köln, ½ € — naïve café';

let gateway: TestGateway;
let script: Script = { steps: [] };
before(async () => {
  gateway = await startTestGateway(() => script, { limits: { sseKeepAliveMs: KEEP_ALIVE_MS } });
});
after(() => gateway.close());

/**
 * An event-stream parser over raw bytes, as the HTML standard defines it: UTF-8 decoded as a
 * stream, lines end at CRLF, LF or CR, a line starting with ':' is a comment, `data` lines
 * accumulate, a blank line dispatches. Returns the data of each event.
 */
function parseEventStream(chunks: readonly Uint8Array[]): string[] {
  const decoder = new TextDecoder('utf-8', { fatal: true });
  const events: string[] = [];
  let pending = '';
  let data: string[] = [];
  const takeLine = (line: string) => {
    if (line === '') {
      if (data.length > 0) events.push(data.join('\n'));
      data = [];
      return;
    }
    if (line.startsWith(':')) return;
    const colon = line.indexOf(':');
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'data') data.push(value);
  };
  const feed = (text: string, isLast: boolean) => {
    pending += text;
    for (;;) {
      const end = pending.search(/\r\n|\r|\n/);
      // A lone CR at the end may be half of a CRLF still on its way.
      if (end === -1 || (!isLast && end === pending.length - 1 && pending[end] === '\r')) break;
      const terminatorLength = pending.startsWith('\r\n', end) ? 2 : 1;
      takeLine(pending.slice(0, end));
      pending = pending.slice(end + terminatorLength);
    }
  };
  for (const chunk of chunks) feed(decoder.decode(chunk, { stream: true }), false);
  feed(decoder.decode(), true);
  assert.equal(pending, '', 'the stream ends mid-line');
  return events;
}

async function streamBytes(route: string, body: object): Promise<Uint8Array> {
  const response = await gateway.post(route, { model: MODEL_NAME, stream: true, ...body });
  assert.equal(response.status, 200);
  return new Uint8Array(await response.arrayBuffer());
}

/** The SDK's own reader over the bytes, delivered in the given chunks. */
async function sdkEvents(chunks: readonly Uint8Array[]): Promise<unknown[]> {
  const body = new ReadableStream<Uint8Array>({
    start(controller) {
      for (const chunk of chunks) controller.enqueue(chunk);
      controller.close();
    },
  });
  const items: unknown[] = [];
  for await (const item of Stream.fromSSEResponse(new Response(body), new AbortController())) items.push(item);
  return items;
}

function splitsAt(bytes: Uint8Array, position: number): Uint8Array[] {
  return [bytes.subarray(0, position), bytes.subarray(position)];
}

/** sdkAtEverySplit: the SDK's reader too at every position (it is the slower one), else one byte at a time only. */
async function checkEverySplit(bytes: Uint8Array, sdkAtEverySplit: boolean) {
  const whole = parseEventStream([bytes]);
  assert.equal(whole.at(-1), '[DONE]');
  const wholeItems = whole.slice(0, -1).map((data) => JSON.parse(data));
  assert.deepEqual(await sdkEvents([bytes]), wholeItems);
  for (let position = 1; position < bytes.length; position++) {
    assert.deepEqual(parseEventStream(splitsAt(bytes, position)), whole, `split at byte ${position}`);
    if (sdkAtEverySplit) assert.deepEqual(await sdkEvents(splitsAt(bytes, position)), wholeItems, `SDK, split at byte ${position}`);
  }
  const oneByteEach = Array.from(bytes, (byte) => Uint8Array.of(byte));
  assert.deepEqual(parseEventStream(oneByteEach), whole);
  assert.deepEqual(await sdkEvents(oneByteEach), wholeItems);
  return whole;
}

test('a chat stream with multi-byte text, logprobs, two choices and continuous usage, split at every byte', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens(CHAT_TEXT)), finishReason: 'stop', firstStepDelayMs: 2.5 * KEEP_ALIVE_MS };
  const bytes = await streamBytes('/v1/chat/completions', {
    messages: [{ role: 'user', content: 'hi' }],
    n: 2,
    logprobs: true,
    stream_options: { include_usage: true, continuous_usage_stats: true },
  });
  const text = new TextDecoder().decode(bytes);
  assert.ok(text.includes(': keep-alive\n\n'), 'the stream holds keep-alive comments');
  assert.ok(/[^\x00-\x7f]/.test(text), 'the stream holds multi-byte characters');
  const events = await checkEverySplit(bytes, false);
  for (const index of [0, 1]) {
    const content = events
      .slice(0, -1)
      .map((data) => JSON.parse(data) as { choices: { index: number; delta: { content?: string } }[] })
      .flatMap((event) => event.choices)
      .filter((choice) => choice.index === index)
      .map((choice) => choice.delta.content ?? '')
      .join('');
    assert.equal(content, CHAT_TEXT);
  }
});

test('a completion stream with echo and a stop string, split at every byte', async () => {
  script = { steps: oneTokenPerStep(gateway.tokens(`${COMPLETION_TEXT} STOP more`)), hang: true };
  const bytes = await streamBytes('/v1/completions', { prompt: 'Ünïcödé prompt ✓', echo: true, stop: [' STOP'] });
  const events = await checkEverySplit(bytes, true);
  const texts = events.slice(0, -1).map((data) => (JSON.parse(data) as { choices: { text: string }[] }).choices[0].text);
  assert.equal(texts.join(''), `Ünïcödé prompt ✓${COMPLETION_TEXT}`);
});
