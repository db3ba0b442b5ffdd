// KV-aware routing over real engine workers (separate `conduit worker` processes) with one
// gateway and no Redis: conversations find the worker holding their history, the router's
// predictions are exactly what the workers then find, and a worker killed mid-stream costs only
// the requests it had started.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { defaultModelDir, startServer } from './harness.ts';
import { startWorkerProcess, type WorkerProcess } from './worker-process.ts';
import { pollUntil } from '../wait.ts';

const modelName = 'conduit-tiny';
const BLOCK_SIZE = 16;

/** Every sample of a metric, by its worker label (one model here). */
async function samplesByWorker(metricsAddress: string, name: string): Promise<Map<string, number>> {
  const text = await (await fetch(`${metricsAddress}/metrics`)).text();
  const samples = new Map<string, number>();
  for (const line of text.split('\n')) {
    const match = new RegExp(`^${name}\\{model_name="${modelName}",worker="([^"]+)"\\} (\\S+)$`).exec(line);
    if (match) samples.set(match[1], Number(match[2]));
  }
  return samples;
}

const total = (samples: Map<string, number>) => [...samples.values()].reduce((sum, value) => sum + value, 0);

async function startWorkers(count: number, extraArgs: string[]): Promise<WorkerProcess[]> {
  return Promise.all(Array.from({ length: count }, () => startWorkerProcess(extraArgs)));
}

