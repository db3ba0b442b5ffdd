// The gateway's CPU time per streamed token. Three processes share the machine, as on a one-box
// deployment: a fast fake engine worker (the real engine loop and gRPC service over a runner
// that returns a token per sequence every --step-ms, no model), `conduit serve` in front of it,
// and the clients (this process). The figure is the gateway process's own CPU time (utime +
// stime from /proc) over the run, divided by the tokens its clients received; each scenario also
// states the p99 gap between two tokens of one stream, so a starved stream shows. Clients stream
// chat completions over SSE, or turns of the Responses API's WebSocket mode (one connection each).
//
// The reference, measured in the same run: a bare node:http server (no framework, no engine)
// that writes precomputed chat chunks of the same shape to the same clients at the same pace:
// the floor of streaming SSE from Node on this machine.
//
// A scenario streams at least --min-tokens in all (a stream gets more tokens when there are few
// clients, up to the context), so that fixed costs and the clock's 10 ms ticks do not dominate.
//
//   npm run bench:gateway [-- --tokens 200 --min-tokens 40000 --warmup-tokens 24000 --step-ms 2 --sse-clients 1,16,100,1000 --websocket-clients 1000]
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';
import WebSocket from 'ws';
import { createEngine } from '../engine/engine.ts';
import { serveEngine } from '../engine/grpc/service.ts';
import type { ModelRunner, RunnerInfo } from '../engine/runner.ts';
import { TOP_LOGPROBS_STRIDE, type RunnerResult, type SchedulerOutput } from '../engine/scheduler-output.ts';
import { describeCpu } from './bench-model.ts';
import { freePort } from './free-port.ts';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const conduitBin = path.join(repoRoot, 'bin', 'conduit.js');
const modelDir = path.join(repoRoot, 'models', 'conduit-tiny');
const MODEL_NAME = 'conduit-tiny';
const CLOCK_TICKS_PER_SECOND = 100;
/** Ordinary word pieces of conduit-tiny's vocabulary, so the detokenizer does its usual work. */
const FIRST_TOKEN_ID = 300;
const NUM_DISTINCT_TOKENS = 64;
/** conduit-tiny's context, less the chat prompt. */
const MAX_STREAM_TOKENS = 2000;

/** A runner that samples FIRST_TOKEN_ID + k for every sequence, one step every stepMs. */
class PacedRunner implements ModelRunner {
  readonly info: RunnerInfo = { numKvBlocks: 1 << 16, blockSizeTokens: 16, vocabSize: 4096, maxModelLen: 2048 };
  constructor(private readonly stepMs: number) {}

  async execute(output: SchedulerOutput): Promise<RunnerResult> {
    await new Promise((resolve) => setTimeout(resolve, this.stepMs));
    const numSeqs = output.scheduled.length;
    const sampledTokenIds = new Int32Array(numSeqs);
    for (const [index, entry] of output.scheduled.entries()) {
      sampledTokenIds[index] = entry.sample ? FIRST_TOKEN_ID + (entry.numOutputTokens % NUM_DISTINCT_TOKENS) : -1;
    }
    return {
      sampledTokenIds,
      sampledLogprobs: new Float32Array(numSeqs).fill(-1),
      topTokenIds: new Int32Array(numSeqs * TOP_LOGPROBS_STRIDE).fill(-1),
      topLogprobs: new Float32Array(numSeqs * TOP_LOGPROBS_STRIDE).fill(Number.NaN),
      promptLogprobs: new Float32Array(0),
      promptRanks: new Int32Array(0),
      promptTopTokenIds: new Int32Array(0),
      promptTopLogprobs: new Float32Array(0),
    };
  }

  close(): void {}
}

async function runFakeEngine(listen: string, stepMs: number) {
  const engine = createEngine(new PacedRunner(stepMs), {
    servedName: MODEL_NAME,
    maxNumSeqs: 2048,
    maxNumBatchedTokens: 1 << 16,
    generationDefaults: { eosTokenIds: [4095] },
  });
  const server = await serveEngine(engine, listen);
  process.send?.({ address: server.address });
  await new Promise((resolve) => process.once('disconnect', resolve));
  await engine.close();
  await server.close();
}

