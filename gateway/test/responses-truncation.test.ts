// The Responses API's truncation: "auto" drops a conversation's oldest exchanges so the prompt
// leaves room for the reply; "disabled" (the default) refuses it. Over a real gateway on a
// scripted engine with a 64-token context, and fitConversation's search against a plain scan.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import OpenAI from 'openai';
import { ApiError } from '../errors.ts';
import { fitConversation } from '../openai/responses/truncation.ts';
import type { ChatMessage } from '../tokenizer/chat-template.ts';
import { MAX_MODEL_LEN, MODEL_NAME, startTestGateway, type TestGateway } from './harness.ts';
import type { Script } from './scripted-engine.ts';
import { testSeed } from '../../test/seed.ts';

const REPLY = ' Yes.';
const MAX_OUTPUT_TOKENS = 8;
let gateway: TestGateway;
let client: OpenAI;
const script: Script = { steps: [], finishReason: 'stop' };
before(async () => {
  gateway = await startTestGateway(() => script);
  script.steps = [gateway.tokens(REPLY)];
  client = new OpenAI({ baseURL: `${gateway.baseUrl}/v1`, apiKey: 'unused', maxRetries: 0 });
});
after(() => gateway.close());

/** The harness model's chat template, written out. */
function render(messages: readonly ChatMessage[]): string {
  return messages.map((message) => `<|${message.role}|>${message.content}<|endoftext|>`).join('') + '<|assistant|>';
}

function numTokens(messages: readonly ChatMessage[]): number {
  return gateway.tokens(render(messages)).length;
}

function lastPromptTokenIds(): number[] {
  return gateway.engine.requests.at(-1)!.promptTokenIds;
}

test('"auto" holds a conversation longer than the context: each turn sends the longest recent part that fits, from a user message', async () => {
  const conversation: ChatMessage[] = [{ role: 'system', content: 'Be kind.' }];
  let previousResponseId: string | undefined;
  let numTruncatedTurns = 0;
  for (let turn = 1; turn <= 8; turn++) {
    const input = `Question ${turn}: is it so?`;
    const response = await client.responses.create({
      model: MODEL_NAME,
      input: turn === 1 ? [{ role: 'system', content: 'Be kind.' }, { role: 'user', content: input }] : input,
      previous_response_id: previousResponseId,
      truncation: 'auto',
      max_output_tokens: MAX_OUTPUT_TOKENS,
    });
    assert.equal(response.status, 'completed', `turn ${turn}`);
    assert.equal(response.output_text, REPLY);
    assert.equal(response.truncation, 'auto');
    conversation.push({ role: 'user', content: input });
    // The kept part: the system message and the conversation from some user message on.
    const starts = conversation.flatMap((message, index) => (message.role === 'user' ? [index] : []));
    const keptFrom = (start: number) => [conversation[0], ...conversation.slice(start)];
    const start = starts.find((candidate) => numTokens(keptFrom(candidate)) + MAX_OUTPUT_TOKENS <= MAX_MODEL_LEN);
    assert.ok(start !== undefined, `turn ${turn}: the last exchange fits`);
    assert.deepEqual(lastPromptTokenIds(), gateway.tokens(render(keptFrom(start))), `turn ${turn}: the prompt is the conversation from message ${start}`);
    assert.equal(response.usage?.input_tokens, lastPromptTokenIds().length);
    if (start > 1) numTruncatedTurns++;
    conversation.push({ role: 'assistant', content: REPLY });
    previousResponseId = response.id;
  }
  assert.ok(numTruncatedTurns >= 3, `only ${numTruncatedTurns} turns needed truncating: the test's conversation is too short`);
  // The stored chain keeps every exchange: a "disabled" turn on it is refused.
  const refused = await gateway.post('/v1/responses', { model: MODEL_NAME, input: 'And now?', previous_response_id: previousResponseId });
  assert.equal(refused.status, 400);
  assert.equal(((await refused.json()) as { error: { code: string } }).error.code, 'context_length_exceeded');
});

test('"disabled" (and no truncation at all) refuses what does not fit; "auto" refuses an input that alone cannot fit', async () => {
  const long = 'many words here '.repeat(20);
  for (const truncation of ['disabled', undefined, 'auto'] as const) {
    const response = await gateway.post('/v1/responses', { model: MODEL_NAME, input: long, truncation });
    assert.equal(response.status, 400, String(truncation));
    const { error } = (await response.json()) as { error: { code: string; param: string } };
    assert.deepEqual({ code: error.code, param: error.param }, { code: 'context_length_exceeded', param: 'input' }, String(truncation));
  }
  // A conversation that fits is sent whole either way.
  const first = await client.responses.create({ model: MODEL_NAME, input: 'Hi', truncation: 'disabled' });
  assert.equal(first.truncation, 'disabled');
  const second = await client.responses.create({ model: MODEL_NAME, input: 'Again', previous_response_id: first.id, truncation: 'auto' });
  assert.equal(second.status, 'completed');
  assert.deepEqual(lastPromptTokenIds(), gateway.tokens(render([{ role: 'user', content: 'Hi' }, { role: 'assistant', content: REPLY }, { role: 'user', content: 'Again' }])));
});

