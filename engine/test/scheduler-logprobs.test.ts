// Top logprobs and prompt logprobs through the scheduler: the fake runner scripts them (see
// fake-runner.ts), so each test knows exactly what every output must carry.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { PromptTokenLogprobs, RequestOutput } from '../types.ts';
import { request, setup } from './scheduler-harness.ts';

/** The fake runner's scores of a prompt: the token after position p at -(p + 1) / 8, rank p + 1. */
function scriptedPromptLogprobs(promptTokenIds: readonly number[], numTop: number): PromptTokenLogprobs[] {
  return promptTokenIds.slice(1).map((tokenId, position) => {
    const logprob = -(position + 1) / 8;
    const ranks = Array.from({ length: numTop }, (_, k) => k);
    return { logprob, rank: position + 1, topTokenIds: ranks.map((k) => tokenId + k), topLogprobs: ranks.map((k) => logprob - k) };
  });
}

async function runToEnd(step: () => Promise<{ news: RequestOutput[] }>, isDone: () => boolean) {
  const news: RequestOutput[] = [];
  while (!isDone()) news.push(...(await step()).news);
  return news;
}

test('each sampled token carries the alternatives asked for; a request without top logprobs carries none', async () => {
  const { scheduler, step } = setup();
  scheduler.add(request('top', 3, { maxTokens: 3, numTopLogprobs: 3 }));
  scheduler.add(request('plain', 3, { maxTokens: 3 }));
  const news = await runToEnd(step, () => !scheduler.hasUnfinished);
  const top = news.filter((item) => item.requestId === 'top');
  assert.deepEqual(
    top.map((item) => item.newTopLogprobs),
    [100, 101, 102].map((tokenId) => [{ logprob: -0.5, topTokenIds: [tokenId, tokenId + 1, tokenId + 2], topLogprobs: [-0.5, -1.5, -2.5] }]),
  );
  assert.ok(news.filter((item) => item.requestId === 'plain').every((item) => item.newTopLogprobs === undefined));
});

test('prompt logprobs gather over chunks and come once, with the first output token', async () => {
  const { scheduler, runner, step } = setup({ maxNumBatchedTokens: 8 });
  const prompt = request('scored', 21, { maxTokens: 3, numPromptLogprobs: 2 });
  scheduler.add(prompt);
  const news = await runToEnd(step, () => !scheduler.hasUnfinished);
  assert.deepEqual(
    runner.steps.map((output) => output.scheduled.map((entry) => `${entry.numScheduledTokens}${entry.scoresPrompt ? ' scored' : ''}`)),
    [['8 scored'], ['8 scored'], ['5 scored'], ['1'], ['1']],
  );
  assert.deepEqual(news[0].promptLogprobs, scriptedPromptLogprobs(prompt.promptTokenIds, 2));
  assert.ok(news.slice(1).every((item) => item.promptLogprobs === undefined));

  // A one-token prompt has nothing to score: an empty list, still in the first output.
  scheduler.add(request('single', 1, { maxTokens: 1, numPromptLogprobs: 0 }));
  const [single] = await runToEnd(step, () => !scheduler.hasUnfinished);
  assert.deepEqual(single.promptLogprobs, []);
});

test('a request preempted after its prompt was scored recomputes without scoring it again', async () => {
  // As in the preemption test of scheduler-policy: 6 blocks of 4, b preempted when a grows.
  const { scheduler, runner, step } = setup({ numKvBlocks: 6 });
  const a = request('a', 11, { maxTokens: 6, numPromptLogprobs: 1 });
  const b = { requestId: 'b', promptTokenIds: Array.from({ length: 11 }, (_, i) => 500 + i), sampling: { maxTokens: 6, numPromptLogprobs: 0 } };
  scheduler.add(a);
  scheduler.add(b);
  const news = await runToEnd(step, () => !scheduler.hasUnfinished);
  assert.ok(runner.steps.some((output) => output.preemptedRequestIds.length > 0), 'a request was preempted');
  const scoredChunks = runner.steps.flatMap((output) => output.scheduled).filter((entry) => entry.scoresPrompt);
  assert.deepEqual(scoredChunks.map((entry) => entry.requestId), ['a', 'b']);
  for (const [requestId, promptTokenIds, numTop] of [['a', a.promptTokenIds, 1], ['b', b.promptTokenIds, 0]] as const) {
    const withScores = news.filter((item) => item.requestId === requestId && item.promptLogprobs !== undefined);
    assert.equal(withScores.length, 1, requestId);
    assert.deepEqual(withScores[0].promptLogprobs, scriptedPromptLogprobs(promptTokenIds, numTop));
  }
});

test('a request preempted in the middle of its prompt scores each position once, resuming where it stopped', async () => {
  // 4 blocks of 4 and 4 tokens a step: b's chunked prompt loses its blocks to a's decode.
  const { scheduler, runner, step } = setup({ numKvBlocks: 4, maxNumBatchedTokens: 4, maxNumSeqs: 2 });
  scheduler.add(request('a', 4, { maxTokens: 8 }));
  await step();
  const b = { requestId: 'b', promptTokenIds: Array.from({ length: 12 }, (_, i) => 500 + i), sampling: { maxTokens: 1, numPromptLogprobs: 1 } };
  scheduler.add(b);
  const news = await runToEnd(step, () => !scheduler.hasUnfinished);
  const chunksOfB = runner.steps.flatMap((output) => output.scheduled).filter((entry) => entry.requestId === 'b');
  assert.deepEqual(
    chunksOfB.map((entry) => `${entry.startPosition}+${entry.numScheduledTokens}${entry.scoresPrompt ? ' scored' : ''}`),
    ['0+3 scored', '3+3 scored', '0+4', '4+4 scored', '8+4 scored'],
  );
  const [first] = news.filter((item) => item.requestId === 'b');
  assert.deepEqual(first.promptLogprobs, scriptedPromptLogprobs(b.promptTokenIds, 1));
});
