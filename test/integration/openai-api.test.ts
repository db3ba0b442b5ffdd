// The real server, streamed from with the official `openai` client.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import type { RunningServer } from '../../bin/serve.ts';
import { boundedFetch, defaultModelDir, openaiClient, startServer } from './harness.ts';

const modelName = 'conduit-tiny';
let server: RunningServer;
let client: OpenAI;

before(async () => {
  server = await startServer([{ path: defaultModelDir, num_workers: 1, threads_per_worker: 1, kv_cache_blocks: 256, max_num_seqs: 16 }]);
  client = openaiClient(`${server.httpAddress}/v1`);
});

after(async () => {
  await server?.close();
});

/** The gauge summed over its workers. */
async function scrapeGauge(name: string): Promise<number> {
  const text = await (await boundedFetch(`${server.metricsAddress}/metrics`)).text();
  const lines = text.split('\n').filter((l) => l.startsWith(`${name}{`));
  assert.ok(lines.length > 0, `metric ${name} missing`);
  return lines.reduce((sum, line) => sum + Number(line.split(' ').at(-1)), 0);
}

test('lists the served model', async () => {
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), [modelName]);
});

test('chat completion streams chunks, then usage, with exact counts', async () => {
  const stream = await client.chat.completions.create({
    model: modelName,
    messages: [{ role: 'user', content: 'Hello there' }],
    max_tokens: 12,
    temperature: 0,
    ignore_eos: true,
    stream: true,
    stream_options: { include_usage: true },
  } as OpenAI.Chat.ChatCompletionCreateParamsStreaming);
  let text = '';
  let finishReason: string | null = null;
  let usage: OpenAI.CompletionUsage | null | undefined = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      text += choice.delta.content ?? '';
      finishReason = choice.finish_reason ?? finishReason;
    }
  }
  assert.equal(finishReason, 'length');
  assert.ok(usage);
  assert.equal(usage.completion_tokens, 12);
  const rendered = await boundedFetch(`${server.httpAddress}/tokenize`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: modelName, messages: [{ role: 'user', content: 'Hello there' }] }),
  }).then((r) => r.json() as Promise<{ count: number }>);
  assert.equal(usage.prompt_tokens, rendered.count);
  assert.equal(usage.total_tokens, usage.prompt_tokens + 12);
  assert.ok(text.length > 0);
});

test('greedy output is the same streamed or not, alone or among many', async () => {
  const request = { model: modelName, prompt: 'The quick brown fox', max_tokens: 16, temperature: 0, ignore_eos: true };
  const alone = await client.completions.create(request as OpenAI.CompletionCreateParamsNonStreaming);
  assert.equal(alone.choices[0].finish_reason, 'length');
  assert.equal(alone.usage?.completion_tokens, 16);

  const others = Array.from({ length: 7 }, (_, i) =>
    client.completions.create({ ...request, prompt: `Unrelated prompt number ${i} ${'x '.repeat(i * 5)}`, temperature: 0.9, seed: i } as OpenAI.CompletionCreateParamsNonStreaming));
  const streamed = (async () => {
    const stream = await client.completions.create({ ...request, stream: true } as OpenAI.CompletionCreateParamsStreaming);
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
    return text;
  })();
  const [streamedText] = await Promise.all([streamed, ...others]);
  assert.equal(streamedText, alone.choices[0].text);
});

test('a seeded sampled request repeats itself', async () => {
  const request = { model: modelName, messages: [{ role: 'user' as const, content: 'Tell me a story' }], max_tokens: 10, temperature: 1, seed: 1234 };
  const first = await client.chat.completions.create(request);
  const second = await client.chat.completions.create(request);
  assert.equal(first.choices[0].message.content, second.choices[0].message.content);
  assert.equal(first.choices[0].message.role, 'assistant');
});

