// Prefix caching, priorities, deadlines and the preemption thrash guard, with the fake runner
// checking every block table against what the steps wrote.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { GenerateRequest, RequestOutput } from '../types.ts';
import { plan, request, setup } from './scheduler-harness.ts';

function prompt(requestId: string, tokenIds: number[], extra: Partial<GenerateRequest> = {}): GenerateRequest {
  return { requestId, promptTokenIds: tokenIds, sampling: { maxTokens: 2 }, ...extra };
}

test('a request whose prompt shares full blocks with an earlier one starts after them and reports them cached', async () => {
  const { scheduler, runner, step } = setup({ enablePrefixCaching: true });
  const shared = [1, 2, 3, 4, 5, 6, 7, 8];
  scheduler.add(prompt('first', [...shared, 9, 10]));
  assert.deepEqual(plan((await step()).output), ['first:10*']);
  scheduler.add(prompt('second', [...shared, 11]));
  const { output, news } = await step();
  assert.deepEqual(plan(output), ['first:1*', 'second:1*']);
  // What the runner saw (the scheduler's own tables have changed since: first finished).
  const [first, second] = runner.steps.at(-1)!.scheduled;
  assert.equal(second.startPosition, 8);
  assert.deepEqual(second.blockIds.slice(0, 2), first.blockIds.slice(0, 2));
  assert.equal(news.find((item) => item.requestId === 'second')?.numCachedTokens, 8);
  assert.equal(news.find((item) => item.requestId === 'first')?.numCachedTokens, 0);
});

test('requests admitted in one step share the blocks the first of them fills in that step', async () => {
  const { scheduler, runner, step } = setup({ enablePrefixCaching: true });
  const tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9];
  scheduler.add(prompt('a', tokens));
  scheduler.add(prompt('b', tokens));
  assert.deepEqual(plan((await step()).output), ['a:9*', 'b:1*']);
  const [a, b] = runner.steps.at(-1)!.scheduled;
  assert.deepEqual(b.blockIds.slice(0, 2), a.blockIds.slice(0, 2));
});

test('with caching off, or a different salt, nothing is shared', async () => {
  for (const [enablePrefixCaching, saltB] of [[false, undefined], [true, 'tenant-b']] as const) {
    const { scheduler, step } = setup({ enablePrefixCaching });
    scheduler.add(prompt('a', [1, 2, 3, 4, 5], { cacheSalt: 'tenant-a' }));
    await step();
    scheduler.add(prompt('b', [1, 2, 3, 4, 5], { cacheSalt: saltB }));
    const { output } = await step();
    assert.equal(output.scheduled.find((entry) => entry.requestId === 'b')?.startPosition, 0);
  }
});

test('a preempted request readmits from its own cached blocks, with blocks for all it must recompute', async () => {
  // 6 blocks of 4: a and b fill 4 each at 13 tokens; a needs a fourth block at its 13th.
  const { scheduler, runner, step } = setup({ enablePrefixCaching: true, numKvBlocks: 6 });
  scheduler.add(request('a', 11, { maxTokens: 6 }));
  scheduler.add({ requestId: 'b', promptTokenIds: Array.from({ length: 11 }, (_, i) => 500 + i), sampling: { maxTokens: 6 } });
  const steps: { plan: string[]; preempted: string[]; starts: number[] }[] = [];
  const tokens = new Map<string, number[]>([['a', []], ['b', []]]);
  while (scheduler.hasUnfinished) {
    const { output, news } = await step();
    steps.push({ plan: plan(output), preempted: output.preemptedRequestIds, starts: output.scheduled.map((entry) => entry.startPosition) });
    for (const item of news) tokens.get(item.requestId)!.push(...item.newTokenIds);
  }
  const preemption = steps.findIndex((entry) => entry.preempted.includes('b'));
  assert.ok(preemption > 0, 'b is preempted once a needs its block');
  const readmission = steps.findIndex((entry, i) => i > preemption && entry.plan.some((item) => item.startsWith('b:')));
  // Its full blocks stayed cached: it recomputes only what followed them.
  const bStart = steps[readmission].starts[steps[readmission].plan.findIndex((item) => item.startsWith('b:'))];
  assert.ok(bStart >= 8, `b restarts after its cached blocks, at ${bStart}`);
  assert.deepEqual(tokens.get('a'), runner.scriptedTokenIds('a', 6));
  assert.deepEqual(tokens.get('b'), runner.scriptedTokenIds('b', 6));
  assert.equal(scheduler.load().numFreeBlocks, 6);
});

