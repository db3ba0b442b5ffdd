// The Responses store bounded in bytes and time: log-probabilities kept as typed arrays (a
// response of 2,000 tokens with 20 alternatives each in well under a megabyte, where its JSON
// took about 11 MB) and given back exactly; the least recently used responses leave first past
// the byte or count bound; a response expires after its time whatever its use.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { TokenLogprob } from '../generation.ts';
import { chatLogprobsOf } from '../openai/logprobs.ts';
import { LogprobsRecorder } from '../openai/responses/compact-logprobs.ts';
import { outputMessage, outputText, responseObject, type ResponseEcho } from '../openai/responses/objects.ts';
import { ResponseStore, responseObjectOf, storedBytesOf, type StoredResponse } from '../openai/responses/store.ts';
import type { Tokenizer } from '../tokenizer/tokenizer.ts';

/** What chatLogprobsOf reads of a tokenizer: each token's bytes (here its id in letters, and a split character for some). */
const tokenizer = {
  tokenBytes: (tokenId: number) => (tokenId % 7 === 0 ? new Uint8Array([0xe6, 0x9d]) : new TextEncoder().encode(`tok${tokenId}`)),
} as unknown as Tokenizer;

function echoOf(id: string): ResponseEcho {
  return {
    id, createdAtSec: 1, model: 'tiny', instructions: null, maxOutputTokens: null, previousResponseId: null, store: true,
    temperature: null, topP: null, topLogprobs: 20, toolChoice: 'auto', user: null, metadata: {},
    truncation: 'disabled', tools: [], parallelToolCalls: true, textFormat: { type: 'text' },
  };
}

/** A stored response of numTokens tokens, each with numTop alternatives; and the log-probabilities' JSON as a client got it. */
function storedResponse(id: string, numTokens: number, numTop: number, text = 'x'.repeat(numTokens)) {
  const entries: TokenLogprob[] = Array.from({ length: numTokens }, (_, i) => ({
    tokenId: i,
    logprob: -Math.random() * 5,
    topTokenIds: Array.from({ length: numTop }, (_, k) => 1000 + i + k),
    topLogprobs: Array.from({ length: numTop }, (_, k) => -k - Math.random()),
  }));
  const recorder = new LogprobsRecorder(tokenizer);
  // As a turn gets them: a few tokens at a time.
  for (let i = 0; i < entries.length; i += 3) recorder.push(entries.slice(i, i + 3));
  const stored: StoredResponse = {
    response: responseObject(echoOf(id), { status: 'completed', output: [outputMessage(`msg_${id}`, 'completed', [outputText(text, [])])], usage: null }),
    messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: text }],
    logprobs: numTokens === 0 ? null : recorder.build(),
  };
  return { stored, logprobsJson: chatLogprobsOf(tokenizer, entries).content };
}

test('2,000 tokens with 20 alternatives each are kept in under a megabyte, and their JSON comes back exactly', () => {
  const { stored, logprobsJson } = storedResponse('resp_big', 2000, 20);
  const numJsonBytes = JSON.stringify(logprobsJson).length;
  const numStoredBytes = storedBytesOf(stored);
  assert.ok(numJsonBytes > 3_000_000, `the JSON: ${numJsonBytes} bytes (as objects in memory, several times that)`);
  assert.ok(numStoredBytes < 1_000_000, `stored: ${numStoredBytes} bytes`);
  const full = responseObjectOf(stored);
  const [fullMessage, storedMessage] = [full.output[0], stored.response.output[0]];
  assert.ok(fullMessage.type === 'message' && storedMessage.type === 'message');
  assert.deepEqual(fullMessage.content[0].logprobs, logprobsJson);
  assert.equal(storedMessage.content[0].logprobs.length, 0, 'the stored object holds no JSON of them');
});

test('bounded in bytes: past the bound the least recently used leave first, and the bytes counted stay under it', () => {
  const responses = ['a', 'b', 'c', 'd'].map((id) => storedResponse(`resp_${id}`, 200, 20).stored);
  const numBytesEach = storedBytesOf(responses[0]);
  const store = new ResponseStore({ maxResponses: 100, maxBytes: Math.floor(numBytesEach * 3.5), ttlMs: 60_000 });
  const [a, b, c, d] = responses;
  store.put(a);
  store.put(b);
  store.put(c);
  assert.equal(store.size, 3);
  // a is used, so b is now the least recently used.
  assert.equal(store.get('resp_a'), a);
  store.put(d);
  assert.equal(store.get('resp_b'), undefined);
  assert.deepEqual(['resp_a', 'resp_c', 'resp_d'].map((id) => store.get(id)), [a, c, d]);
  assert.ok(store.numStoredBytes <= Math.floor(numBytesEach * 3.5));
  assert.equal(store.numStoredBytes, 3 * numBytesEach);
  assert.equal(store.delete('resp_c'), true);
  assert.equal(store.numStoredBytes, 2 * numBytesEach);
  // One larger than the whole store is not kept, and pushes nothing out.
  store.put(storedResponse('resp_huge', 20_000, 20).stored);
  assert.equal(store.get('resp_huge'), undefined);
  assert.equal(store.size, 2);
});

test('the count bound, and expiry after the time to live whatever the use', () => {
  let nowMs = 0;
  const store = new ResponseStore({ maxResponses: 2, maxBytes: 1 << 30, ttlMs: 1000 }, () => nowMs);
  const [a, b, c] = ['a', 'b', 'c'].map((id) => storedResponse(`resp_${id}`, 10, 2).stored);
  store.put(a);
  nowMs = 500;
  store.put(b);
  assert.equal(store.get('resp_a'), a);
  store.put(c);
  assert.equal(store.get('resp_b'), undefined, 'b was the least recently used');
  nowMs = 999;
  assert.equal(store.get('resp_a'), a);
  nowMs = 1000;
  assert.equal(store.get('resp_a'), undefined, 'a expired, though just used');
  assert.equal(store.get('resp_c'), c);
  nowMs = 1500;
  assert.equal(store.get('resp_c'), undefined);
  assert.equal(store.size, 0);
  assert.equal(store.numStoredBytes, 0);
});
