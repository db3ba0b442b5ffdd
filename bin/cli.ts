// The `conduit` command line: serve, worker, loadtest.
import path from 'node:path';
import { parseArgs } from 'node:util';
import { loadConfigFile, logLevelSchema, serverSchema, validateConfig, ConfigError, type Config, type LogLevel } from '../configs/schema.ts';
import { FatalError } from './fatal-error.ts';
import { createLifecycleLog } from './lifecycle-log.ts';
import { createGatewayLogger } from '../gateway/logging.ts';
import { parseJsonFlag, parseWorkerArgs } from './worker-flags.ts';
import { packageRoot } from '../package-root.ts';
import { CONDUIT_VERSION } from './version.ts';
import { SUPERVISED_WORKER_ENV, type WorkerStartFailure } from './local-workers.ts';

const defaultConfigFile = path.join(packageRoot, 'configs', 'default.yaml');

const serveUsage = `usage: conduit serve [--config FILE] [--model DIR ...] [--http-port N] [--grpc-port N] [--metrics-port N]
                     [--model-repository DIR] [--model-control-mode none|poll|explicit] [--load-model NAME ...]
                     [--log-level trace|debug|info|warn|error|fatal|silent] [--device cpu|cuda]
                     [--speculative-config '{"method": "ngram", "num_speculative_tokens": 4}']
  Serves the configuration's models (configs/default.yaml without --config or --model; configs/README.md
  lists every setting): the OpenAI API, the chat page and KServe v2 over HTTP on :8000, KServe v2 gRPC
  on :8001 with a model repository, Prometheus metrics on :8002. --device cuda runs every model on the
  GPU (the CUDA plugin, built where nvcc is found).`;

const workerUsage = `usage: conduit worker --model DIR --listen HOST:PORT|unix:PATH [--dtype auto|fp32|bf16|fp16]
                      [--kv-cache-dtype ...] [--max-model-len N] [--kv-cache-blocks N | --kv-cache-bytes N]
                      [--block-size N] [--max-num-seqs N] [--max-num-batched-tokens N] [--threads N]
                      [--grammar-threads N] [--performance-mode interactivity|throughput] [--max-num-partial-prefills N]
                      [--max-long-partial-prefills N] [--long-prefill-token-threshold N] [--max-prefill-tokens-beside-decodes N]
                      [--kernel auto|amx|avx512|avx2|scalar] [--device cpu|cuda] [--quantization none|int8|int4] [--served-name NAME]
                      [--tensor-parallel-size 1|2|4|8] [--tensor-parallel-transport shm|mpi]
                      [--enable-prefix-caching true|false] [--scheduling-policy fcfs|priority] [--log-level LEVEL]
                      [--speculative-config JSON]
                      [--redis-url redis://HOST:PORT [--advertise-address HOST:PORT]
                       [--heartbeat-interval-s S] [--heartbeat-ttl-s S]]
  One engine worker serving a checkpoint over engine.proto, for gateways elsewhere (configs/README.md,
  remote_workers; router/README.md for Redis).`;

const usage = `usage: conduit serve|worker|rank|loadtest [options]   (conduit COMMAND --help for each)
       conduit --version

${serveUsage}

${workerUsage}

usage: conduit loadtest --url URL --model NAME --scenario NAME|FILE [options]   (conduit loadtest --help)`;

/** --help or -h among a command's arguments: its usage, not a run. */
function asksForHelp(argv: readonly string[]): boolean {
  return argv.includes('--help') || argv.includes('-h');
}

/** A port flag checked as the configuration checks the field it sets, and an error blamed on the flag, not the file. */
function portFlag(flag: string, value: string | undefined, field: 'http_port' | 'metrics_port' | 'grpc_port'): number | undefined {
  if (value === undefined) return undefined;
  const result = serverSchema.shape[field].safeParse(Number(value));
  if (!result.success) throw new ConfigError(`command line: ${flag} ${value}: ${result.error.issues[0].message}`);
  return result.data;
}

/** --log-level, else CONDUIT_LOG_LEVEL, checked like server.log_level and blamed on where it came from. */
export function logLevelOverride(flag: string | undefined, env: NodeJS.ProcessEnv = process.env): LogLevel | undefined {
  const [source, value] = flag !== undefined ? ['--log-level', flag] : ['CONDUIT_LOG_LEVEL', env.CONDUIT_LOG_LEVEL];
  if (value === undefined) return undefined;
  const result = logLevelSchema.safeParse(value);
  if (!result.success) throw new ConfigError(`command line: ${source} ${value}: ${result.error.issues[0].message}`);
  return result.data;
}

