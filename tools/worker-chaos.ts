// Worker kills under streaming load, for `npm run chaos:workers` and its integration test:
// `conduit serve` (the real CLI, a child process) over remote workers this module runs itself
// (`conduit worker --listen`, so one can be SIGKILLed and started again on its port at once,
// without a supervisor's backoff). One round: streams on every worker, one worker killed while
// they run, then checked: each stream either ended with an OpenAI error event and [DONE] (it ran
// on the killed worker) or finished with every token it asked for; as many errors as the killed
// worker had streams; a new request succeeds at once; the worker is started again.
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { freePort } from './free-port.ts';
import { workerServing } from '../test/integration/worker-serving.ts';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const conduitBin = path.join(repoRoot, 'bin', 'conduit.js');
const modelDir = path.join(repoRoot, 'models', 'conduit-tiny');
const MODEL = 'conduit-tiny';
const START_TIMEOUT_MS = 120_000;
/** A stream unanswered or unfinished this long is a hang. */
const STREAM_TIMEOUT_MS = 60_000;

export interface ChaosSettings {
  numWorkers: number;
  streamsPerWorker: number;
  /** Tokens each stream asks for (ignore_eos): long enough to be mid-stream when its worker dies. */
  numTokens: number;
}

interface Worker {
  port: number;
  address: string;
  child: ChildProcess;
}

export interface RoundResult {
  /** Streams on the killed worker that ended with an OpenAI error event. */
  numCleanErrors: number;
  /** Streams on the other workers that got all their tokens. */
  numCompleted: number;
  /** Whether every worker had at least one stream (otherwise the router put them all on fewer). */
  balanced: boolean;
  /** What went wrong; empty when the round passed. */
  problems: string[];
}

/** A stream's end, as its client saw it. */
type StreamEnd =
  | { kind: 'completed'; numTokens: number }
  | { kind: 'error'; code: string; message: string }
  | { kind: 'bad'; detail: string };

function waitFor<T>(promise: Promise<T>, what: string, timeoutMs: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    promise,
    new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`${what}: not within ${timeoutMs} ms`)), timeoutMs))),
  ]).finally(() => clearTimeout(timer));
}

async function startWorker(port: number): Promise<Worker> {
  const address = `127.0.0.1:${port}`;
  const child = spawn(process.execPath, [
    conduitBin, 'worker', '--model', modelDir, '--listen', address, '--threads', '1', '--kv-cache-blocks', '256',
  ], { stdio: ['ignore', 'pipe', 'pipe', 'ipc'] });
  // The IPC channel is a lifeline (a worker exits when it closes); it must not keep this process alive.
  child.channel?.unref();
  await waitFor(workerServing(child).address, `worker on ${address} serving`, START_TIMEOUT_MS);
  return { port, address, child };
}

async function stopProcess(child: ChildProcess, signal: NodeJS.Signals): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = once(child, 'exit');
  child.kill(signal);
  await exited;
}

