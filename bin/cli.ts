// The `conduit` command line: serve, worker, loadtest.
import path from 'node:path';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';
import { loadConfigFile, validateConfig, ConfigError, type Config } from '../configs/schema.ts';
import { parseWorkerArgs } from './worker-flags.ts';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const defaultConfigFile = path.join(repoRoot, 'configs', 'default.yaml');

const usage = `usage:
  conduit serve [--config FILE] [--model DIR ...] [--http-port N] [--metrics-port N]
  conduit worker --model DIR --listen HOST:PORT|unix:PATH [--dtype auto|fp32|bf16|fp16]
                 [--kv-cache-dtype ...] [--max-model-len N] [--kv-cache-blocks N | --kv-cache-bytes N]
                 [--block-size N] [--max-num-seqs N] [--max-num-batched-tokens N] [--threads N]
                 [--kernel auto|avx512|avx2|scalar] [--quantization none|int8] [--served-name NAME]
                 [--enable-prefix-caching true|false] [--scheduling-policy fcfs|priority]
                 [--redis-url redis://HOST:PORT [--advertise-address HOST:PORT]
                  [--heartbeat-interval-s S] [--heartbeat-ttl-s S]]
  conduit loadtest --url URL --model NAME --scenario NAME|FILE [options]   (conduit loadtest --help)`;

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
    },
  });
  const modelDirs = values.model ?? [];
  const configFile = values.config ?? (modelDirs.length === 0 ? defaultConfigFile : undefined);
  const base: Config = configFile ? loadConfigFile(configFile) : validateConfig({ models: [{ path: '.' }] }, 'command line');
  const raw = {
    server: { ...base.server },
    router: base.router,
    models: [...(configFile ? base.models : []), ...modelDirs.map((dir) => ({ path: path.resolve(dir) }))],
  };
  if (values['http-port'] !== undefined) raw.server.http_port = Number(values['http-port']);
  if (values['metrics-port'] !== undefined) raw.server.metrics_port = Number(values['metrics-port']);
  return validateConfig(raw, configFile ?? 'command line');
}

async function runServe(argv: string[]): Promise<number> {
  const { serve } = await import('./serve.ts');
  const server = await serve(resolveServeConfig(argv));
  console.error(`conduit: serving on ${server.httpAddress} (metrics ${server.metricsAddress})`);
  await new Promise<void>((resolve) => {
    const shutdown = () => resolve();
    process.once('SIGINT', shutdown);
    process.once('SIGTERM', shutdown);
  });
  await server.close();
  return 0;
}

async function runWorker(argv: string[]): Promise<number> {
  const settings = parseWorkerArgs(argv);
  const { startWorker } = await import('../engine/worker.ts');
  const worker = await startWorker(settings);
  console.error(`conduit worker: ${settings.modelDir} on ${worker.address}`);
  await new Promise<void>((resolve) => {
    process.once('SIGINT', () => resolve());
    process.once('SIGTERM', () => resolve());
    // Spawned by a gateway (`conduit serve`): its end is ours.
    if (process.send) process.once('disconnect', () => resolve());
  });
  await worker.close();
  // The lifeline to a spawning gateway would keep the event loop, and so the process, alive.
  if (process.connected) process.disconnect();
  return 0;
}

export async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  try {
    switch (command) {
      case 'serve':
        return await runServe(rest);
      case 'worker':
        return await runWorker(rest);
      case 'loadtest': {
        const loadtest = await import('../loadtest/cli.ts');
        return await loadtest.main(rest);
      }
      case undefined:
      case '--help':
      case '-h':
      case 'help':
        console.log(usage);
        return command === undefined ? 2 : 0;
      default:
        console.error(`conduit: unknown command '${command}'\n${usage}`);
        return 2;
    }
  } catch (err) {
    if (err instanceof ConfigError || (err as NodeJS.ErrnoException).code?.startsWith('ERR_PARSE_ARGS')) {
      console.error(`conduit: ${(err as Error).message}`);
      return 2;
    }
    console.error(`conduit: ${(err as Error).stack ?? err}`);
    return 1;
  }
}
