// Scenarios and load shapes as the server sees them: histories, shared prefixes, arrival times.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRng, exponentialGapMs } from '../random.ts';
import { runLoadtest } from '../run.ts';
import { startScriptedServer } from '../scripted-sse-server.ts';

const REPLY = { chunks: [{ delayMs: 0, text: 'reply' }, { delayMs: 2, text: ' text' }], usage: { promptTokens: 5, completionTokens: 2 } };

test('multi-turn conversations resend the whole history, replies included', async () => {
  const server = await startScriptedServer({ tokenizer: true, script: () => REPLY });
  try {
    const results = await runLoadtest({
      url: `${server.baseUrl}/v1`,
      model: 'scripted',
      endpoint: 'chat',
      workload: { kind: 'scenario', scenario: { name: 'multi-turn', numTurns: 3, inputTokens: 6, outputTokens: 2 }, numRequests: 6 },
      load: { kind: 'concurrency', numClientsList: [2] },
    });
    assert.equal(results.num_succeeded, 6);
    const lengths = server.received.map(({ body }) => (body.messages as unknown[]).length).sort();
    assert.deepEqual(lengths, [1, 1, 3, 3, 5, 5]);
    const third = server.received.find(({ body }) => (body.messages as unknown[]).length === 5)!;
    const messages = third.body.messages as { role: string; content: string }[];
    assert.deepEqual(messages.map((message) => message.role), ['user', 'assistant', 'user', 'assistant', 'user']);
    assert.equal(messages[1].content, 'reply text');
    assert.ok(messages.filter((message) => message.role === 'user').every((message) => message.content.split(' ').length === 6));
  } finally {
    await server.close();
  }
});

test('a multi-turn context is its conversation\'s own system message, resent on every turn', async () => {
  const server = await startScriptedServer({ tokenizer: true, script: () => REPLY });
  try {
    const results = await runLoadtest({
      url: `${server.baseUrl}/v1`,
      model: 'scripted',
      endpoint: 'chat',
      workload: { kind: 'scenario', scenario: { name: 'multi-turn', numTurns: 2, inputTokens: 4, outputTokens: 2, contextTokens: 20 }, numRequests: 4 },
      load: { kind: 'concurrency', numClientsList: [2] },
    });
    assert.equal(results.num_succeeded, 4);
    const requests = server.received.map(({ body }) => body.messages as { role: string; content: string }[]);
    assert.ok(requests.every((messages) => messages[0].role === 'system' && messages[0].content.split(' ').length === 20));
    const firstTurns = requests.filter((messages) => messages.length === 2);
    const secondTurns = requests.filter((messages) => messages.length === 4);
    assert.equal(firstTurns.length, 2);
    assert.equal(secondTurns.length, 2);
    assert.notEqual(firstTurns[0][0].content, firstTurns[1][0].content, 'each conversation has its own document');
    for (const second of secondTurns) {
      assert.ok(firstTurns.some((first) => first[0].content === second[0].content && first[1].content === second[1].content), 'a second turn resends its first turn\'s document');
    }
  } finally {
    await server.close();
  }
});

test('a multi-turn think time pauses between a reply and the next turn, not before the first', async () => {
  const server = await startScriptedServer({ script: () => REPLY });
  const thinkTimeMs = 150;
  try {
    const results = await runLoadtest({
      url: server.baseUrl,
      model: 'scripted',
      endpoint: 'completions',
      workload: { kind: 'scenario', scenario: { name: 'multi-turn', numTurns: 3, inputTokens: 2, outputTokens: 2, thinkTimeMs }, numRequests: 6 },
      load: { kind: 'concurrency', numClientsList: [2] },
    });
    assert.equal(results.num_succeeded, 6);
    const bySession = new Map<string, typeof results.requests>();
    for (const request of results.requests) bySession.set(request.session, [...(bySession.get(request.session) ?? []), request]);
    const firstStarts = [...bySession.values()].map((turns) => turns.find((request) => request.turn === 0)!.start_ms);
    assert.ok(Math.max(...firstStarts) - Math.min(...firstStarts) < thinkTimeMs, 'both clients start at once');
    for (const turns of bySession.values()) {
      turns.sort((a, b) => a.turn - b.turn);
      for (let i = 1; i < turns.length; i++) {
        const gapMs = turns[i].start_ms - (turns[i - 1].start_ms + turns[i - 1].e2e_ms);
        assert.ok(gapMs >= thinkTimeMs - 2 && gapMs < thinkTimeMs + 100, `turn ${i} sent ${gapMs} ms after the reply`);
      }
    }
  } finally {
    await server.close();
  }
});