/** The reference: every stepMs, one precomputed chunk to each open stream, until it has its tokens. */
async function runBareSse(stepMs: number) {
  const chunk = (text: string) =>
    `data: {"id":"chatcmpl-0123456789abcdef0123456789abcdef","object":"chat.completion.chunk","created":1796308028,` +
    `"model":"${MODEL_NAME}","choices":[{"index":0,"delta":{"content":${JSON.stringify(text)}},"logprobs":null,"finish_reason":null}]}\n\n`;
  const tokenChunk = chunk(' word');
  const streams = new Set<{ response: http.ServerResponse; numLeft: number }>();
  const server = http.createServer((request, response) => {
    let body = '';
    request.setEncoding('utf8');
    request.on('data', (piece: string) => (body += piece));
    request.on('end', () => {
      const { max_tokens: numTokens } = JSON.parse(body) as { max_tokens: number };
      response.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache' });
      streams.add({ response, numLeft: numTokens });
    });
  });
  setInterval(() => {
    for (const stream of streams) {
      stream.response.write(tokenChunk);
      if (--stream.numLeft > 0) continue;
      stream.response.end('data: [DONE]\n\n');
      streams.delete(stream);
    }
  }, stepMs);
  server.listen(0, '127.0.0.1', () => process.send?.({ port: (server.address() as net.AddressInfo).port }));
  await new Promise((resolve) => process.once('disconnect', resolve));
  server.close();
}

function spawnChild(args: string[]): ChildProcess {
  return spawn(process.execPath, ['--import', 'tsx', fileURLToPath(import.meta.url), ...args], {
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
}

async function messageFrom<T>(child: ChildProcess): Promise<T> {
  const [message] = await once(child, 'message');
  return message as T;
}

/** utime + stime of a process, in seconds. */
function cpuSeconds(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS_PER_SECOND;
}

interface StreamResult {
  numTokens: number;
  gapsMs: number[];
}

/** One streamed chat completion; a token is a chunk with content. */
function streamChat(port: number, numTokens: number, agent: http.Agent): Promise<StreamResult> {
  const body = JSON.stringify({
    model: MODEL_NAME,
    messages: [{ role: 'user', content: 'Tell me a story' }],
    max_tokens: numTokens,
    ignore_eos: true,
    stream: true,
  });
  return new Promise((resolve, reject) => {
    const request = http.request(
      { host: '127.0.0.1', port, path: '/v1/chat/completions', method: 'POST', agent, headers: { 'content-type': 'application/json' } },
      (response) => {
        if (response.statusCode !== 200) {
          reject(new Error(`status ${response.statusCode}`));
          return;
        }
        const result: StreamResult = { numTokens: 0, gapsMs: [] };
        let lastMs = -1;
        response.setEncoding('utf8');
        response.on('data', (text: string) => {
          // A chunk may hold several events; each content delta is one token here.
          let count = 0;
          for (let at = text.indexOf('"content":"'); at !== -1; at = text.indexOf('"content":"', at + 1)) {
            if (text[at + 11] !== '"') count++;
          }
          if (count === 0) return;
          const nowMs = performance.now();
          if (lastMs >= 0) result.gapsMs.push(nowMs - lastMs);
          lastMs = nowMs;
          result.numTokens += count;
        });
        response.on('end', () => resolve(result));
        response.on('error', reject);
      },
    );
    request.on('error', reject);
    request.end(body);
  });
}

/** One turn of the Responses API's WebSocket mode, on its own connection; a token is an output_text.delta. */
function streamResponsesTurn(port: number, numTokens: number): Promise<StreamResult> {
  return new Promise((resolve, reject) => {
    const socket = new WebSocket(`ws://127.0.0.1:${port}/v1/responses`);
    const result: StreamResult = { numTokens: 0, gapsMs: [] };
    let lastMs = -1;
    socket.on('open', () => {
      socket.send(JSON.stringify({
        type: 'response.create',
        model: MODEL_NAME,
        input: 'Tell me a story',
        max_output_tokens: numTokens,
        ignore_eos: true,
        store: false,
      }));
    });
    socket.on('message', (data: Buffer) => {
      const text = data.toString('utf8');
      if (text.includes('"type":"response.output_text.delta"')) {
        const nowMs = performance.now();
        if (lastMs >= 0) result.gapsMs.push(nowMs - lastMs);
        lastMs = nowMs;
        result.numTokens++;
      } else if (text.includes('"type":"response.completed"') || text.includes('"type":"response.incomplete"')) {
        socket.close();
        resolve(result);
      } else if (text.includes('"type":"error"') || text.includes('"type":"response.failed"')) {
        socket.close();
        reject(new Error(text));
      }
    });
    socket.on('error', reject);
  });
}

interface ScenarioResult {
  cpuMicrosPerToken: number;
  numTokens: number;
  seconds: number;
  p99GapMs: number;
}

type Transport = 'sse' | 'websocket';

async function runScenario(port: number, serverPid: number, transport: Transport, numClients: number, numTokens: number): Promise<ScenarioResult> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity });
  const cpuBefore = cpuSeconds(serverPid);
  const start = performance.now();
  const stream = () => (transport === 'sse' ? streamChat(port, numTokens, agent) : streamResponsesTurn(port, numTokens));
  const results = await Promise.all(Array.from({ length: numClients }, stream));
  const seconds = (performance.now() - start) / 1000;
  const cpu = cpuSeconds(serverPid) - cpuBefore;
  agent.destroy();
  const total = results.reduce((sum, result) => sum + result.numTokens, 0);
  const gaps = results.flatMap((result) => result.gapsMs).sort((a, b) => a - b);
  return {
    cpuMicrosPerToken: (cpu / total) * 1e6,
    numTokens: total,
    seconds,
    p99GapMs: gaps.length === 0 ? 0 : gaps[Math.min(gaps.length - 1, Math.floor(gaps.length * 0.99))],
  };
}

