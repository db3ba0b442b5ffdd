// How prompts share a step's budget: decodes first, then prompts in policy order, at most
// maxNumPartialPrefills of them and maxLongPartialPrefills long ones (more than
// longPrefillTokenThreshold tokens to compute). Step plans only, no clocks: a prompt's first
// token comes at the end of the step that computes its last chunk, so the plans say who waits
// for whom.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Scheduler } from '../scheduler.ts';
import type { RequestOutput } from '../types.ts';
import type { SchedulerConfig } from '../scheduler.ts';
import { plan, request, setup } from './scheduler-harness.ts';

/** The interactivity mode's shape: one long prompt a step, short ones beside it. */
const oneLong = (longPrefillTokenThreshold: number): Partial<SchedulerConfig> => ({ maxNumPartialPrefills: 64, maxLongPartialPrefills: 1, longPrefillTokenThreshold });

/** The step (from 1) at which each request got its first token. */
async function firstTokenSteps(step: () => Promise<{ news: RequestOutput[] }>, hasUnfinished: () => boolean): Promise<Map<string, number>> {
  const steps = new Map<string, number>();
  for (let index = 1; hasUnfinished(); index++) {
    for (const news of (await step()).news) if (news.numOutputTokens === 1) steps.set(news.requestId, index);
  }
  return steps;
}

test('one prompt at a time: a second prompt waits for the next step instead of delaying the first', async () => {
  const plans = new Map<number, string[][]>();
  for (const maxLongPartialPrefills of [1, 2]) {
    const { scheduler, runner, step } = setup({ maxNumBatchedTokens: 64, ...oneLong(8), maxLongPartialPrefills });
    scheduler.add(request('a', 20, { maxTokens: 3 }));
    scheduler.add(request('b', 20, { maxTokens: 3 }));
    const tokens = new Map<string, number[]>([['a', []], ['b', []]]);
    const steps: string[][] = [];
    while (scheduler.hasUnfinished) {
      const { output, news } = await step();
      steps.push(plan(output));
      for (const item of news) tokens.get(item.requestId)!.push(...item.newTokenIds);
    }
    plans.set(maxLongPartialPrefills, steps);
    // Each request's tokens are its own, whatever the plan.
    for (const [requestId, ids] of tokens) assert.deepEqual(ids, runner.scriptedTokenIds(requestId, 3));
    assert.equal(scheduler.load().numFreeBlocks, 64);
  }
  // One at a time, a's first token follows a step of 20 prompt tokens, not 40, and b's 41, not 40.
  assert.deepEqual(plans.get(1), [['a:20*'], ['a:1*', 'b:20*'], ['a:1*', 'b:1*'], ['b:1*']]);
  assert.deepEqual(plans.get(2), [['a:20*', 'b:20*'], ['a:1*', 'b:1*'], ['a:1*', 'b:1*']]);
});

test('a long prompt longer than the budget is chunked alone; a short one joins its last chunk, unless every prompt counts as long', async () => {
  const plans = new Map<number, string[][]>();
  for (const threshold of [3, 0]) {
    const { scheduler, step } = setup({ maxNumBatchedTokens: 8, ...oneLong(threshold) });
    scheduler.add(request('long', 20, { maxTokens: 2 }));
    scheduler.add(request('short', 3, { maxTokens: 2 }));
    const steps: string[][] = [];
    while (scheduler.hasUnfinished) steps.push(plan((await step()).output));
    plans.set(threshold, steps);
  }
  assert.deepEqual(plans.get(3), [['long:8'], ['long:8'], ['long:4*', 'short:3*'], ['long:1*', 'short:1*']]);
  assert.deepEqual(plans.get(0), [['long:8'], ['long:8'], ['long:4*'], ['long:1*', 'short:3*'], ['short:1*']]);
});

test('short prompts share a step with a long one; a second long one holds the queue behind it (first come, first served)', async () => {
  const { scheduler, step } = setup({ maxNumBatchedTokens: 64, ...oneLong(4) });
  for (const [id, length] of [['long-1', 20], ['short-1', 4], ['short-2', 3], ['long-2', 20], ['short-3', 2]] as const) {
    scheduler.add(request(id, length, { maxTokens: 2 }));
  }
  assert.deepEqual(plan((await step()).output), ['long-1:20*', 'short-1:4*', 'short-2:3*']);
  assert.deepEqual(plan((await step()).output), ['long-1:1*', 'short-1:1*', 'short-2:1*', 'long-2:20*', 'short-3:2*']);
});