/** --model DIR adds a model with default settings to the file's (or replaces the default file). */
export function resolveServeConfig(argv: string[]): Config {
  const { values } = parseArgs({
    args: argv,
    strict: true,
    options: {
      config: { type: 'string' },
      model: { type: 'string', multiple: true },
      'http-port': { type: 'string' },
      'metrics-port': { type: 'string' },
      'grpc-port': { type: 'string' },
      // Triton's flags for the model repository of ordinary models.
      'model-repository': { type: 'string' },
      'model-control-mode': { type: 'string' },
      'load-model': { type: 'string', multiple: true },
      'log-level': { type: 'string' },
      device: { type: 'string' },
      // vLLM's flag: JSON, for every model served.
      'speculative-config': { type: 'string' },
    },
  });
  const logLevel = logLevelOverride(values['log-level']);
  const httpPort = portFlag('--http-port', values['http-port'], 'http_port');
  const metricsPort = portFlag('--metrics-port', values['metrics-port'], 'metrics_port');
  const grpcPort = portFlag('--grpc-port', values['grpc-port'], 'grpc_port');
  const modelDirs = values.model ?? [];
  const configFile = values.config ?? (modelDirs.length === 0 ? defaultConfigFile : undefined);
  const base: Config = configFile ? loadConfigFile(configFile) : validateConfig({ models: [{ path: '.' }] }, 'command line');
  const raw = {
    server: { ...base.server },
    router: base.router,
    models: [...(configFile ? base.models : []), ...modelDirs.map((dir) => ({ path: path.resolve(dir) }))].map((model) =>
      values['speculative-config'] === undefined ? model : { ...model, speculative_config: parseJsonFlag(values['speculative-config']) },
    ).map((model) => (values.device === undefined ? model : { ...model, device: values.device as 'cpu' })),
    model_repository: values['model-repository'] === undefined ? base.model_repository : { ...base.model_repository, path: path.resolve(values['model-repository']) },
  };
  if (grpcPort !== undefined) raw.server.grpc_port = grpcPort;
  if (raw.model_repository !== undefined && values['model-control-mode'] !== undefined) {
    raw.model_repository = { ...raw.model_repository, model_control_mode: values['model-control-mode'] as 'none' };
  }
  if (raw.model_repository !== undefined && values['load-model'] !== undefined) raw.model_repository = { ...raw.model_repository, load_models: values['load-model'] };
  if (httpPort !== undefined) raw.server.http_port = httpPort;
  if (metricsPort !== undefined) raw.server.metrics_port = metricsPort;
  if (logLevel !== undefined) raw.server.log_level = logLevel;
  return validateConfig(raw, configFile ?? 'command line');
}

/** Why a start was stopped: a signal, not a failure. */
const stopSignalled = new Error('stopped by a signal');

