// Speculative decoding served: `speculative_config` on conduit-tiny, through the official
// `openai` client. A request that speculates gets the text and logprobs of one that does not
// (num_speculative_tokens: 0), its usage says how many proposed tokens were accepted and
// rejected (OpenAI's prediction-token fields), and the spec_decode counters fill.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import type { RunningServer } from '../../bin/serve.ts';
import { boundedFetch, defaultModelDir, openaiClient, startServer } from './harness.ts';

const modelName = 'conduit-tiny';
let server: RunningServer;
let client: OpenAI;

before(async () => {
  server = await startServer([{
    path: defaultModelDir, num_workers: 1, threads_per_worker: 1, kv_cache_blocks: 256, max_num_seqs: 8,
    speculative_config: { method: 'ngram', num_speculative_tokens: 4, prompt_lookup_min: 1, prompt_lookup_max: 3, adaptive: false },
  }]);
  client = openaiClient(`${server.httpAddress}/v1`);
});

after(async () => {
  await server?.close();
});

async function scrapeCounter(name: string): Promise<number> {
  const text = await (await boundedFetch(`${server.metricsAddress}/metrics`)).text();
  return text.split('\n').filter((l) => l.startsWith(`${name}{`)).reduce((sum, line) => sum + Number(line.split(' ').at(-1)), 0);
}

type Params = OpenAI.Completions.CompletionCreateParamsNonStreaming & { num_speculative_tokens?: number; ignore_eos?: boolean };

test('speculating requests get exactly the text and logprobs of plain ones, and usage counts the proposals', async () => {
  const prompts = ['Once upon a time there was a little fox. The little fox', 'The king said to the queen: the king said', 'one two three one two three one two'];
  let numAccepted = 0;
  for (const [index, prompt] of prompts.entries()) {
    const base: Params = { model: modelName, prompt, max_tokens: 48, temperature: index === 2 ? 0.8 : 0, seed: 11, logprobs: 2, ignore_eos: true };
    const [speculated, plain] = await Promise.all([
      client.completions.create(base),
      client.completions.create({ ...base, num_speculative_tokens: 0 } as Params),
    ]);
    assert.equal(speculated.choices[0].text, plain.choices[0].text, prompt);
    assert.deepEqual(speculated.choices[0].logprobs, plain.choices[0].logprobs, prompt);
    assert.equal(plain.usage?.completion_tokens_details, undefined, 'a request that does not speculate reports no prediction tokens');
    const details = speculated.usage?.completion_tokens_details;
    assert.ok(details !== undefined, 'the speculating request reports its prediction tokens');
    assert.ok(details.accepted_prediction_tokens! >= 0 && details.rejected_prediction_tokens! >= 0);
    numAccepted += details.accepted_prediction_tokens!;
  }
  assert.ok(numAccepted > 0, 'conduit-tiny repeats itself: some proposals were accepted');
  const numDraftTokens = await scrapeCounter('conduit_spec_decode_num_draft_tokens_total');
  const numAcceptedTokens = await scrapeCounter('conduit_spec_decode_num_accepted_tokens_total');
  assert.ok(numDraftTokens > 0 && numAcceptedTokens >= numAccepted && numAcceptedTokens <= numDraftTokens, `${numAcceptedTokens} of ${numDraftTokens}`);
  assert.ok((await scrapeCounter('conduit_spec_decode_num_drafts_total')) > 0);
  assert.ok((await scrapeCounter('conduit_spec_decode_num_accepted_tokens_per_pos_total')) === numAcceptedTokens);
});

test('a chat stream that speculates streams the same text as one that does not', async () => {
  const request = { model: modelName, messages: [{ role: 'user' as const, content: 'Tell me a story about a fox and a fox.' }], max_tokens: 40, temperature: 0, stream: true as const };
  const collect = async (extra: Record<string, unknown>) => {
    let text = '';
    let numChunks = 0;
    for await (const chunk of await client.chat.completions.create({ ...request, ...extra } as OpenAI.Chat.ChatCompletionCreateParamsStreaming)) {
      text += chunk.choices[0]?.delta.content ?? '';
      numChunks++;
    }
    return { text, numChunks };
  };
  const [speculated, plain] = await Promise.all([collect({}), collect({ num_speculative_tokens: 0 })]);
  assert.equal(speculated.text, plain.text);
  assert.ok(speculated.text.length > 0);
});

test('num_speculative_tokens out of range is a 400', async () => {
  await assert.rejects(
    client.completions.create({ model: modelName, prompt: 'x', max_tokens: 1, num_speculative_tokens: 17 } as Params),
    (err: unknown) => err instanceof OpenAI.BadRequestError,
  );
});

test('the Responses API takes num_speculative_tokens per request, as chat and completions do', async () => {
  type ResponseParams = OpenAI.Responses.ResponseCreateParamsNonStreaming & { num_speculative_tokens?: number; ignore_eos?: boolean };
  const base: ResponseParams = { model: modelName, input: 'one two three one two three one two', max_output_tokens: 40, temperature: 0, ignore_eos: true, store: false };
  // One at a time, so that the counters' change belongs to the request.
  const draftsBefore = await scrapeCounter('conduit_spec_decode_num_draft_tokens_total');
  const plain = await client.responses.create({ ...base, num_speculative_tokens: 0 } as ResponseParams);
  const draftsAfterPlain = await scrapeCounter('conduit_spec_decode_num_draft_tokens_total');
  assert.equal(draftsAfterPlain, draftsBefore, 'num_speculative_tokens: 0 proposes nothing');
  const speculated = await client.responses.create({ ...base, num_speculative_tokens: 4 } as ResponseParams);
  assert.ok((await scrapeCounter('conduit_spec_decode_num_draft_tokens_total')) > draftsAfterPlain, 'num_speculative_tokens: 4 verifies proposals');
  assert.equal(speculated.output_text, plain.output_text);
  assert.ok(plain.output_text.length > 0);
  await assert.rejects(client.responses.create({ ...base, num_speculative_tokens: 17 } as ResponseParams), (err: unknown) => err instanceof OpenAI.BadRequestError);
});