test('with maxNumPartialPrefills N, up to N prompts share a step, the rest wait their turn', async () => {
  const { scheduler, step } = setup({ maxNumBatchedTokens: 64, maxNumPartialPrefills: 2, maxLongPartialPrefills: 2, longPrefillTokenThreshold: 0 });
  for (const id of ['a', 'b', 'c']) scheduler.add(request(id, 10, { maxTokens: 2 }));
  assert.deepEqual(plan((await step()).output), ['a:10*', 'b:10*']);
  assert.deepEqual(plan((await step()).output), ['a:1*', 'b:1*', 'c:10*']);
});

test('decodes go before prompts still being computed, whatever their admission order', async () => {
  // Under the priority policy a later, more urgent request takes the prompt slot from a prompt
  // half computed; once it decodes it sits behind that prompt in the running list, and still
  // gets its token every step rather than what the prompt leaves of the budget.
  const { scheduler, step } = setup({ policy: 'priority', maxNumBatchedTokens: 8, ...oneLong(0) });
  scheduler.add({ ...request('low', 30, { maxTokens: 2 }), priority: 5 });
  assert.deepEqual(plan((await step()).output), ['low:8']);
  scheduler.add({ ...request('high', 6, { maxTokens: 3 }), priority: 0 });
  const plans: string[][] = [];
  while (scheduler.hasUnfinished) plans.push(plan((await step()).output));
  assert.deepEqual(plans, [
    ['high:6*'],
    ['high:1*', 'low:7'],
    ['high:1*', 'low:7'],
    ['low:8*'],
    ['low:1*'],
  ]);
});

test('under the priority policy the most urgent prompt is computed first, the others one at a time after it', async () => {
  const { scheduler, step } = setup({ policy: 'priority', maxNumBatchedTokens: 64, ...oneLong(0) });
  scheduler.add({ ...request('background', 12, { maxTokens: 1 }), priority: 9 });
  scheduler.add({ ...request('normal', 12, { maxTokens: 1 }), priority: 0 });
  scheduler.add({ ...request('urgent', 12, { maxTokens: 1 }), priority: -3 });
  const first = await firstTokenSteps(step, () => scheduler.hasUnfinished);
  assert.deepEqual([...first], [['urgent', 1], ['normal', 2], ['background', 3]]);
});

test('an urgent prompt whose blocks are not free lets the prompt in progress go on', async () => {
  // 3 blocks of 4 tokens: low holds 2 after its first chunk; high's first chunk needs 2, 1 is free.
  const { scheduler, step } = setup({ policy: 'priority', numKvBlocks: 3, maxNumBatchedTokens: 6, ...oneLong(0), maxNumSeqs: 4 });
  scheduler.add({ ...request('low', 10, { maxTokens: 1 }), priority: 5 });
  assert.deepEqual(plan((await step()).output), ['low:6']);
  scheduler.add({ ...request('high', 8, { maxTokens: 1 }), priority: 0 });
  const plans: string[][] = [];
  while (scheduler.hasUnfinished) plans.push(plan((await step()).output));
  assert.deepEqual(plans, [['low:4*'], ['high:6'], ['high:2*']]);
  assert.equal(scheduler.load().numFreeBlocks, 3);
});

test('the prefill limits are checked: positive counts, no more long prompts than prompts, a threshold of 0 or more', () => {
  const limits = { maxNumPartialPrefills: 4, maxLongPartialPrefills: 1, longPrefillTokenThreshold: 8 };
  for (const bad of [
    { maxNumPartialPrefills: 0 }, { maxNumPartialPrefills: 1.5 }, { maxLongPartialPrefills: 0 }, { maxLongPartialPrefills: 5 },
    { longPrefillTokenThreshold: -1 }, { longPrefillTokenThreshold: Number.NaN },
  ]) {
    assert.throws(() => setup({ ...limits, ...bad }), RangeError, JSON.stringify(bad));
  }
  assert.ok(setup(limits).scheduler instanceof Scheduler);
});

