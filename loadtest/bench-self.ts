// How much load one loadtest process can drive: runs the real load generator (closed loop,
// chat endpoint) against an SSE server in a child process that answers instantly with
// pre-rendered streams, and prints requests/s and streamed tokens/s with both processes' CPU
// use. A client near 100% CPU is the limit; a server near 100% means the figures are a floor.
//
//   node --import tsx loadtest/bench-self.ts [--seconds-per-case S]

import { type ChildProcess, fork } from 'node:child_process';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { runLoadtest } from './run.ts';

interface BenchCase {
  name: string;
  numClients: number;
  outputTokens: number;
}

const CASES: BenchCase[] = [
  { name: 'short answers (requests/s)', numClients: 64, outputTokens: 4 },
  { name: 'long streams (tokens/s)', numClients: 64, outputTokens: 512 },
  { name: 'many streams', numClients: 512, outputTokens: 64 },
];

/** Child mode: a server whose every stream is rendered once per length and then only written. */
function serveInstantly(): void {
  const renderedByLength = new Map<number, Buffer>();
  const render = (numTokens: number): Buffer => {
    let body = `data: ${JSON.stringify({ choices: [{ index: 0, delta: { role: 'assistant', content: '' } }] })}\n\n`;
    const event = `data: ${JSON.stringify({ object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content: ' tok' }, finish_reason: null }] })}\n\n`;
    body += event.repeat(numTokens);
    body += `data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: 8, completion_tokens: numTokens, total_tokens: 8 + numTokens } })}\n\n`;
    return Buffer.from(body + 'data: [DONE]\n\n');
  };
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      if (req.url === '/cpu') {
        const { user, system } = process.cpuUsage();
        return res.end(JSON.stringify({ cpuMicros: user + system }));
      }
      if (req.url === '/tokenize') {
        res.writeHead(404);
        return res.end();
      }
      const maxTokens = (JSON.parse(Buffer.concat(chunks).toString()) as { max_tokens: number }).max_tokens;
      let body = renderedByLength.get(maxTokens);
      if (!body) renderedByLength.set(maxTokens, (body = render(maxTokens)));
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(body);
    });
  });
  server.keepAliveTimeout = 60_000;
  server.listen(0, '127.0.0.1', () => process.send!((server.address() as AddressInfo).port));
}

async function serverCpuMicros(baseUrl: string): Promise<number> {
  return ((await (await fetch(`${baseUrl}/cpu`)).json()) as { cpuMicros: number }).cpuMicros;
}

function runFixed(baseUrl: string, benchCase: BenchCase, numRequests: number) {
  return runLoadtest({
    url: baseUrl,
    model: 'bench',
    endpoint: 'chat',
    workload: { kind: 'scenario', scenario: { name: 'fixed', inputTokens: 8, outputTokens: benchCase.outputTokens }, numRequests },
    load: { kind: 'concurrency', numClientsList: [benchCase.numClients] },
  });
}

async function runCase(baseUrl: string, benchCase: BenchCase, secondsPerCase: number): Promise<string> {
  // Warm up (JIT on both sides, connections) until a run lasts a second, then size the
  // measured run from the warm rate so that it lasts about secondsPerCase.
  let numRequests = benchCase.numClients * 4;
  let warm = await runFixed(baseUrl, benchCase, numRequests);
  while (warm.duration_s < 1) {
    numRequests *= 4;
    warm = await runFixed(baseUrl, benchCase, numRequests);
  }
  numRequests = Math.max(numRequests, Math.round(warm.request_throughput * secondsPerCase));
  const serverCpuBefore = await serverCpuMicros(baseUrl);
  const clientCpuBefore = process.cpuUsage();
  const results = await runFixed(baseUrl, benchCase, numRequests);
  const clientCpu = process.cpuUsage(clientCpuBefore);
  const serverCpu = (await serverCpuMicros(baseUrl)) - serverCpuBefore;
  const wallMicros = results.duration_s * 1e6;
  const percent = (micros: number) => `${Math.round((micros / wallMicros) * 100)}%`.padStart(5);
  return [
    benchCase.name.padEnd(28),
    `${benchCase.numClients}`.padStart(7),
    `${benchCase.outputTokens}`.padStart(7),
    results.request_throughput.toFixed(0).padStart(9),
    results.output_token_throughput.toFixed(0).padStart(10),
    percent(clientCpu.user + clientCpu.system).padStart(10),
    percent(serverCpu).padStart(10),
    `${results.errors.total}`.padStart(7),
  ].join(' ');
}

async function main(): Promise<void> {
  const { values } = parseArgs({ options: { 'seconds-per-case': { type: 'string', default: '5' }, serve: { type: 'boolean', default: false } } });
  if (values.serve) return serveInstantly();
  const child: ChildProcess = fork(fileURLToPath(import.meta.url), ['--serve'], { execArgv: ['--import', 'tsx'] });
  try {
    const port = await new Promise<number>((resolve, reject) => {
      child.once('message', (message) => resolve(message as number));
      child.once('exit', (code) => reject(new Error(`the bench server exited with code ${code}`)));
    });
    const baseUrl = `http://127.0.0.1:${port}`;
    console.log('case                         clients  tokens     req/s      tok/s client CPU server CPU errors');
    for (const benchCase of CASES) console.log(await runCase(baseUrl, benchCase, Number(values['seconds-per-case'])));
  } finally {
    child.kill();
  }
}

await main();