test('different seeds sample different text; each seed repeats alone and among other requests', async () => {
  const seeds = [1, 2, 3, 4, 5, 6];
  const complete = (seed: number) =>
    client.completions
      .create({ model: modelName, prompt: 'And it came to pass', max_tokens: 24, temperature: 1, seed, ignore_eos: true } as OpenAI.CompletionCreateParamsNonStreaming)
      .then((completion) => completion.choices[0].text);
  const alone: string[] = [];
  for (const seed of seeds) alone.push(await complete(seed));
  // 24 tokens drawn at temperature 1: two seeds agreeing on all of them would be a sampler that ignores the seed.
  assert.equal(new Set(alone).size, seeds.length, `one text per seed: ${JSON.stringify(alone)}`);
  const unseeded = Array.from({ length: 4 }, (_, i) =>
    client.completions.create({ model: modelName, prompt: `Unrelated ${i}`, max_tokens: 8 + i, temperature: 0.8 } as OpenAI.CompletionCreateParamsNonStreaming),
  );
  const together = await Promise.all(seeds.map(complete));
  await Promise.all(unseeded);
  assert.deepEqual(together, alone);
});

test('several streams at once all finish', async () => {
  const results = await Promise.all(
    Array.from({ length: 6 }, async (_, i) => {
      const stream = await client.chat.completions.create({
        model: modelName,
        messages: [{ role: 'user', content: `Question ${i}` }],
        max_tokens: 8 + i,
        ignore_eos: true,
        stream: true,
      } as OpenAI.Chat.ChatCompletionCreateParamsStreaming);
      let numChunksWithText = 0;
      let finishReason: string | null = null;
      for await (const chunk of stream) {
        if (chunk.choices[0]?.delta.content) numChunksWithText++;
        finishReason = chunk.choices[0]?.finish_reason ?? finishReason;
      }
      return { numChunksWithText, finishReason };
    }),
  );
  for (const result of results) {
    assert.equal(result.finishReason, 'length');
    assert.ok(result.numChunksWithText > 0);
  }
});

test('a priority on a model served first come first served is a 400, as vLLM answers it', async () => {
  const request = { model: modelName, prompt: 'Hello', max_tokens: 2 };
  await assert.rejects(
    client.completions.create({ ...request, priority: 3 } as OpenAI.CompletionCreateParamsNonStreaming),
    (err: unknown) => err instanceof OpenAI.BadRequestError && /scheduling_policy: priority/.test(err.message),
  );
  const plain = await client.completions.create({ ...request, priority: 0 } as OpenAI.CompletionCreateParamsNonStreaming);
  assert.equal(plain.usage?.completion_tokens, 2);
});

test('unknown model is a 404 in the OpenAI envelope; the server keeps serving', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'nope', messages: [{ role: 'user', content: 'hi' }] }),
    (err: unknown) => err instanceof OpenAI.NotFoundError && err.status === 404,
  );
  const ok = await client.completions.create({ model: modelName, prompt: 'hi', max_tokens: 2 });
  assert.equal(ok.object, 'text_completion');
});