test('beside decodes prompts go in chunks of maxPrefillTokensBesideDecodes while two or more contend; a lone one goes whole', async () => {
  const { scheduler, step } = setup({ maxNumBatchedTokens: 64, ...oneLong(4), maxPrefillTokensBesideDecodes: 8 });
  scheduler.add(request('a', 20, { maxTokens: 7 }));
  assert.deepEqual(plan((await step()).output), ['a:20*']);
  // b alone: no other prompt waits for the step, so it takes its whole prompt beside a's decode.
  scheduler.add(request('b', 20, { maxTokens: 5 }));
  assert.deepEqual(plan((await step()).output), ['a:1*', 'b:20*']);
  // c and d together: 8 prompt tokens a step while both have some to compute, then d alone goes whole.
  scheduler.add(request('c', 20, { maxTokens: 1 }));
  scheduler.add(request('d', 20, { maxTokens: 1 }));
  assert.deepEqual(plan((await step()).output), ['a:1*', 'b:1*', 'c:8']);
  assert.deepEqual(plan((await step()).output), ['a:1*', 'b:1*', 'c:8']);
  assert.deepEqual(plan((await step()).output), ['a:1*', 'b:1*', 'c:4*', 'd:4']);
  assert.deepEqual(plan((await step()).output), ['a:1*', 'b:1*', 'd:16*']);
  // A burst of five behind a decode: chunks while a decodes, then whole with no decodes beside.
  for (const id of ['e', 'f', 'g', 'h', 'i']) scheduler.add(request(id, 20, { maxTokens: 1 }));
  assert.deepEqual(plan((await step()).output), ['a:1*', 'e:8']);
  assert.deepEqual(plan((await step()).output), ['e:12*']);
  assert.deepEqual(plan((await step()).output), ['f:20*']);
});

test('beside many decodes the chunk is prefillTokensPerDecodeRow per decode when that is more than maxPrefillTokensBesideDecodes', async () => {
  const plans = new Map<number, string[][]>();
  for (const numDecodes of [2, 4]) {
    const { scheduler, step } = setup({ maxNumBatchedTokens: 64, ...oneLong(4), maxPrefillTokensBesideDecodes: 8, prefillTokensPerDecodeRow: 3 });
    const decoding = ['a', 'b', 'e', 'f'].slice(0, numDecodes);
    for (const id of decoding) scheduler.add(request(id, 4, { maxTokens: 9 }));
    await step();
    for (const id of ['c', 'd']) scheduler.add(request(id, 30, { maxTokens: 1 }));
    const steps: string[][] = [];
    for (let i = 0; i < 3; i++) steps.push(plan((await step()).output).filter((entry) => !decoding.includes(entry.split(':')[0])));
    plans.set(numDecodes, steps);
  }
  // Two decodes: 3 a decode is 6, under the cap of 8. Four: 12, over it (d, long too, waits for c's end).
  assert.deepEqual(plans.get(2), [['c:8'], ['c:8'], ['c:8']]);
  assert.deepEqual(plans.get(4), [['c:12'], ['c:12'], ['c:6*']]);
  assert.throws(() => setup({ prefillTokensPerDecodeRow: -1 }), /prefillTokensPerDecodeRow must be an integer >= 0/);
});

test('a backlog of more than backlogPromptTokens goes in whole prompts beside the decodes, one long a step, then chunks again', async () => {
  const { scheduler, runner, step } = setup({ maxNumBatchedTokens: 64, ...oneLong(4), maxPrefillTokensBesideDecodes: 8, backlogPromptTokens: 50 });
  scheduler.add(request('a', 20, { maxTokens: 6 }));
  assert.deepEqual(plan((await step()).output), ['a:20*']);
  for (const id of ['b', 'c', 'd']) scheduler.add(request(id, 20, { maxTokens: 2 }));
  // 60 prompt tokens wait (over 50): b whole beside the decode, and c, long too, waits for the next step.
  assert.deepEqual(plan((await step()).output), ['a:1*', 'b:20*']);
  // 40 wait: no longer a backlog, so 8-token chunks while c and d contend, then d whole.
  assert.deepEqual(plan((await step()).output), ['a:1*', 'b:1*', 'c:8']);
  assert.deepEqual(plan((await step()).output), ['a:1*', 'c:8']);
  assert.deepEqual(plan((await step()).output), ['a:1*', 'c:4*', 'd:4']);
  assert.deepEqual(plan((await step()).output), ['a:1*', 'c:1*', 'd:16*']);
  const tokens = new Map<string, number[]>();
  while (scheduler.hasUnfinished) for (const news of (await step()).news) tokens.set(news.requestId, [...(tokens.get(news.requestId) ?? []), ...news.newTokenIds]);
  assert.deepEqual(tokens.get('d'), runner.scriptedTokenIds('d', 2).slice(1));
  assert.throws(() => setup({ backlogPromptTokens: -1 }), /backlogPromptTokens must be an integer >= 0/);
});