test('multi-turn conversations land on the worker that holds their history', { timeout: 180_000 }, async (t) => {
  const workers = await startWorkers(3, ['--kv-cache-blocks', '256']);
  t.after(() => Promise.all(workers.map((worker) => worker.stop('SIGKILL'))));
  const server = await startServer([{ path: defaultModelDir, num_workers: 0, remote_workers: workers.map((w) => w.address) }]);
  t.after(() => server.close());
  const client = new OpenAI({ baseURL: `${server.httpAddress}/v1`, apiKey: 'unused', maxRetries: 0 });

  const numConversations = 6;
  const messages: OpenAI.Chat.ChatCompletionMessageParam[][] = Array.from({ length: numConversations }, () => []);
  const turns: { promptTokens: number; cachedTokens: number }[][] = Array.from({ length: numConversations }, () => []);
  const takeTurn = async (index: number) => {
    const turn = turns[index].length;
    messages[index].push({ role: 'user', content: `Conversation ${index} turn ${turn}: ${'tell me more about the river and the town '.repeat(2 + index)}` });
    const completion = await client.chat.completions.create({
      model: modelName, messages: messages[index], max_tokens: 16, temperature: 0, ignore_eos: true,
    } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
    messages[index].push({ role: 'assistant', content: completion.choices[0].message.content ?? '' });
    turns[index].push({ promptTokens: completion.usage!.prompt_tokens, cachedTokens: completion.usage!.prompt_tokens_details!.cached_tokens! });
  };
  // First turns at once: counted at routing, they spread over the workers. Then the later turns
  // one at a time, conversations interleaved, so that each turn weighs its history alone.
  await Promise.all(turns.map((_, index) => takeTurn(index)));
  for (let turn = 1; turn < 4; turn++) for (let index = 0; index < numConversations; index++) await takeTurn(index);

  for (const [index, conversation] of turns.entries()) {
    for (let turn = 1; turn < conversation.length; turn++) {
      // Every full block of the previous turn's prompt is on the worker that served it.
      const previousBlocks = Math.floor(conversation[turn - 1].promptTokens / BLOCK_SIZE);
      assert.ok(
        conversation[turn].cachedTokens >= previousBlocks * BLOCK_SIZE,
        `conversation ${index} turn ${turn}: ${conversation[turn].cachedTokens} cached of ${conversation[turn].promptTokens} after a ${conversation[turn - 1].promptTokens}-token turn`,
      );
    }
  }
  const requests = await samplesByWorker(server.metricsAddress, 'conduit_router_requests_total');
  assert.equal(total(requests), 24);
  // Whole conversations per worker, on every worker. How evenly the first turns spread depends on
  // whether one has ended before the last is routed, which a loaded machine decides.
  const perWorker = [...requests.values()];
  assert.equal(perWorker.length, 3, `requests on ${perWorker.length} workers of 3`);
  assert.ok(perWorker.every((count) => count > 0 && count % 4 === 0), `not whole conversations per worker: ${perWorker.join(', ')}`);
  // The index is exact: what it predicted is what the workers found, token for token.
  const predicted = await samplesByWorker(server.metricsAddress, 'conduit_router_predicted_cached_tokens_total');
  const actual = await samplesByWorker(server.metricsAddress, 'conduit_router_cached_tokens_total');
  assert.ok(total(actual) > 0);
  assert.deepEqual(predicted, actual);
  const drift = await samplesByWorker(server.metricsAddress, 'conduit_router_index_drift_blocks');
  assert.deepEqual([...drift.values()], [0, 0, 0]);
  const indexed = await samplesByWorker(server.metricsAddress, 'conduit_router_index_blocks');
  const cachedOnWorkers = await samplesByWorker(server.metricsAddress, 'conduit_kv_blocks_total');
  assert.equal(indexed.size, 3);
  assert.ok(total(indexed) > 0 && [...indexed.values()].every((n, i) => n <= [...cachedOnWorkers.values()][i]));
});

test('a worker killed mid-stream: its stream ends with an error, its queued request runs elsewhere, its blocks leave the index', { timeout: 180_000 }, async (t) => {
  // One sequence at a time, so a second request waits in the worker's queue, not yet started.
  const workers = await startWorkers(3, ['--kv-cache-blocks', '256', '--max-num-seqs', '1', '--max-num-batched-tokens', '64']);
  t.after(() => Promise.all(workers.map((worker) => worker.stop('SIGKILL'))));
  const server = await startServer([{ path: defaultModelDir, num_workers: 0, remote_workers: workers.map((w) => w.address) }]);
  t.after(() => server.close());
  const client = new OpenAI({ baseURL: `${server.httpAddress}/v1`, apiKey: 'unused', maxRetries: 0 });
  const session = { headers: { 'x-session-id': 'doomed' } };

  const long = await client.completions.create(
    { model: modelName, prompt: 'Once upon a time', max_tokens: 1500, ignore_eos: true, stream: true } as OpenAI.CompletionCreateParamsStreaming,
    session,
  );
  const iterator = long[Symbol.asyncIterator]();
  assert.ok(!(await iterator.next()).done, 'the long request is streaming');
  const byWorker = await samplesByWorker(server.metricsAddress, 'conduit_router_requests_total');
  const doomedAddress = [...byWorker.keys()][0];
  const doomed = workers.find((worker) => worker.address === doomedAddress)!;
  // Same session, same worker: it queues behind the long one.
  const queued = client.completions.create(
    { model: modelName, prompt: 'A second story begins', max_tokens: 8, ignore_eos: true } as OpenAI.CompletionCreateParamsNonStreaming,
    session,
  );
  await pollUntil(async () => total(await samplesByWorker(server.metricsAddress, 'conduit_router_requests_total')) >= 2, 'the queued request routed');
  assert.equal((await samplesByWorker(server.metricsAddress, 'conduit_router_requests_total')).get(doomedAddress), 2);
  // The long request's first block reaches the index once its worker has computed a full block of tokens.
  await pollUntil(
    async () => ((await samplesByWorker(server.metricsAddress, 'conduit_router_index_blocks')).get(doomedAddress) ?? 0) > 0,
    "the doomed worker's blocks in the index",
  );

  await doomed.stop('SIGKILL');
  await assert.rejects(async () => {
    for (let next = await iterator.next(); !next.done; next = await iterator.next());
  }, (err: unknown) => err instanceof OpenAI.APIError && /engine_unavailable|Lost the stream/.test(String(err.message) + JSON.stringify(err.error)));
  const retried = await queued;
  assert.equal(retried.usage?.completion_tokens, 8, 'the queued request ran to its end on another worker');

  const fresh = await client.completions.create({ model: modelName, prompt: 'Once upon a time', max_tokens: 4 } as OpenAI.CompletionCreateParamsNonStreaming, session);
  assert.equal(fresh.choices.length, 1);
  const requests = await samplesByWorker(server.metricsAddress, 'conduit_router_requests_total');
  assert.equal(requests.get(doomedAddress), 2, 'nothing new went to the dead worker');
  assert.equal(total(requests), 4);
  const retries = await samplesByWorker(server.metricsAddress, 'conduit_router_retries_total');
  assert.deepEqual([...retries], [[doomedAddress, 1]]);
  const indexed = await samplesByWorker(server.metricsAddress, 'conduit_router_index_blocks');
  assert.equal(indexed.get(doomedAddress), 0);
});