test('warm-up sessions go first, one at a time, and stay out of the figures', async () => {
  const server = await startScriptedServer({ script: () => REPLY });
  try {
    const entries = ['warm 0', 'warm 1', 'measured 0', 'measured 1', 'measured 2'].map((text) => ({ text, output_tokens: 2 }));
    const results = await runLoadtest({
      url: server.baseUrl,
      model: 'scripted',
      endpoint: 'completions',
      workload: { kind: 'entries', name: 'warm.jsonl', entries },
      load: { kind: 'concurrency', numClientsList: [3] },
      warmupSessions: 2,
    });
    assert.equal(results.num_requests, 3);
    assert.deepEqual(server.received.slice(0, 2).map(({ body }) => body.prompt), ['warm 0', 'warm 1']);
    const [warm0, warm1, ...measured] = server.received;
    assert.ok(warm1.receivedMs >= warm0.endMs && measured.every((request) => request.receivedMs >= warm1.endMs), 'one at a time, before the measurement');
    assert.deepEqual(server.received.slice(2).map(({ body }) => body.prompt).sort(), ['measured 0', 'measured 1', 'measured 2']);
    assert.equal(results.requests.length, 3);
  } finally {
    await server.close();
  }
});

test('shared-prefix requests carry one exact-length system prompt per group', async () => {
  const server = await startScriptedServer({ tokenizer: true, script: () => REPLY });
  try {
    await runLoadtest({
      url: server.baseUrl,
      model: 'scripted',
      endpoint: 'chat',
      workload: {
        kind: 'scenario',
        scenario: { name: 'shared-prefix', numGroups: 3, systemPromptTokens: 40, inputTokens: 5, outputTokens: 2 },
        numRequests: 12,
      },
      load: { kind: 'concurrency', numClientsList: [4] },
    });
    const systemPrompts = server.received.map(({ body }) => (body.messages as { content: string }[])[0].content);
    assert.equal(new Set(systemPrompts).size, 3);
    assert.ok(systemPrompts.every((text) => text.split(' ').length === 40));
    const questions = server.received.map(({ body }) => (body.messages as { content: string }[])[1].content);
    assert.equal(new Set(questions).size, 12, 'each question is unique');
  } finally {
    await server.close();
  }
});

test('a trace replays at its timestamps; a Poisson schedule sends on time', async () => {
  const server = await startScriptedServer({ script: () => REPLY });
  try {
    const trace = await runLoadtest({
      url: server.baseUrl,
      model: 'scripted',
      endpoint: 'completions',
      workload: {
        kind: 'entries',
        name: 'trace.jsonl',
        entries: [300, 0, 150].map((timestamp_ms) => ({ timestamp_ms, text: `at ${timestamp_ms}`, output_tokens: 2 })),
      },
      load: { kind: 'trace' },
    });
    // Each request starts at the point's start plus its timestamp, late by its own send lag and
    // never early. Taking the point's start as the earliest start minus its timestamp, one
    // request late on a loaded machine is late alone (from the first start, a late first request
    // moved all the others); a schedule that ignored or misread the timestamps is off on two.
    const starts = trace.requests.map((request) => request.start_ms).sort((a, b) => a - b);
    const timestampsMs = [0, 150, 300];
    const pointStartMs = Math.min(...starts.map((start, i) => start - timestampsMs[i]));
    const lateMs = starts.map((start, i) => start - timestampsMs[i] - pointStartMs);
    assert.ok(lateMs.filter((ms) => ms >= 40).length <= 1, `starts ${starts.map((start) => (start - starts[0]).toFixed(1)).join(', ')} ms after the first`);
    assert.ok(trace.send_lag_ms.count === 3 && trace.send_lag_ms.min >= 0, `send lag ${JSON.stringify(trace.send_lag_ms)}`);
    assert.deepEqual(server.received.map(({ body }) => body.prompt), ['at 0', 'at 150', 'at 300']);

    const poisson = await runLoadtest({
      url: server.baseUrl,
      model: 'scripted',
      endpoint: 'completions',
      workload: { kind: 'scenario', scenario: { name: 'fixed', inputTokens: 3, outputTokens: 2 }, numRequests: 20 },
      load: { kind: 'rate', ratesPerS: [100, 200] },
      seed: 5,
    });
    // Each point's schedule starts with the point, so its requests spread over about the sum of
    // the 19 Poisson gaps drawn from the point's seeded generator (seed + 1000 + index); a
    // schedule that counted from the run's start would fire a later point's requests at once.
    poisson.load_points.forEach((point, index) => {
      const rng = createRng(5 + 1000 + index);
      let lastArrivalMs = 0;
      for (let i = 0; i < 19; i++) lastArrivalMs += exponentialGapMs(rng, [100, 200][index]);
      const pointRequests = poisson.requests.filter((request) => request.load_point === index);
      const spanMs = Math.max(...pointRequests.map((r) => r.start_ms)) - Math.min(...pointRequests.map((r) => r.start_ms));
      assert.ok(spanMs >= lastArrivalMs / 2, `point ${index}: requests span ${spanMs} ms, schedule ${lastArrivalMs} ms`);
    });
    assert.equal(poisson.load_points.length, 2);
    assert.deepEqual(poisson.load_points.map((point) => point.offered_load), [
      { kind: 'rate', requests_per_s: 100 },
      { kind: 'rate', requests_per_s: 200 },
    ]);
    assert.equal(poisson.num_requests, 40);
    assert.equal(poisson.offered_load.kind, 'sweep');
    for (const point of poisson.load_points) assert.equal(point.send_lag_ms.count, 20);
  } finally {
    await server.close();
  }
});