/** Requests routed to each worker so far, from the gateway's conduit_router_requests_total. */
async function requestsByWorker(metricsUrl: string): Promise<Map<string, number>> {
  const text = await (await fetch(`${metricsUrl}/metrics`, { signal: AbortSignal.timeout(10_000) })).text();
  const counts = new Map<string, number>();
  for (const match of text.matchAll(/^conduit_router_requests_total\{model_name="[^"]+",worker="([^"]+)"\} (\S+)$/gm)) counts.set(match[1], Number(match[2]));
  return counts;
}

/** Streams one completion; onFirstToken fires with its first token. */
async function stream(baseUrl: string, sessionId: string, numTokens: number, onFirstToken: () => void): Promise<StreamEnd> {
  let response: Response;
  try {
    response = await fetch(`${baseUrl}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-session-id': sessionId },
      body: JSON.stringify({ model: MODEL, prompt: `Story ${sessionId}: once upon a time`, max_tokens: numTokens, ignore_eos: true, stream: true, stream_options: { include_usage: true } }),
      signal: AbortSignal.timeout(STREAM_TIMEOUT_MS),
    });
  } catch (err) {
    return { kind: 'bad', detail: `no response: ${(err as Error).message}` };
  }
  if (response.status !== 200) return { kind: 'bad', detail: `status ${response.status}: ${await response.text()}` };
  let text = '';
  let sawToken = false;
  try {
    const decoder = new TextDecoder();
    for await (const chunk of response.body!) {
      text += decoder.decode(chunk, { stream: true });
      if (!sawToken && text.includes('"text":')) {
        sawToken = true;
        onFirstToken();
      }
    }
  } catch (err) {
    return { kind: 'bad', detail: `the connection was cut without an error event (${(err as Error).message}) after ${JSON.stringify(text.slice(-200))}` };
  }
  if (!text.endsWith('data: [DONE]\n\n')) return { kind: 'bad', detail: `the stream ended without [DONE]: ${JSON.stringify(text.slice(-200))}` };
  const events = text.slice(0, -2).split('\n\n').map((event) => event.slice('data: '.length)).filter((data) => data !== '[DONE]').map((data) => JSON.parse(data));
  const error = events.find((event) => event.error !== undefined)?.error;
  if (error !== undefined) {
    if (typeof error.message !== 'string' || typeof error.code !== 'string' || typeof error.type !== 'string') {
      return { kind: 'bad', detail: `an error event outside the OpenAI envelope: ${JSON.stringify(error)}` };
    }
    return { kind: 'error', code: error.code, message: error.message };
  }
  const usage = events.at(-1)?.usage;
  return { kind: 'completed', numTokens: usage?.completion_tokens ?? -1 };
}

export class ChaosCluster {
  private constructor(
    readonly settings: ChaosSettings,
    readonly baseUrl: string,
    readonly metricsUrl: string,
    private readonly gateway: ChildProcess,
    private readonly workers: Worker[],
    private readonly workDir: string,
  ) {}

  /** Starts the workers on free ports and `conduit serve` naming them as remote workers. */
  static async start(settings: ChaosSettings): Promise<ChaosCluster> {
    const workDir = mkdtempSync(path.join(os.tmpdir(), 'conduit-chaos-'));
    const workers = await Promise.all(Array.from({ length: settings.numWorkers }, async () => startWorker(await freePort())));
    const [httpPort, metricsPort, grpcPort] = [await freePort(), await freePort(), await freePort()];
    const configFile = path.join(workDir, 'chaos.yaml');
    writeFileSync(configFile, [
      'server:',
      '  host: 127.0.0.1',
      `  http_port: ${httpPort}`,
      `  metrics_port: ${metricsPort}`,
      `  grpc_port: ${grpcPort}`,
      'models:',
      `  - path: ${JSON.stringify(modelDir)}`,
      '    num_workers: 0',
      `    remote_workers: [${workers.map((worker) => JSON.stringify(worker.address)).join(', ')}]`,
      '',
    ].join('\n'));
    const gateway = spawn(process.execPath, [conduitBin, 'serve', '--config', configFile], { stdio: ['ignore', 'pipe', 'pipe'] });
    // The tail of its log (stdout: the lifecycle and fatal lines) and stderr, for a failure's message.
    let log = '';
    const keep = (data: Buffer) => (log = (log + data.toString()).slice(-20_000));
    gateway.stdout!.on('data', keep);
    gateway.stderr!.on('data', keep);
    const cluster = new ChaosCluster(settings, `http://127.0.0.1:${httpPort}`, `http://127.0.0.1:${metricsPort}`, gateway, workers, workDir);
    try {
      await cluster.untilAllServing();
    } catch (err) {
      await cluster.close();
      throw new Error(`${(err as Error).message}\n${log}`);
    }
    return cluster;
  }

  /**
   * Until the gateway has a live engine stream to every worker: its metrics carry a worker's
   * gauges only then (a worker can answer /health's probe before the gateway's stream to it,
   * which reopens with a backoff, is back, and until then the router passes it over).
   */
  async untilAllServing(): Promise<void> {
    const deadlineMs = Date.now() + START_TIMEOUT_MS;
    let text = '';
    for (;;) {
      if (this.gateway.exitCode !== null) throw new Error(`conduit serve exited with code ${this.gateway.exitCode}`);
      text = await fetch(`${this.metricsUrl}/metrics`, { signal: AbortSignal.timeout(10_000) }).then((response) => response.text(), () => '');
      if (this.workers.every((worker) => text.includes(`conduit_kv_blocks_total{model_name="${MODEL}",worker="${worker.address}"}`))) return;
      if (Date.now() > deadlineMs) throw new Error(`no live stream to every worker within ${START_TIMEOUT_MS} ms`);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }

  /** One round: streams on the workers, one killed mid-stream, the outcomes checked, the worker started again. */
  async round(roundIndex: number): Promise<RoundResult> {
    const { numWorkers, streamsPerWorker, numTokens } = this.settings;
    const problems: string[] = [];
    const routedBefore = await requestsByWorker(this.metricsUrl);
    const numStreams = numWorkers * streamsPerWorker;
    // One at a time, each after the last one's first token, so the router sees each stream's load
    // before it places the next.
    const ends: Promise<StreamEnd>[] = [];
    for (let i = 0; i < numStreams; i++) {
      let firstToken: () => void = () => {};
      const started = new Promise<void>((resolve) => (firstToken = resolve));
      const end = stream(this.baseUrl, `r${roundIndex}s${i}`, numTokens, () => firstToken());
      ends.push(end);
      try {
        await waitFor(Promise.race([started, end]), `stream ${i} started`, STREAM_TIMEOUT_MS);
      } catch (err) {
        problems.push((err as Error).message);
      }
    }
    // Every stream is routed (it has a token): where each went is the routing counters' change.
    const routedAfter = await requestsByWorker(this.metricsUrl);
    const onWorker = this.workers.map((worker) => (routedAfter.get(worker.address) ?? 0) - (routedBefore.get(worker.address) ?? 0));
    const balanced = onWorker.every((count) => count > 0);
    // Kill a worker that has streams, in turn when several do.
    const candidates = this.workers.map((_, i) => i).filter((i) => onWorker[i] > 0);
    const victimIndex = candidates[roundIndex % candidates.length] ?? 0;
    const victim = this.workers[victimIndex];
    await stopProcess(victim.child, 'SIGKILL');

    // A new request right after the kill is served by a surviving worker.
    const fresh = await stream(this.baseUrl, `r${roundIndex}fresh`, 8, () => {});
    if (fresh.kind !== 'completed' || fresh.numTokens !== 8) problems.push(`a request after the kill: ${JSON.stringify(fresh)}`);

    const outcomes = await Promise.all(ends);
    const errors = outcomes.filter((end) => end.kind === 'error');
    const completed = outcomes.filter((end) => end.kind === 'completed');
    for (const end of outcomes) if (end.kind === 'bad') problems.push(end.detail);
    for (const end of completed) if (end.numTokens !== numTokens) problems.push(`a stream completed with ${end.numTokens} tokens, not ${numTokens}`);
    if (errors.length !== onWorker[victimIndex]) {
      problems.push(`${errors.length} streams ended with an error, but the killed worker had ${onWorker[victimIndex]} (${JSON.stringify(onWorker)})`);
    }
    if (completed.length !== numStreams - onWorker[victimIndex]) problems.push(`${completed.length} streams completed, not ${numStreams - onWorker[victimIndex]}`);

    this.workers[victimIndex] = await startWorker(victim.port);
    await this.untilAllServing();
    return { numCleanErrors: errors.length, numCompleted: completed.length, balanced, problems };
  }

  async close(): Promise<void> {
    await stopProcess(this.gateway, 'SIGTERM');
    await Promise.all(this.workers.map((worker) => stopProcess(worker.child, 'SIGTERM')));
    rmSync(this.workDir, { recursive: true, force: true });
  }
}
