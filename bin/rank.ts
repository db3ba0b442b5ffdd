// `conduit rank`: one rank > 0 of a worker's tensor-parallel group. It loads its shard, joins the
// group and runs every pass the worker (rank 0) starts, until the worker closes its model (exit 0)
// or the group fails (exit 1). A worker with tensor_parallel_size > 1 starts these itself.
import { parseArgs } from 'node:util';
import { ConfigError } from '../configs/schema.ts';
import type { DtypeSetting, KernelPath, Quantization } from '../native/api.ts';

export const rankUsage = `usage: conduit rank --model DIR --rank R --tensor-parallel-size N --connect shm:GROUP|mpi
                    [--dtype auto|fp32|bf16|fp16] [--kv-cache-dtype ...] [--kv-cache-blocks N] [--block-size N]
                    [--threads N] [--kernel auto|amx|avx512|avx2|scalar] [--quantization none|int8] [--max-model-len N]
                    [--connect-timeout-s S]
  Rank R (1 .. N-1) of the tensor-parallel group whose rank 0 (a worker) made the shared-memory segment
  /dev/shm/GROUP on this machine; or, with --connect mpi, rank R of MPI_COMM_WORLD beside a worker with
  --tensor-parallel-transport mpi, all started by MPICH's mpiexec on one machine or several:
    mpiexec -n 1 conduit worker --model DIR --listen ... --tensor-parallel-size 2 --tensor-parallel-transport mpi \\
      : -hosts OTHER -n 1 conduit rank --model DIR --rank 1 --tensor-parallel-size 2 --connect mpi --kv-cache-blocks N
  Every setting must be the worker's.`;

function integerFlag(flag: string, value: string | undefined, fallback?: number): number {
  if (value === undefined) {
    if (fallback !== undefined) return fallback;
    throw new ConfigError(`command line: --${flag} is required`);
  }
  const number = Number(value);
  if (!Number.isSafeInteger(number) || number < 0) throw new ConfigError(`command line: --${flag} ${value}: expected a non-negative integer`);
  return number;
}

export async function runRank(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    strict: true,
    options: {
      model: { type: 'string' },
      rank: { type: 'string' },
      'tensor-parallel-size': { type: 'string' },
      connect: { type: 'string' },
      dtype: { type: 'string', default: 'auto' },
      'kv-cache-dtype': { type: 'string', default: 'auto' },
      'kv-cache-blocks': { type: 'string' },
      'block-size': { type: 'string' },
      threads: { type: 'string' },
      kernel: { type: 'string', default: 'auto' },
      quantization: { type: 'string', default: 'none' },
      'max-model-len': { type: 'string' },
      'connect-timeout-s': { type: 'string' },
    },
  });
  if (values.model === undefined) throw new ConfigError('command line: --model is required');
  const connect = values.connect ?? '';
  const match = /^shm:(.+)$/.exec(connect);
  if (match === null && connect !== 'mpi') {
    throw new ConfigError(
      `command line: --connect ${connect || '(missing)'}: expected shm:GROUP (ranks on this machine) or mpi (ranks an MPI launcher started, on this machine or others)`,
    );
  }
  const { MPI_GROUP, loadModel } = await import('../native/index.ts');
  const group = match === null ? MPI_GROUP : match[1];
  const rank = integerFlag('rank', values.rank);
  const size = integerFlag('tensor-parallel-size', values['tensor-parallel-size']);
  const model = await loadModel({
    modelDir: values.model,
    dtype: values.dtype as DtypeSetting,
    kvCacheDtype: values['kv-cache-dtype'] as DtypeSetting,
    numKvBlocks: integerFlag('kv-cache-blocks', values['kv-cache-blocks']),
    blockSizeTokens: integerFlag('block-size', values['block-size'], 16),
    numThreads: integerFlag('threads', values.threads, 1),
    kernel: values.kernel as KernelPath,
    quantization: values.quantization as Quantization,
    ...(values['max-model-len'] === undefined ? {} : { maxModelLen: integerFlag('max-model-len', values['max-model-len']) }),
    tensorParallel: { size, rank, group, connectTimeoutMs: integerFlag('connect-timeout-s', values['connect-timeout-s'], 600) * 1000 },
  });
  const node = model.numaNode;
  console.error(`conduit rank ${rank}/${size} (pid ${process.pid}): serving group ${group}${node === null ? ', one NUMA node: not pinned' : `, pinned to NUMA node ${node}`}`);
  try {
    await model.serveRank();
  } catch (err) {
    console.error(`conduit rank ${rank}/${size}: ${(err as Error).message}`);
    return 1;
  } finally {
    model.close();
  }
  return 0;
}