test('a stream the client abandons frees its KV blocks in the worker, which stops generating for it', async () => {
  // The tokens the worker computes, as its step reports count them: a fast machine finishes
  // 2000 tokens within any fixed deadline, so the abort is checked by what the worker did.
  const numTokensComputedBefore = await scrapeGauge('conduit_engine_tokens_per_step_sum');
  const controller = new AbortController();
  const stream = await client.chat.completions.create(
    {
      model: modelName,
      messages: [{ role: 'user', content: 'Go on forever' }],
      max_tokens: 2000,
      ignore_eos: true,
      stream: true,
    } as OpenAI.Chat.ChatCompletionCreateParamsStreaming,
    { signal: controller.signal },
  );
  let numChunks = 0;
  for await (const _chunk of stream) {
    if (++numChunks === 3) {
      assert.ok((await scrapeGauge('conduit_kv_blocks_used')) > 0);
      controller.abort();
      break;
    }
  }
  assert.equal(numChunks, 3);
  // A bound for a hang only: the blocks come back within a few steps of the abort.
  const deadlineMs = Date.now() + 30_000;
  let blocksInUse = -1;
  while (Date.now() < deadlineMs) {
    blocksInUse = await scrapeGauge('conduit_kv_blocks_used');
    if (blocksInUse === 0) break;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  assert.equal(blocksInUse, 0);
  assert.equal(await scrapeGauge('conduit_num_requests_running'), 0);
  const numTokensComputed = (await scrapeGauge('conduit_engine_tokens_per_step_sum')) - numTokensComputedBefore;
  assert.ok(numTokensComputed < 1000, `the worker computed ${numTokensComputed} tokens for a request abandoned after 3 chunks`);
});

test('a second chat turn reports its history as cached; the prefix-cache counters and step histograms fill', async () => {
  const history: OpenAI.Chat.ChatCompletionMessageParam[] = [
    { role: 'system', content: 'You are a patient assistant who answers every question at length. '.repeat(4) },
    { role: 'user', content: 'Tell me about the sea.' },
  ];
  const first = await client.chat.completions.create({ model: modelName, messages: history, max_tokens: 8, temperature: 0 });
  assert.equal(first.usage?.prompt_tokens_details?.cached_tokens, 0);
  const second = await client.chat.completions.create({
    model: modelName,
    messages: [...history, first.choices[0].message as OpenAI.Chat.ChatCompletionMessageParam, { role: 'user', content: 'And the sky?' }],
    max_tokens: 8,
    temperature: 0,
  });
  const cachedTokens = second.usage?.prompt_tokens_details?.cached_tokens ?? 0;
  // Block size 16: every full block of the first prompt is reused.
  assert.ok(cachedTokens >= Math.floor(first.usage!.prompt_tokens / 16) * 16 && cachedTokens > 0, `${cachedTokens} cached`);
  assert.ok(cachedTokens < second.usage!.prompt_tokens);
  // A different salt shares nothing.
  const salted = await client.chat.completions.create({ model: modelName, messages: history, max_tokens: 1, cache_salt: 'tenant-b' } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
  assert.equal(salted.usage?.prompt_tokens_details?.cached_tokens, 0);

  assert.ok((await scrapeGauge('conduit_prefix_cache_hits_total')) >= cachedTokens);
  assert.ok((await scrapeGauge('conduit_prefix_cache_queries_total')) > (await scrapeGauge('conduit_prefix_cache_hits_total')));
  assert.ok((await scrapeGauge('conduit_engine_step_duration_seconds_count')) > 0);
});

test('top logprobs, logit bias and penalties through the SDK, on the real model', async () => {
  const completion = await client.chat.completions.create({
    model: modelName,
    messages: [{ role: 'user', content: 'Count with me' }],
    max_tokens: 6,
    temperature: 0,
    logprobs: true,
    top_logprobs: 5,
    ignore_eos: true,
  } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
  const content = completion.choices[0].logprobs!.content!;
  assert.equal(content.length, 6);
  for (const entry of content) {
    assert.equal(entry.top_logprobs.length, 5);
    // Greedy: the sampled token is the likeliest, and the alternatives descend.
    assert.deepEqual([entry.top_logprobs[0].token, entry.top_logprobs[0].logprob], [entry.token, entry.logprob]);
    for (let k = 1; k < 5; k++) assert.ok(entry.top_logprobs[k].logprob <= entry.top_logprobs[k - 1].logprob);
  }
  // A bias of +100 on the greedy second choice of the first token makes it the answer, every time.
  const tokenized = await (
    await boundedFetch(`${server.httpAddress}/tokenize`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: modelName, prompt: content[0].top_logprobs[1].token, add_special_tokens: false }),
    })
  ).json();
  assert.equal(tokenized.count, 1);
  const biased = await client.completions.create({
    model: modelName,
    prompt: 'Count with me',
    max_tokens: 4,
    temperature: 0,
    logit_bias: { [String(tokenized.tokens[0])]: 100 },
    ignore_eos: true,
  } as OpenAI.CompletionCreateParamsNonStreaming);
  const detokenized = await (
    await boundedFetch(`${server.httpAddress}/detokenize`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: modelName, tokens: Array(4).fill(tokenized.tokens[0]) }),
    })
  ).json();
  assert.equal(biased.choices[0].text, detokenized.prompt);
  // A strong frequency penalty forbids the repetition the bias forced.
  const penalized = await client.completions.create({
    model: modelName,
    prompt: 'Count with me',
    max_tokens: 4,
    temperature: 0,
    logit_bias: { [String(tokenized.tokens[0])]: 5 },
    frequency_penalty: 2,
    presence_penalty: 2,
    ignore_eos: true,
  } as OpenAI.CompletionCreateParamsNonStreaming);
  assert.notEqual(penalized.choices[0].text, detokenized.prompt);
});