test('"auto" keeps the instructions, and room for the default reply length when max_output_tokens is not set', async () => {
  let previousResponseId: string | undefined;
  for (let turn = 1; turn <= 6; turn++) {
    const response = await client.responses.create({
      model: MODEL_NAME, instructions: 'Short.', input: `Turn ${turn} asks a longer question than most`, previous_response_id: previousResponseId, truncation: 'auto',
    });
    assert.equal(response.status, 'completed');
    const prompt = gateway.tokenizer.decode(lastPromptTokenIds(), { skipSpecialTokens: false });
    assert.ok(prompt.startsWith('<|system|>Short.<|endoftext|><|user|>'), prompt);
    assert.ok(prompt.includes(`Turn ${turn} asks`), prompt);
    // No checkpoint default here: one token of room is all that is kept for.
    assert.ok(lastPromptTokenIds().length < MAX_MODEL_LEN);
    previousResponseId = response.id;
  }
});

/** A conversation of random exchanges: users, assistants (some calling tools), tool results, a system message or two. */
function randomConversation(next: () => number): ChatMessage[] {
  const messages: ChatMessage[] = [];
  if (next() < 0.5) messages.push({ role: 'system', content: 's'.repeat(1 + Math.floor(next() * 5)) });
  const numExchanges = 1 + Math.floor(next() * 12);
  for (let i = 0; i < numExchanges; i++) {
    messages.push({ role: 'user', content: 'u'.repeat(1 + Math.floor(next() * 20)) });
    if (next() < 0.3) {
      messages.push({ role: 'assistant', content: '', tool_calls: [{ id: `c${i}`, type: 'function', function: { name: 'f', arguments: {} } }] });
      messages.push({ role: 'tool', content: 't'.repeat(1 + Math.floor(next() * 10)), tool_call_id: `c${i}` });
    }
    if (i < numExchanges - 1 || next() < 0.5) messages.push({ role: 'assistant', content: 'a'.repeat(1 + Math.floor(next() * 20)) });
    if (next() < 0.1) messages.push({ role: 'system', content: 'mid' });
  }
  return messages;
}

test('fitConversation finds the earliest user message to start at, as a plain scan does, in a few encodings', async (t) => {
  let state = testSeed(t) || 1;
  const next = () => {
    // xorshift32: a replayable stream from the test's seed.
    state ^= state << 13; state ^= state >>> 17; state ^= state << 5; state >>>= 0;
    return state / 2 ** 32;
  };
  for (let trial = 0; trial < 300; trial++) {
    const messages = randomConversation(next);
    const maxModelLen = 10 + Math.floor(next() * 150);
    const numReplyTokens = 1 + Math.floor(next() * 8);
    // One token per character plus two per message; past 3x the context, refused by "length" before encoding.
    let numEncodings = 0;
    const encode = async (kept: readonly ChatMessage[]) => {
      numEncodings++;
      const numChars = kept.reduce((sum, message) => sum + message.content.length, 0);
      if (numChars > 3 * maxModelLen) throw new ApiError('context_length_exceeded', 'too long by characters', 'input');
      return Array.from({ length: numChars + 2 * kept.length }, () => 0);
    };
    // The plain scan: each start in order, the first that fits wins; none: the last user message's.
    const starts = [0, ...messages.flatMap((message, index) => (index > 0 && message.role === 'user' ? [index] : []))];
    const keptFrom = (start: number) => [...messages.slice(0, start).filter((message) => message.role === 'system'), ...messages.slice(start)];
    const lengthOf = (kept: ChatMessage[]) => kept.reduce((sum, message) => sum + message.content.length, 0) + 2 * kept.length;
    const fittingStart = starts.find((candidate) => lengthOf(keptFrom(candidate)) + numReplyTokens <= maxModelLen);
    const start = fittingStart ?? starts.at(-1)!;
    const expected = keptFrom(start);
    let fitted;
    try {
      fitted = await fitConversation(messages, encode, maxModelLen, numReplyTokens);
    } catch (err) {
      // Nothing fits and even the last exchange is too long to encode: its refusal is the caller's error.
      assert.equal(fittingStart, undefined, `trial ${trial}: refused though start ${fittingStart} fits`);
      assert.ok(err instanceof ApiError && err.code === 'context_length_exceeded', `trial ${trial}: ${err}`);
      assert.ok(lengthOf(expected) - 2 * expected.length > 3 * maxModelLen, `trial ${trial}: refused, yet encodable`);
      continue;
    }
    assert.equal(fitted.promptTokenIds.length, lengthOf(expected), `trial ${trial}`);
    assert.equal(fitted.numDroppedMessages, messages.length - expected.length, `trial ${trial}`);
    assert.ok(expected.find((message) => message.role !== 'system')?.role !== 'tool', `trial ${trial}: no tool result leads`);
    assert.ok(numEncodings <= 2 + Math.ceil(Math.log2(starts.length + 1)), `trial ${trial}: ${numEncodings} encodings for ${starts.length} starts`);
  }
});
