// The draft-model proposer served: conduit-tiny with models/conduit-tiny-draft as its draft
// (`speculative_config.method: draft_model`), through the official `openai` client. The worker
// loads both; a speculating request gets exactly the text and logprobs of one that does not,
// and the draft's guesses are accepted often enough to show it runs.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import OpenAI from 'openai';
import type { RunningServer } from '../../bin/serve.ts';
import { defaultModelDir, openaiClient, startServer } from './harness.ts';

let server: RunningServer;
let client: OpenAI;

before(async () => {
  server = await startServer([{
    path: defaultModelDir, num_workers: 1, threads_per_worker: 1, kv_cache_blocks: 256, max_num_seqs: 4,
    speculative_config: { method: 'draft_model', model: path.join(path.dirname(defaultModelDir), 'conduit-tiny-draft'), num_speculative_tokens: 3, adaptive: false },
  }]);
  client = openaiClient(`${server.httpAddress}/v1`);
});

after(async () => {
  await server?.close();
});

type Params = OpenAI.Completions.CompletionCreateParamsNonStreaming & { num_speculative_tokens?: number; ignore_eos?: boolean };

test('a draft model\'s guesses change no text or logprob, and some are accepted', async () => {
  let numAccepted = 0;
  for (const [index, prompt] of ['In the beginning God created the heaven and the earth.', 'And the LORD spake unto Moses, saying,'].entries()) {
    const base: Params = { model: 'conduit-tiny', prompt, max_tokens: 40, temperature: index === 1 ? 0.8 : 0, seed: 5, logprobs: 2, ignore_eos: true };
    const [speculated, plain] = await Promise.all([client.completions.create(base), client.completions.create({ ...base, num_speculative_tokens: 0 } as Params)]);
    assert.equal(speculated.choices[0].text, plain.choices[0].text, prompt);
    assert.deepEqual(speculated.choices[0].logprobs, plain.choices[0].logprobs, prompt);
    numAccepted += speculated.usage?.completion_tokens_details?.accepted_prediction_tokens ?? 0;
  }
  assert.ok(numAccepted > 0, 'the draft, distilled from conduit-tiny, guesses some of its tokens');
});