async function waitForHealth(url: string, server: ChildProcess): Promise<void> {
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    if (server.exitCode !== null) throw new Error(`conduit serve exited with code ${server.exitCode}`);
    if (await fetch(`${url}/health`).then((response) => response.ok, () => false)) return;
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  throw new Error('conduit serve did not become healthy within 60 s');
}

async function main() {
  const { values } = parseArgs({
    options: {
      'fake-engine': { type: 'string' },
      'bare-sse': { type: 'boolean', default: false },
      'step-ms': { type: 'string', default: '2' },
      tokens: { type: 'string', default: '200' },
      'min-tokens': { type: 'string', default: '40000' },
      'warmup-tokens': { type: 'string', default: '24000' },
      'sse-clients': { type: 'string', default: '1,16,100,1000' },
      'websocket-clients': { type: 'string', default: '1000' },
    },
  });
  const stepMs = Number(values['step-ms']);
  if (values['fake-engine'] !== undefined) return runFakeEngine(values['fake-engine'], stepMs);
  if (values['bare-sse']) return runBareSse(stepMs);

  const numTokens = Number(values.tokens);
  const minTotalTokens = Number(values['min-tokens']);
  const scenarios: [Transport, number][] = [
    ...values['sse-clients'].split(',').map((count): [Transport, number] => ['sse', Number(count)]),
    ...values['websocket-clients'].split(',').map((count): [Transport, number] => ['websocket', Number(count)]),
  ].filter(([, numClients]) => numClients > 0);
  console.log(`CPU: ${describeCpu()}`);
  console.log(`at least ${numTokens} tokens per stream, one every ${stepMs} ms; gateway CPU from /proc, per token received`);
  const workDir = mkdtempSync(path.join(os.tmpdir(), 'conduit-bench-gateway-'));
  const children: ChildProcess[] = [];
  try {
    const engine = spawnChild(['--fake-engine', `unix:${path.join(workDir, 'engine.sock')}`, '--step-ms', String(stepMs)]);
    children.push(engine);
    const { address } = await messageFrom<{ address: string }>(engine);
    const [httpPort, metricsPort] = [await freePort(), await freePort()];
    const configPath = path.join(workDir, 'gateway.yaml');
    writeFileSync(configPath, [
      'server:',
      '  host: 127.0.0.1',
      `  http_port: ${httpPort}`,
      `  metrics_port: ${metricsPort}`,
      'models:',
      `  - path: ${JSON.stringify(modelDir)}`,
      '    num_workers: 0',
      `    remote_workers: [${JSON.stringify(address)}]`,
      '',
    ].join('\n'));
    // Its log (JSON on stdout, a failed start's fatal line among it) goes to a file, read only on a failure.
    const logFile = path.join(workDir, 'gateway.log');
    const logFd = openSync(logFile, 'w');
    const gateway = spawn(process.execPath, [conduitBin, 'serve', '--config', configPath], { stdio: ['ignore', logFd, 'inherit'] });
    closeSync(logFd);
    children.push(gateway);
    await waitForHealth(`http://127.0.0.1:${httpPort}`, gateway).catch((err: Error) => {
      throw new Error(`${err.message}:\n${readFileSync(logFile, 'utf8')}`);
    });
    const bare = spawnChild(['--bare-sse', '--step-ms', String(stepMs)]);
    children.push(bare);
    const { port: barePort } = await messageFrom<{ port: number }>(bare);
    // Steady state is the figure: a few seconds of streaming first, so that the JIT has compiled
    // the per-token path (a cold run spends a fifth of its CPU in the optimizing compiler).
    const numWarmupTokens = Number(values['warmup-tokens']);
    for (const transport of new Set(scenarios.map(([scenarioTransport]) => scenarioTransport))) {
      await runScenario(httpPort, gateway.pid!, transport, 16, Math.ceil(numWarmupTokens / 16));
    }
    await runScenario(barePort, bare.pid!, 'sse', 16, Math.ceil(numWarmupTokens / 16));

    for (const [transport, numClients] of scenarios) {
      const numStreamTokens = Math.min(MAX_STREAM_TOKENS, Math.max(numTokens, Math.ceil(minTotalTokens / numClients)));
      // Warm this scale's connections before measuring.
      await runScenario(httpPort, gateway.pid!, transport, Math.min(numClients, 16), 8);
      const measured = await runScenario(httpPort, gateway.pid!, transport, numClients, numStreamTokens);
      const label = `${transport === 'sse' ? 'SSE chat' : 'WebSocket responses'}, ${numClients} clients: gateway ` +
        `${measured.cpuMicrosPerToken.toFixed(1)} us/token (${measured.numTokens} tokens in ${measured.seconds.toFixed(1)} s, ` +
        `p99 gap ${measured.p99GapMs.toFixed(1)} ms)`;
      const versusTarget = `target <= 25 us/token: ${(measured.cpuMicrosPerToken / 25).toFixed(2)} x`;
      if (transport === 'websocket') {
        console.log(`${label}; ${versusTarget}`);
        continue;
      }
      await runScenario(barePort, bare.pid!, 'sse', Math.min(numClients, 16), 8);
      const floor = await runScenario(barePort, bare.pid!, 'sse', numClients, numStreamTokens);
      console.log(
        `${label}; bare node:http ${floor.cpuMicrosPerToken.toFixed(1)} us/token (p99 gap ${floor.p99GapMs.toFixed(1)} ms): ` +
          `${(measured.cpuMicrosPerToken / floor.cpuMicrosPerToken).toFixed(2)} x the floor; ${versusTarget}`,
      );
    }
  } finally {
    for (const child of children) child.kill();
    rmSync(workDir, { recursive: true, force: true });
  }
}

await main();