test('under the priority policy the lower value is admitted first and preempted last', async () => {
  const { scheduler, step } = setup({ policy: 'priority', maxNumSeqs: 2 });
  scheduler.add({ ...request('low', 2, { maxTokens: 3 }), priority: 5 });
  scheduler.add({ ...request('high', 2, { maxTokens: 3 }), priority: -1 });
  scheduler.add({ ...request('mid', 2, { maxTokens: 3 }), priority: 0 });
  assert.deepEqual(plan((await step()).output), ['high:2*', 'mid:2*']);
  // Tight blocks: the low-priority latecomer is the one preempted.
  const tight = setup({ policy: 'priority', numKvBlocks: 4 });
  tight.scheduler.add({ ...request('important', 7, { maxTokens: 4 }), priority: 0 });
  tight.scheduler.add({ ...request('background', 7, { maxTokens: 4 }), priority: 9 });
  const preempted: string[] = [];
  while (tight.scheduler.hasUnfinished) preempted.push(...(await tight.step()).output.preemptedRequestIds);
  assert.deepEqual(preempted, ['background']);
});

test('under the priority policy a preempted high-priority request readmits before a waiting low one', async () => {
  const { scheduler, step } = setup({ policy: 'priority', numKvBlocks: 4, maxNumSeqs: 2 });
  scheduler.add({ ...request('b', 7, { maxTokens: 4 }), priority: 1 });
  scheduler.add({ ...request('a', 7, { maxTokens: 4 }), priority: 0 });
  await step();
  scheduler.add({ ...request('late', 3, { maxTokens: 1 }), priority: 5 });
  const admitted: string[] = [];
  while (scheduler.hasUnfinished) {
    for (const entry of (await step()).output.scheduled) if (entry.startPosition === 0) admitted.push(entry.requestId);
  }
  assert.deepEqual(admitted, ['b', 'late']);
});

test('under fcfs a request that names a priority is refused, as vLLM refuses it; priority 0 is the default', () => {
  const { scheduler } = setup({ policy: 'fcfs' });
  const refusal = scheduler.add({ ...request('urgent', 3), priority: -1 });
  assert.equal(refusal?.code, 'invalid_request');
  assert.match(refusal!.message, /scheduling_policy: priority/);
  assert.equal(scheduler.add({ ...request('plain', 3), priority: 0 }), null);
  assert.equal(setup({ policy: 'priority' }).scheduler.add({ ...request('urgent', 3), priority: -1 }), null);
});

test('deadlines end a request that waited too long to start, or ran too long, with a stated reason', async () => {
  let nowMs = 0;
  const { scheduler, step } = setup({ maxNumSeqs: 1, now: () => nowMs });
  scheduler.add({ ...request('running', 3, { maxTokens: 10 }), timeoutMs: 50 });
  scheduler.add({ ...request('queued', 3, { maxTokens: 2 }), queueTimeoutMs: 20 });
  scheduler.add({ ...request('patient', 3, { maxTokens: 1 }), queueTimeoutMs: 1000 });
  await step();
  nowMs = 25;
  const queueExpired = scheduler.expire();
  assert.deepEqual(queueExpired.map((item) => [item.requestId, item.finishReason, item.error?.code]), [['queued', 'error', 'queue_timeout']]);
  assert.match(queueExpired[0].error!.message, /waited 20 ms/);
  await step();
  nowMs = 60;
  const totalExpired = scheduler.expire();
  assert.deepEqual(totalExpired.map((item) => [item.requestId, item.error?.code, item.numOutputTokens]), [['running', 'request_timeout', 2]]);
  // Its blocks are back, and the patient request runs.
  const news: RequestOutput[] = [];
  while (scheduler.hasUnfinished) news.push(...(await step()).news);
  assert.deepEqual(news.map((item) => [item.requestId, item.finishReason]), [['patient', 'length']]);
  assert.equal(scheduler.load().numFreeBlocks, 64);
  assert.deepEqual(scheduler.expire(), []);
});

test('deadlines must be positive', () => {
  const { scheduler } = setup();
  assert.equal(scheduler.add({ ...request('a', 3), queueTimeoutMs: 0 })?.code, 'invalid_request');
  assert.equal(scheduler.add({ ...request('b', 3), timeoutMs: Number.NaN })?.code, 'invalid_request');
  assert.equal(scheduler.add({ ...request('c', 3), priority: 1.5 })?.code, 'invalid_request');
});

