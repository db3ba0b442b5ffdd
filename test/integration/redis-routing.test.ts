// Routing state shared in a real redis-server: `conduit worker --redis-url` processes register
// there and publish their KV events, two gateway replicas find them and build their indexes from
// the streams. Conversations whose turns alternate between the gateways land on the worker that
// holds their history; a killed worker leaves both gateways' routing within its heartbeat TTL;
// with Redis stopped, both route on what they knew, and rebuild when it returns.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import type { RunningServer } from '../../bin/serve.ts';
import { startRedisServer } from '../redis-server.ts';
import { defaultModelDir, startServer } from './harness.ts';
import { startWorkerProcess, type WorkerProcess } from './worker-process.ts';

const modelName = 'conduit-tiny';
const BLOCK_SIZE = 16;
const HEARTBEAT = { interval_s: 0.2, ttl_s: 1 };

async function metricSamples(server: RunningServer, name: string): Promise<Map<string, number>> {
  const text = await (await fetch(`${server.metricsAddress}/metrics`)).text();
  const samples = new Map<string, number>();
  for (const line of text.split('\n')) {
    const match = new RegExp(`^${name}(?:\\{(?:model_name="${modelName}")?,?(?:worker="([^"]+)")?\\})? (\\S+)$`).exec(line);
    if (match) samples.set(match[1] ?? '', Number(match[2]));
  }
  return samples;
}

async function numWorkersOf(server: RunningServer): Promise<number> {
  const health = (await (await fetch(`${server.httpAddress}/health`)).json()) as { models: { numWorkers: number }[] };
  return health.models[0].numWorkers;
}

