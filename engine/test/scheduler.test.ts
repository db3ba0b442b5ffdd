import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { RequestOutput, SamplingParams } from '../types.ts';
import type { TokenScript } from './fake-runner.ts';
import { EOS, plan, request, setup } from './scheduler-harness.ts';

test('a new request joins the running batch at the next step and a finished one leaves it', async () => {
  const { scheduler, runner, step } = setup();
  assert.equal(scheduler.add(request('a', 5, { maxTokens: 3 })), null);
  assert.deepEqual(plan((await step()).output), ['a:5*']);
  assert.equal(scheduler.add(request('b', 6, { maxTokens: 3 })), null);
  assert.deepEqual(plan((await step()).output), ['a:1*', 'b:6*']);
  const third = await step();
  assert.deepEqual(plan(third.output), ['a:1*', 'b:1*']);
  assert.deepEqual(
    third.news.map((news) => [news.requestId, news.newTokenIds, news.finishReason, news.numOutputTokens]),
    [
      ['a', runner.scriptedTokenIds('a', 3).slice(2), 'length', 3],
      ['b', runner.scriptedTokenIds('b', 2).slice(1), null, 2],
    ],
  );
  assert.deepEqual(plan((await step()).output), ['b:1*']);
  assert.equal(scheduler.hasUnfinished, false);
});

test('decode tokens go first, then prompts are chunked under the token budget', async () => {
  const { scheduler, step } = setup({ maxNumBatchedTokens: 8 });
  scheduler.add(request('a', 3, { maxTokens: 10 }));
  assert.deepEqual(plan((await step()).output), ['a:3*']);
  scheduler.add(request('b', 20, { maxTokens: 2 }));
  const chunks: string[][] = [];
  for (let i = 0; i < 4; i++) chunks.push(plan((await step()).output));
  assert.deepEqual(chunks, [
    ['a:1*', 'b:7'],
    ['a:1*', 'b:7'],
    ['a:1*', 'b:6*'],
    ['a:1*', 'b:1*'],
  ]);
});

test('positions continue where the computed tokens end, across chunks and decodes', async () => {
  const { scheduler, step } = setup({ maxNumSeqs: 4, maxNumBatchedTokens: 4 });
  scheduler.add(request('a', 6, { maxTokens: 2 }));
  const starts: number[] = [];
  for (let i = 0; i < 3; i++) starts.push((await step()).output.scheduled[0].startPosition);
  assert.deepEqual(starts, [0, 4, 6]);
});

test('blocks return to the pool on finish, abort and runner error', async () => {
  const { scheduler, runner, step } = setup({ numKvBlocks: 16 });
  scheduler.add(request('finishes', 9, { maxTokens: 1 }));
  await step();
  assert.equal(scheduler.load().numFreeBlocks, 16);

  scheduler.add(request('aborted', 9, { maxTokens: 5 }));
  await step();
  assert.equal(scheduler.load().numFreeBlocks, 16 - 3);
  const aborted = scheduler.abort('aborted');
  assert.equal(aborted?.finishReason, 'abort');
  assert.equal(aborted?.numOutputTokens, 1);
  assert.equal(scheduler.load().numFreeBlocks, 16);
  assert.equal(scheduler.abort('aborted'), null);

  scheduler.add(request('fails', 9, { maxTokens: 5 }));
  const output = scheduler.schedule();
  runner.failNextWith = 'device lost';
  await assert.rejects(runner.execute(output), /device lost/);
  const failed = scheduler.failStep(output, { code: 'internal_error', message: 'device lost' });
  assert.deepEqual(
    failed.map((news) => [news.requestId, news.finishReason, news.error?.code]),
    [['fails', 'error', 'internal_error']],
  );
  assert.equal(scheduler.load().numFreeBlocks, 16);
  assert.equal(scheduler.hasUnfinished, false);
});

test('an abort of a waiting request takes it out of the queue', () => {
  const { scheduler } = setup();
  scheduler.add(request('queued', 4));
  assert.equal(scheduler.load().numWaiting, 1);
  assert.equal(scheduler.abort('queued')?.finishReason, 'abort');
  assert.deepEqual(scheduler.load(), { numRunning: 0, numWaiting: 0, numFreeBlocks: 64, numTotalBlocks: 64, numQueuedPrefillTokens: 0, numCachedBlocks: 0 });
});

test('a request waits while the pool is full and runs once blocks come back', async () => {
  // 5 blocks of 4 tokens: "big" keeps 4 of them until it finishes.
  const { scheduler, step } = setup({ numKvBlocks: 5 });
  scheduler.add(request('big', 13, { maxTokens: 4 }));
  scheduler.add(request('small', 8, { maxTokens: 2 }));
  const plans: string[][] = [];
  while (scheduler.hasUnfinished) {
    const { output } = await step();
    plans.push(plan(output));
    if (output.scheduled.some((entry) => entry.requestId === 'big')) assert.equal(scheduler.load().numWaiting, 1);
  }
  assert.deepEqual(plans, [['big:13*'], ['big:1*'], ['big:1*'], ['big:1*'], ['small:8*'], ['small:1*']]);
  assert.equal(scheduler.load().numFreeBlocks, 5);
});