async function runServe(argv: string[]): Promise<number> {
  // Before the logger: a bad flag or configuration is one plain line on stderr (main, exit code 2).
  const config = resolveServeConfig(argv);
  const { serve } = await import('./serve.ts');
  // From here every line, the lifecycle's and the gateway's, is JSON on stdout at the configured level.
  const logger = createGatewayLogger({ level: config.server.log_level });
  const lifecycleLog = createLifecycleLog(logger);
  // SIGINT or SIGTERM stops the start while the models load, and drains once serving. A fatal
  // error (thrown and caught nowhere) does the same, and the exit code is then 1.
  const stop = new AbortController();
  let fatalError: Error | null = null;
  let signalName: NodeJS.Signals | null = null;
  const onSignal = (signal: NodeJS.Signals) => {
    signalName = signal;
    stop.abort(stopSignalled);
  };
  const onFatal = (err: unknown) => {
    if (fatalError !== null) return;
    fatalError = err instanceof Error ? err : new Error(String(err));
    lifecycleLog.fatal(`stopping on an uncaught error: ${String(fatalError)}`, 1, fatalError);
    stop.abort(fatalError);
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  process.on('uncaughtException', onFatal);
  process.on('unhandledRejection', onFatal);
  // The workers this spawns log at the gateway's level.
  process.env.CONDUIT_LOG_LEVEL = config.server.log_level;
  let server;
  try {
    server = await serve(config, { signal: stop.signal, onListening: lifecycleLog.listening, logger });
  } catch (err) {
    if (err === stopSignalled) return 0;
    if (err === fatalError) return 1;
    if (err instanceof FatalError) {
      lifecycleLog.fatal(err.message, 1);
      return 1;
    }
    throw err;
  }
  lifecycleLog.serving(server);
  if (!stop.signal.aborted) await new Promise((resolve) => stop.signal.addEventListener('abort', resolve, { once: true }));
  lifecycleLog.draining(signalName ?? 'fatal error', config.server.drain_timeout_s);
  await server.close();
  const exitCode = fatalError === null ? 0 : 1;
  lifecycleLog.stopped(exitCode);
  return exitCode;
}

async function runWorker(argv: string[]): Promise<number> {
  const settings = parseWorkerArgs(argv);
  // Spawned by a gateway (`conduit serve`, bin/local-workers.ts: an IPC channel and
  // CONDUIT_WORKER_SUPERVISED), its end is the gateway's: it stops when the gateway says so over
  // the channel or when the channel closes (the gateway died). Signals sent to the whole process
  // group (a terminal's Ctrl-C, a process manager's SIGTERM) are not its to act on: the gateway
  // drains its streams first, then stops it. Any other worker stops on SIGTERM or SIGINT, and
  // when an IPC channel it was given as a lifeline closes.
  const isSupervised = process.send !== undefined && process.env[SUPERVISED_WORKER_ENV] === '1';
  let stopRequested: () => void = () => {};
  const whenStopRequested = new Promise<void>((resolve) => {
    stopRequested = resolve;
  });
  if (isSupervised) {
    for (const signal of ['SIGTERM', 'SIGINT'] as const) process.on(signal, () => {});
    process.on('message', (message: { type?: string }) => {
      if (message?.type === 'stop') stopRequested();
    });
  } else {
    process.once('SIGTERM', () => stopRequested());
    process.once('SIGINT', () => stopRequested());
  }
  if (process.send !== undefined) process.once('disconnect', () => stopRequested());
  const { startWorker } = await import('../engine/worker.ts');
  const { createWorkerLogger } = await import('../engine/log.ts');
  const log = createWorkerLogger(settings.logLevel ?? 'info');
  try {
    let worker;
    try {
      // Told to stop while the model loads: nothing runs yet, so nothing to drain.
      worker = await Promise.race([startWorker({ ...settings, log }), whenStopRequested.then(() => null)]);
    } catch (err) {
      // A checkpoint that does not load, a setting it cannot honour: one line saying what, no
      // stack (at debug level, for a bug). Spawned by a gateway, the gateway's fatal line says it.
      const { message } = err as Error;
      log.debug({ err }, 'worker start failed');
      if (process.send) {
        const failure: WorkerStartFailure = { type: 'start_failed', message };
        await new Promise((resolve) => process.send!(failure, resolve));
      } else {
        log.fatal({ event: 'fatal', exit_code: 1 }, `worker cannot start: ${message}`);
      }
      return 1;
    }
    if (worker === null) process.exit(0);
    // A tensor-parallel rank died: this worker exits non-zero, and its supervisor restarts the group as one.
    const lost = await Promise.race([whenStopRequested.then(() => null), worker.failed]);
    if (lost !== null) log.error({ event: 'rank_lost' }, `worker: ${lost.message}`);
    await worker.close();
    return lost === null ? 0 : 1;
  } finally {
    // The lifeline to a spawning gateway would keep the event loop, and so the process, alive.
    if (process.connected) process.disconnect();
  }
}

function printUsage(text: string): number {
  console.log(text);
  return 0;
}

export async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  try {
    switch (command) {
      case 'serve':
        if (asksForHelp(rest)) return printUsage(serveUsage);
        return await runServe(rest);
      case 'worker':
        if (asksForHelp(rest)) return printUsage(workerUsage);
        return await runWorker(rest);
      case 'rank': {
        const { rankUsage, runRank } = await import('./rank.ts');
        if (asksForHelp(rest)) return printUsage(rankUsage);
        return await runRank(rest);
      }
      case 'loadtest': {
        const loadtest = await import('../loadtest/cli.ts');
        return await loadtest.main(rest);
      }
      case '--version':
      case '-v':
      case 'version':
        console.log(CONDUIT_VERSION);
        return 0;
      case undefined:
        console.error(usage);
        return 2;
      case '--help':
      case '-h':
      case 'help':
        return printUsage(usage);
      default:
        console.error(`conduit: unknown command '${command}'\n${usage}`);
        return 2;
    }
  } catch (err) {
    if (err instanceof ConfigError) {
      console.error(`conduit: ${(err as Error).message}`);
      return 2;
    }
    if ((err as NodeJS.ErrnoException).code?.startsWith('ERR_PARSE_ARGS')) {
      console.error(`conduit: ${(err as Error).message} (conduit ${command} --help lists the options)`);
      return 2;
    }
    console.error(`conduit: ${(err as Error).stack ?? err}`);
    return 1;
  }
}