async function until(condition: () => Promise<boolean>, what: string, timeoutMs = 15_000): Promise<void> {
  const deadlineMs = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadlineMs) throw new Error(`timed out waiting until ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** Both gateways index every worker's cache exactly (their streams are read to the end). */
async function indexesAgree(gateways: RunningServer[]): Promise<boolean> {
  const views = await Promise.all(gateways.map((gateway) => metricSamples(gateway, 'conduit_router_index_blocks')));
  const drifts = await Promise.all(gateways.map((gateway) => metricSamples(gateway, 'conduit_router_index_drift_blocks')));
  return drifts.every((drift) => drift.size > 0 && [...drift.values()].every((n) => n === 0))
    && JSON.stringify([...views[0]].sort()) === JSON.stringify([...views[1]].sort());
}

test('two gateways share workers and KV events in Redis; a killed worker and a stopped Redis', { timeout: 240_000 }, async (t) => {
  const redis = await startRedisServer();
  const workers: WorkerProcess[] = [];
  const gateways: RunningServer[] = [];
  t.after(async () => {
    await Promise.all(gateways.map((gateway) => gateway.close()));
    await Promise.all(workers.map((worker) => worker.stop('SIGKILL')));
    await redis.close();
  });
  const workerArgs = [
    '--kv-cache-blocks', '256', '--redis-url', redis.url,
    '--heartbeat-interval-s', String(HEARTBEAT.interval_s), '--heartbeat-ttl-s', String(HEARTBEAT.ttl_s),
  ];
  workers.push(...(await Promise.all(Array.from({ length: 3 }, () => startWorkerProcess(workerArgs)))));
  const router = { redis_url: redis.url, heartbeat_interval_s: HEARTBEAT.interval_s, heartbeat_ttl_s: HEARTBEAT.ttl_s };
  for (let i = 0; i < 2; i++) gateways.push(await startServer([{ path: defaultModelDir, num_workers: 0 }], router));
  for (const gateway of gateways) await until(async () => (await numWorkersOf(gateway)) === 3, 'each gateway found the 3 workers');
  const clients = gateways.map((gateway) => new OpenAI({ baseURL: `${gateway.httpAddress}/v1`, apiKey: 'unused', maxRetries: 0 }));

  const numConversations = 4;
  const messages: OpenAI.Chat.ChatCompletionMessageParam[][] = Array.from({ length: numConversations }, () => []);
  const turns: { promptTokens: number; cachedTokens: number }[][] = Array.from({ length: numConversations }, () => []);
  // Turn n of conversation i goes to gateway (i + n) % 2: each turn follows one the other gateway routed.
  const takeTurn = async (index: number) => {
    const turn = turns[index].length;
    messages[index].push({ role: 'user', content: `Conversation ${index} turn ${turn}: ${'tell me about the river and the old mill '.repeat(2 + index)}` });
    const completion = await clients[(index + turn) % 2].chat.completions.create({
      model: modelName, messages: messages[index], max_tokens: 12, temperature: 0, ignore_eos: true,
    } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
    messages[index].push({ role: 'assistant', content: completion.choices[0].message.content ?? '' });
    turns[index].push({ promptTokens: completion.usage!.prompt_tokens, cachedTokens: completion.usage!.prompt_tokens_details!.cached_tokens! });
  };
  /** Each later turn holds at least every full block of the turn before it in cache. */
  const assertHistoryFound = (fromTurn: number) => {
    for (const [index, conversation] of turns.entries()) {
      for (let turn = Math.max(1, fromTurn); turn < conversation.length; turn++) {
        const previousBlocks = Math.floor(conversation[turn - 1].promptTokens / BLOCK_SIZE);
        assert.ok(
          conversation[turn].cachedTokens >= previousBlocks * BLOCK_SIZE,
          `conversation ${index} turn ${turn}: ${conversation[turn].cachedTokens} cached of ${conversation[turn].promptTokens} after a ${conversation[turn - 1].promptTokens}-token turn`,
        );
      }
    }
  };
  const round = async () => {
    // The other gateway reads the last turn's blocks from Redis before the next turn is routed.
    await until(() => indexesAgree(gateways), 'both gateways index the workers\' caches alike');
    for (let index = 0; index < numConversations; index++) await takeTurn(index);
  };
  for (let n = 0; n < 3; n++) await round();
  assertHistoryFound(1);

  // A worker that dies leaves both gateways' routing within its TTL; its conversations go on elsewhere.
  const requestsBefore = await metricSamples(gateways[0], 'conduit_router_requests_total');
  const doomed = workers.find((worker) => (requestsBefore.get(worker.address) ?? 0) > 0)!;
  await doomed.stop('SIGKILL');
  const killedAtMs = Date.now();
  for (const gateway of gateways) await until(async () => (await numWorkersOf(gateway)) === 2, 'the dead worker left routing');
  assert.ok(Date.now() - killedAtMs < 5_000, `left after ${Date.now() - killedAtMs} ms`);
  for (const gateway of gateways) assert.equal((await metricSamples(gateway, 'conduit_router_index_blocks')).has(doomed.address), false);
  const numTurnsBefore = turns[0].length;
  await round();
  assert.ok(turns.every((conversation) => conversation.length === numTurnsBefore + 1), 'every conversation answered once');

  // Redis stops: both gateways route on what they knew, their indexes fed by the engine streams.
  await redis.stop();
  for (const gateway of gateways) await until(async () => (await metricSamples(gateway, 'conduit_router_redis_connected')).get('') === 0, 'the gateways noticed');
  const fromTurn = turns[0].length + 1;
  for (let n = 0; n < 2; n++) for (let index = 0; index < numConversations; index++) await takeTurn(index);
  assertHistoryFound(fromTurn);
  for (const gateway of gateways) assert.equal(await numWorkersOf(gateway), 2, 'no worker dropped while Redis was away');

  // Redis returns empty: the workers register again and both indexes are rebuilt from fresh snapshots.
  await redis.start();
  for (const gateway of gateways) await until(async () => (await metricSamples(gateway, 'conduit_router_redis_connected')).get('') === 1, 'the gateways reconnected');
  await until(() => indexesAgree(gateways), 'both indexes rebuilt from the streams');
  await new Promise((resolve) => setTimeout(resolve, 2 * HEARTBEAT.ttl_s * 1000));
  for (const gateway of gateways) assert.equal(await numWorkersOf(gateway), 2, 'the live workers stayed after Redis returned');
  const rebuiltFrom = turns[0].length + 1;
  await round();
  assertHistoryFound(rebuiltFrom);
});