test('a sequence that cannot grow preempts the most recently admitted one, which recomputes later', async () => {
  // 4 blocks of 4 tokens hold a and b's prompts; a's 9th token needs a third block.
  const { scheduler, runner, step } = setup({ numKvBlocks: 4 });
  scheduler.add(request('a', 7, { maxTokens: 4 }));
  scheduler.add(request('b', 7, { maxTokens: 4 }));
  const tokens = new Map<string, number[]>([['a', []], ['b', []]]);
  const steps: { plan: string[]; preempted: string[] }[] = [];
  while (scheduler.hasUnfinished) {
    const { output, news } = await step();
    steps.push({ plan: plan(output), preempted: output.preemptedRequestIds });
    for (const item of news) tokens.get(item.requestId)!.push(...item.newTokenIds);
  }
  assert.deepEqual(steps, [
    { plan: ['a:7*', 'b:7*'], preempted: [] },
    { plan: ['a:1*', 'b:1*'], preempted: [] },
    { plan: ['a:1*'], preempted: ['b'] },
    { plan: ['a:1*'], preempted: [] },
    // b recomputes its prompt and both output tokens so far, then samples its third.
    { plan: ['b:9*'], preempted: [] },
    { plan: ['b:1*'], preempted: [] },
  ]);
  // The output index carries over the preemption, so the tokens are those of an undisturbed run.
  assert.deepEqual(tokens.get('a'), runner.scriptedTokenIds('a', 4));
  assert.deepEqual(tokens.get('b'), runner.scriptedTokenIds('b', 4));
  assert.equal(scheduler.load().numFreeBlocks, 4);
});

test('no more than maxNumSeqs sequences run at once', async () => {
  const { scheduler, step } = setup({ maxNumSeqs: 2 });
  for (const id of ['a', 'b', 'c']) scheduler.add(request(id, 2, { maxTokens: 2 }));
  assert.deepEqual(plan((await step()).output), ['a:2*', 'b:2*']);
  assert.deepEqual(plan((await step()).output), ['a:1*', 'b:1*']);
  assert.deepEqual(plan((await step()).output), ['c:2*']);
});

test('requests that could never run are refused at add time', () => {
  const { scheduler } = setup({ numKvBlocks: 8, maxModelLen: 40 });
  assert.equal(scheduler.add(request('prompt-too-long', 40))?.code, 'context_length_exceeded');
  assert.equal(scheduler.add(request('output-too-long', 30, { maxTokens: 11 }))?.code, 'context_length_exceeded');
  const tooBig = scheduler.add(request('cache-too-small', 30, { maxTokens: 3 }));
  assert.equal(tooBig?.code, 'kv_cache_too_small');
  assert.match(tooBig!.message, /holds 32 tokens/);
  assert.equal(scheduler.add(request('fits', 30, { maxTokens: 2 })), null);
  assert.equal(scheduler.add(request('fits', 3))?.code, 'invalid_request');
  assert.equal(scheduler.add(request('empty', 0))?.code, 'invalid_request');
  assert.equal(scheduler.add({ requestId: 'oov', promptTokenIds: [5, 1000], sampling: {} })?.code, 'invalid_request');
  assert.equal(scheduler.add(request('hot', 3, { temperature: -1 }))?.code, 'invalid_request');
  assert.equal(scheduler.load().numWaiting, 1);
});

test('without maxTokens a request may fill the context', async () => {
  const { scheduler, step } = setup({ maxModelLen: 12 });
  scheduler.add(request('a', 9));
  const news: RequestOutput[] = [];
  while (scheduler.hasUnfinished) news.push(...(await step()).news);
  assert.equal(news.length, 3);
  assert.equal(news.at(-1)?.finishReason, 'length');
});

async function runToEnd(sampling: SamplingParams, script: TokenScript) {
  const { scheduler, step } = setup({}, script);
  scheduler.add(request('r', 3, sampling));
  const news: RequestOutput[] = [];
  while (scheduler.hasUnfinished) news.push(...(await step()).news);
  return news;
}

test('EOS and stop token ids end a request with finish reason stop, unless ignoreEos', async () => {
  const script: TokenScript = (entry) => [7, 8, EOS, 9, 4, 5][entry.numOutputTokens];

  const eos = await runToEnd({ maxTokens: 6 }, script);
  assert.deepEqual(eos.flatMap((news) => news.newTokenIds), [7, 8, EOS]);
  assert.equal(eos.at(-1)?.finishReason, 'stop');
  assert.equal(eos.at(-1)?.stopTokenId, EOS);
  assert.equal(eos.at(-1)?.numOutputTokens, 3);

  const stopId = await runToEnd({ maxTokens: 6, ignoreEos: true, stopTokenIds: [4] }, script);
  assert.deepEqual(stopId.flatMap((news) => news.newTokenIds), [7, 8, EOS, 9, 4]);
  assert.equal(stopId.at(-1)?.stopTokenId, 4);

  const length = await runToEnd({ maxTokens: 6, ignoreEos: true }, script);
  assert.deepEqual(length.flatMap((news) => news.newTokenIds), [7, 8, EOS, 9, 4, 5]);
  assert.equal(length.at(-1)?.finishReason, 'length');
  assert.equal(length.at(-1)?.stopTokenId, undefined);
});

test('maxNumBatchedTokens below maxNumSeqs is a configuration error', () => {
  assert.throws(() => setup({ maxNumSeqs: 16, maxNumBatchedTokens: 8 }), /maxNumBatchedTokens \(8\) must be >= maxNumSeqs \(16\)/);
});