test('completions: a list of prompts, n, echo with prompt logprobs, and include_stop_str_in_output, on the real model', async () => {
  const prompts = ['The capital of France', 'Once upon a time'];
  const completion = await client.completions.create({
    model: modelName,
    prompt: prompts,
    n: 2,
    max_tokens: 4,
    temperature: 0,
    echo: true,
    logprobs: 1,
    ignore_eos: true,
  } as OpenAI.CompletionCreateParamsNonStreaming);
  // Prompt-major: index = promptIndex * n + choiceIndex.
  assert.deepEqual(completion.choices.map((choice) => choice.index), [0, 1, 2, 3]);
  const promptTokenCounts: number[] = [];
  for (const [promptIndex, prompt] of prompts.entries()) {
    const tokenized = await (
      await fetch(`${server.httpAddress}/tokenize`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: modelName, prompt }),
      })
    ).json();
    promptTokenCounts.push(tokenized.count);
    const [first, second] = completion.choices.slice(promptIndex * 2, promptIndex * 2 + 2);
    // Greedy: both choices of a prompt agree; echo puts the prompt first.
    assert.equal(first.text, second.text);
    assert.ok(first.text.startsWith(prompt), first.text);
    const logprobs = first.logprobs!;
    // The prompt's tokens (as the engine scored them), the first without a logprob, then the 4 sampled.
    assert.equal(logprobs.tokens!.length, tokenized.count + 4);
    assert.equal(logprobs.token_logprobs![0], null);
    for (const logprob of logprobs.token_logprobs!.slice(1)) assert.ok(typeof logprob === 'number' && logprob <= 0);
    assert.equal(logprobs.tokens!.join(''), first.text);
    assert.equal(logprobs.text_offset![0], 0);
  }
  assert.equal(completion.usage!.prompt_tokens, promptTokenCounts[0] + promptTokenCounts[1]);
  assert.equal(completion.usage!.completion_tokens, 4 * 4);

  // A stop string taken from the greedy text: kept with include_stop_str_in_output, cut without.
  const greedy = completion.choices[0].text.slice(prompts[0].length);
  const stop = greedy.trim().slice(0, 2);
  assert.ok(stop.length > 0, `greedy text: ${JSON.stringify(greedy)}`);
  const upToStop = greedy.slice(0, greedy.indexOf(stop));
  for (const includeStop of [true, false]) {
    const stopped = await client.completions.create({
      model: modelName,
      prompt: prompts[0],
      max_tokens: 4,
      temperature: 0,
      stop,
      include_stop_str_in_output: includeStop,
      ignore_eos: true,
    } as OpenAI.CompletionCreateParamsNonStreaming);
    assert.equal(stopped.choices[0].text, includeStop ? upToStop + stop : upToStop);
    assert.equal(stopped.choices[0].finish_reason, 'stop');
  }
});

test("without max_tokens a reply runs to the checkpoint's max_new_tokens (128), on chat and completions alike", async () => {
  // ignore_eos holds each reply to its limit, so the limit is what is measured.
  const chat = await client.chat.completions.create({
    model: modelName, messages: [{ role: 'user', content: 'Speak on.' }], ...{ ignore_eos: true },
  } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
  assert.deepEqual({ tokens: chat.usage?.completion_tokens, finish: chat.choices[0].finish_reason }, { tokens: 128, finish: 'length' });
  const completion = await client.completions.create({ model: modelName, prompt: 'In the beginning', ...{ ignore_eos: true } });
  assert.equal(completion.usage?.completion_tokens, 128);
  const capped = await client.completions.create({ model: modelName, prompt: 'In the beginning', max_tokens: 200, ...{ ignore_eos: true } });
  assert.equal(capped.usage?.completion_tokens, 200, "a request's own limit overrides the checkpoint's");
});