test('a readmitted sequence is not preempted again before it has caught up (vllm #25538)', async () => {
  // A budget smaller than the recompute: b catches up over several steps while a keeps growing.
  const { scheduler, runner, step } = setup({ numKvBlocks: 7, maxNumBatchedTokens: 8, maxNumSeqs: 2 });
  scheduler.add(request('a', 8, { maxTokens: 12 }));
  scheduler.add({ requestId: 'b', promptTokenIds: Array.from({ length: 8 }, (_, i) => 300 + i), sampling: { maxTokens: 12 } });
  let numPreemptions = 0;
  const outputs = new Map<string, number[]>([['a', []], ['b', []]]);
  for (let i = 0; i < 200 && scheduler.hasUnfinished; i++) {
    const { output, news } = await step();
    numPreemptions += output.preemptedRequestIds.length;
    for (const item of news) outputs.get(item.requestId)!.push(...item.newTokenIds);
  }
  assert.equal(scheduler.hasUnfinished, false, 'both finish');
  assert.ok(numPreemptions <= 2, `${numPreemptions} preemptions: no thrash`);
  for (const [requestId, tokens] of outputs) assert.deepEqual(tokens, runner.scriptedTokenIds(requestId, 12));
});

test('waiting prefill tokens are counted for the router', () => {
  const { scheduler } = setup({ maxNumSeqs: 1 });
  scheduler.add(request('a', 5));
  scheduler.add(request('b', 7));
  assert.equal(scheduler.load().numQueuedPrefillTokens, 12);
  scheduler.schedule();
  assert.equal(scheduler.load().numQueuedPrefillTokens, 7);
  scheduler.abort('b');
  assert.equal(scheduler.load().numQueuedPrefillTokens, 0);
});

test('a waiting request counts only the prefill tokens the prefix cache lacks', async () => {
  const { scheduler, step } = setup({ enablePrefixCaching: true });
  const shared = [1, 2, 3, 4, 5, 6, 7, 8];
  scheduler.add(prompt('first', [...shared, 9, 10]));
  assert.equal(scheduler.load().numQueuedPrefillTokens, 10);
  await step();
  // Two full blocks of 4 cached: 3 of its 11 tokens are left to compute.
  scheduler.add(prompt('second', [...shared, 11, 12, 13]));
  assert.equal(scheduler.load().numQueuedPrefillTokens, 3);
  scheduler.abort('second');
  assert.equal(scheduler.load().numQueuedPrefillTokens, 0);
  scheduler.add(prompt('third', [...shared, 14]));
  await step();
  assert.equal(scheduler.load().numQueuedPrefillTokens, 0);
});

test('min_tokens keeps EOS and stop tokens from ending the output early and bans them for the runner', async () => {
  const script = (entry: { numOutputTokens: number }) => [2, 7, 2, 9][entry.numOutputTokens];
  const { scheduler, step } = setup({}, script);
  scheduler.add(request('r', 3, { maxTokens: 4, minTokens: 2, stopTokenIds: [9] }));
  const banned: (readonly number[])[] = [];
  const news: RequestOutput[] = [];
  while (scheduler.hasUnfinished) {
    const result = await step();
    banned.push(result.output.scheduled[0].bannedTokenIds);
    news.push(...result.news);
  }
  assert.deepEqual(banned, [[2, 9], [2, 9], []]);
  assert.deepEqual(news.flatMap((item) => item.newTokenIds), [2, 7, 2]);
  assert.equal(news.at(-1)?.finishReason, 'stop');
});

test('fairness: equal requests start in arrival order, and a long prompt at the head is not overtaken for blocks', async () => {
  for (const policy of ['fcfs', 'priority'] as const) {
    const { scheduler, step } = setup({ policy, maxNumSeqs: 2 });
    for (const id of ['r0', 'r1', 'r2', 'r3', 'r4']) scheduler.add(request(id, 3, { maxTokens: 2 }));
    const started: string[] = [];
    while (scheduler.hasUnfinished) {
      for (const entry of (await step()).output.scheduled) if (entry.startPosition === 0) started.push(entry.requestId);
    }
    assert.deepEqual(started, ['r0', 'r1', 'r2', 'r3', 'r4'], policy);
  }
  // 6 blocks of 4: 'long' (20 tokens, 5 blocks) waits for 'first' to finish; the short ones
  // behind it would fit at once but wait their turn instead of starving it.
  const { scheduler, step } = setup({ numKvBlocks: 6 });
  scheduler.add(request('first', 6, { maxTokens: 3 }));
  await step();
  scheduler.add(request('long', 20, { maxTokens: 1 }));
  scheduler.add(request('short-1', 2, { maxTokens: 1 }));
  scheduler.add(request('short-2', 2, { maxTokens: 1 }));
  const started: string[] = [];
  while (scheduler.hasUnfinished) {
    for (const entry of (await step()).output.scheduled) if (entry.startPosition === 0) started.push(entry.requestId);
  }
  assert.deepEqual(started, ['long', 'short-1', 'short-2']);
});
