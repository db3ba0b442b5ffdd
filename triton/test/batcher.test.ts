// The dynamic batcher's semantics (Triton's core/src/dynamic_batch_scheduler.cc, oracle tests in
// qa/L0_batcher and qa/L0_model_queue), observed through a real, slow script-backend model.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { ClassicError } from '../errors.ts';
import { startSlowRepo, tick, type SlowRepo } from './slow-model.ts';

const isUnavailable = (message: string) => (err: unknown) => err instanceof ClassicError && err.status === 'UNAVAILABLE' && err.message === message;

describe('dynamic batcher', () => {
  let slow: SlowRepo;
  before(async () => {
    slow = await startSlowRepo({
      delayed: 'max_batch_size: 8\ndynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 300000 }',
      preferred: 'max_batch_size: 8\ndynamic_batching { preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 400000 }',
      biggest: 'max_batch_size: 8\ndynamic_batching { preferred_batch_size: [ 2, 6 ] max_queue_delay_microseconds: 0 }',
      undelayed: 'max_batch_size: 8\ndynamic_batching { }',
      priorities: 'max_batch_size: 1\ndynamic_batching { priority_levels: 2 default_priority_level: 2 }',
      timeouts: 'max_batch_size: 4\ndynamic_batching { default_queue_policy { default_timeout_microseconds: 100000 allow_timeout_override: true } }',
      delayed_policy: 'max_batch_size: 1\ndynamic_batching { default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 250000 } priority_levels: 1 default_priority_level: 1 }',
      bounded: 'max_batch_size: 1\ndynamic_batching { default_queue_policy { max_queue_size: 2 } }',
      shapes: 'max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 0 }',
      ragged: 'max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 0 }',
      concurrent: 'max_batch_size: 8\ninstance_group [ { count: 2 } ]',
      ordered: 'max_batch_size: 1\ninstance_group [ { count: 2 } ]\ndynamic_batching { preserve_ordering: true }',
      unordered: 'max_batch_size: 1\ninstance_group [ { count: 2 } ]\ndynamic_batching { }',
    });
  });
  after(() => slow.close());

  test('the queue delay is honoured: a batch below the preferred size waits for it, then goes', async () => {
    const sentMs = performance.now();
    const results = await Promise.all([slow.infer('delayed'), slow.infer('delayed')]);
    assert.deepEqual(results.map((r) => r.batchRows), [2, 2]);
    assert.ok(results[0].startMs - sentMs >= 290, `started after ${results[0].startMs - sentMs} ms`);
  });

  test('a preferred size closes the batch before the delay; the rest waits for the delay', async () => {
    const sentMs = performance.now();
    // Two rows: a preferred size, so it runs at once and keeps the instance busy.
    const busy = slow.infer('preferred', { delayMs: 150, rows: 2 });
    await tick();
    const queued = Array.from({ length: 5 }, () => slow.infer('preferred'));
    const results = await Promise.all([busy, ...queued]);
    // preferred [2, 4]: the scan stops at 4, the largest; the 1 left has no preferred size to reach.
    assert.deepEqual(results.map((r) => r.batchRows), [2, 4, 4, 4, 4, 1]);
    assert.ok(results[1].startMs - sentMs < 390, 'the preferred batch of 4 did not wait for the queue delay');
    assert.ok(results[5].startMs - sentMs >= 390, `the last one waited ${results[5].startMs - sentMs} ms`);
  });

  test('with the instance busy, the queue is cut at the largest preferred size reached', async () => {
    const busy = slow.infer('biggest', { delayMs: 200 });
    await tick();
    const queued = Array.from({ length: 7 }, () => slow.infer('biggest'));
    const results = await Promise.all([busy, ...queued]);
    // test_multi_batch_use_biggest_preferred: 7 queued, preferred [2, 6] -> 6, then the 1 left.
    assert.deepEqual(results.map((r) => r.batchRows), [1, 6, 6, 6, 6, 6, 6, 1]);
  });

  test('without a queue delay, whatever is queued goes as soon as an instance is free', async () => {
    const busy = slow.infer('undelayed', { delayMs: 150 });
    await tick();
    const queued = Array.from({ length: 3 }, () => slow.infer('undelayed'));
    const results = await Promise.all([busy, ...queued]);
    assert.deepEqual(results.map((r) => r.batchRows), [1, 3, 3, 3]);
  });

  test('a request larger than the room left starts the next batch (never above max_batch_size)', async () => {
    const busy = slow.infer('undelayed', { delayMs: 150 });
    await tick();
    const queued = [slow.infer('undelayed', { rows: 5 }), slow.infer('undelayed', { rows: 5 })];
    const results = await Promise.all([busy, ...queued]);
    assert.deepEqual(results.map((r) => r.batchRows), [1, 5, 5]);
    assert.ok(results[2].startMs >= results[1].endMs);
  });

  test('priorities: level 1 runs before the default level 2, FIFO within a level', async () => {
    const order: string[] = [];
    const run = (name: string, priority: number, delayMs = 0) => slow.infer('priorities', { priority, delayMs }).then(() => order.push(name));
    const busy = run('busy', 0, 150);
    await tick();
    await Promise.all([busy, run('low-a', 2), run('low-b', 0), run('high-a', 1), run('high-b', 1)]);
    assert.deepEqual(order, ['busy', 'high-a', 'high-b', 'low-a', 'low-b']);
  });

  test('an out-of-range priority is refused', async () => {
    await assert.rejects(slow.infer('priorities', { priority: 3 }), (err: unknown) => err instanceof ClassicError && err.status === 'INVALID_ARG');
  });

  test('a request that waits past its queue timeout is rejected with UNAVAILABLE', async () => {
    const busy = slow.infer('timeouts', { delayMs: 400 });
    await tick();
    const rejectedAtMs = slow.infer('timeouts').then(() => assert.fail('served'), (err) => {
      assert.ok(isUnavailable('Request timeout expired')(err), String(err));
      return performance.now();
    });
    const result = await busy;
    assert.ok((await rejectedAtMs) < result.endMs, 'rejected while still queued, before the instance was free');
  });

  test('a request may lower its timeout (allow_timeout_override) but not raise it', async () => {
    const busy = slow.infer('timeouts', { delayMs: 300 });
    await tick();
    const startMs = performance.now();
    const lowered = slow.infer('timeouts', { timeoutUs: 20_000 }).catch((err) => [err, performance.now() - startMs]);
    const raised = slow.infer('timeouts', { timeoutUs: 10_000_000 }).catch((err) => [err, performance.now() - startMs]);
    const [[loweredErr, loweredMs], [raisedErr, raisedMs]] = await Promise.all([lowered, raised]) as Array<[unknown, number]>;
    await busy;
    assert.ok(isUnavailable('Request timeout expired')(loweredErr));
    assert.ok(isUnavailable('Request timeout expired')(raisedErr));
    assert.ok(loweredMs < raisedMs, `lowered ${loweredMs} ms, raised ${raisedMs} ms`);
  });

  test('timeout_action DELAY: an expired request is still served, after the unexpired ones', async () => {
    const order: string[] = [];
    const busy = slow.infer('delayed_policy', { delayMs: 400 }).then(() => order.push('busy'));
    await tick();
    // early expires at 250 ms, while the instance is busy; late, sent at 200 ms, expires after it is free.
    const early = slow.infer('delayed_policy').then(() => order.push('early'));
    await new Promise((resolve) => setTimeout(resolve, 200));
    const late = slow.infer('delayed_policy').then(() => order.push('late'));
    await Promise.all([busy, early, late]);
    assert.deepEqual(order, ['busy', 'late', 'early']);
  });

  test('max_queue_size: the next request is answered UNAVAILABLE at once; the queued ones are served', async () => {
    const busy = slow.infer('bounded', { delayMs: 150 });
    await tick();
    const queued = [slow.infer('bounded'), slow.infer('bounded')];
    await assert.rejects(slow.infer('bounded'), isUnavailable('Exceeds maximum queue size'));
    await Promise.all([busy, ...queued]);
  });

  test('a shape mismatch starts a new batch; requests of equal shapes join', async () => {
    const busy = slow.infer('shapes', { delayMs: 150 });
    await tick();
    const queued = [slow.infer('shapes', { width: 3 }), slow.infer('shapes', { width: 3 }), slow.infer('shapes', { width: 5 }), slow.infer('shapes', { width: 5 })];
    const results = await Promise.all([busy, ...queued]);
    assert.deepEqual(results.map((r) => r.batchRows), [1, 2, 2, 2, 2]);
  });

  test('a ragged input (allow_ragged_batch) does not split the batch', async () => {
    const busy = slow.infer('ragged', { delayMs: 150 });
    await tick();
    const queued = [slow.infer('ragged', { width: 3 }), slow.infer('ragged', { width: 5 }), slow.infer('ragged', { width: 2 })];
    const results = await Promise.all([busy, ...queued]);
    assert.deepEqual(results.map((r) => r.batchRows), [1, 3, 3, 3]);
  });

  test('N instances execute concurrently', async () => {
    const [a, b] = await Promise.all([slow.infer('concurrent', { delayMs: 200 }), slow.infer('concurrent', { delayMs: 200 })]);
    assert.notEqual(a.instance, b.instance);
    assert.ok(a.startMs < b.endMs && b.startMs < a.endMs, 'the two executions overlap');
  });

  test('preserve_ordering: responses come back in request order', async () => {
    const order = (model: string) => {
      const done: string[] = [];
      return Promise.all([
        slow.infer(model, { delayMs: 200 }).then(() => done.push('slow-first')),
        slow.infer(model, { delayMs: 0 }).then(() => done.push('fast-second')),
      ]).then(() => done);
    };
    assert.deepEqual(await order('ordered'), ['slow-first', 'fast-second']);
    assert.deepEqual(await order('unordered'), ['fast-second', 'slow-first']);
  });

  test('statistics count requests, executions and batch sizes', async () => {
    const stats = slow.repo.get('concurrent', null).stats.stats;
    assert.equal(stats.inference_count, 2);
    assert.equal(stats.execution_count, 2);
    assert.equal(stats.inference_stats.success.count, 2);
    assert.deepEqual(stats.batch_stats.map((b) => [b.batch_size, b.compute_infer.count]), [[1, 2]]);
  });
});
