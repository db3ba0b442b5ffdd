// One engine worker process: loads the model into the native runtime, runs the engine loop
// over it, and serves proto/engine.proto on one address.
import type { SpeculativeConfig } from './spec/proposer.ts';
import type { LevelWithSilent } from 'pino';
import type { Device, DtypeSetting, KernelPath, Quantization } from '../native/api.ts';
import { GPU_GROUP, MPI_GROUP, describeKvCache, loadModel } from '../native/index.ts';
import { createEngine } from './engine.ts';
import { loadDraftProposer, type DraftProposer } from './spec/draft.ts';
import { startRanks } from './tensor-parallel.ts';
import { GrammarService } from './grammar/service.ts';
import type { PrefillLimits, SchedulingPolicy } from './scheduler.ts';
import { readGenerationDefaults } from './generation-config.ts';
import { serveEngine } from './grpc/service.ts';
import { maxTokensWithin } from './kv/kv-cache-manager.ts';
import { createWorkerLogger, type Logger } from './log.ts';
import { NativeRunner } from './native-runner.ts';
import { RedisPublisher } from './redis-publisher.ts';

export interface WorkerSettings {
  /** A Hugging Face checkpoint directory. */
  modelDir: string;
  servedName: string;
  dtype: DtypeSetting;
  kvCacheDtype: DtypeSetting;
  /** Defaults to the checkpoint's max_position_embeddings, capped by what the KV cache holds. */
  maxModelLen?: number;
  /** KV-cache size: blocks, or bytes per tensor-parallel rank (blocks win when both are set). */
  kvCacheBlocks?: number;
  kvCacheBytes?: number;
  blockSizeTokens: number;
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  /** How prompts share a step (scheduler.ts prefillLimitsFor: the performance mode's, or the configuration's own). */
  prefillLimits: PrefillLimits;
  numThreads: number;
  kernel: KernelPath;
  /** `cpu` unless the configuration asks for `cuda`. */
  device?: Device;
  /** Weight-only quantization made at load time (`int8`: Q8_0-style block scales). */
  quantization: Quantization;
  /** Ranks the model is split over (1 when absent): this worker is rank 0 and starts the others (tensor-parallel.ts). */
  tensorParallelSize?: number;
  /**
   * How the ranks join: `shm` (default), this worker starts them on this machine; `mpi`, an MPI
   * launcher started this worker as rank 0 of MPI_COMM_WORLD and the ranks (`conduit rank
   * --connect mpi`) beside it, on this machine or others.
   */
  tensorParallelTransport?: 'shm' | 'mpi';
  enablePrefixCaching: boolean;
  schedulingPolicy: SchedulingPolicy;
  /** Speculative decoding (engine/spec/); none when absent or null. */
  speculative?: SpeculativeConfig | null;
  /** Threads that compile structured outputs' grammars and fill their masks (the model's grammar_threads; started on first use). */
  grammarThreads: number;
  /** 'HOST:PORT' (port 0 picks a free one) or 'unix:PATH'. */
  listen: string;
  /** Register in Redis and publish KV events there, for gateways on other machines (shared-state.ts). */
  sharedState?: SharedStateSettings;
  /** JSON lines on stdout at this level and above ('info' when unset); or a logger of the caller's. */
  logLevel?: LevelWithSilent;
  log?: Logger;
}

export interface SharedStateSettings {
  redisUrl: string;
  /** Where gateways reach this worker; defaults to the address it listens on (which must then be a host's). */
  advertiseAddress?: string;
  heartbeatIntervalMs: number;
  heartbeatTtlMs: number;
}

export interface RunningWorker {
  /** Where it listens: 'HOST:PORT' with the bound port, or 'unix:PATH'. */
  readonly address: string;
  /** Ends the requests in flight with an error, stops serving and frees the model. */
  close(): Promise<void>;
  /**
   * Settles, with why, if the worker can no longer serve on its own account (a tensor-parallel
   * rank died): its requests have failed with engine_unavailable, and it should exit so that its
   * supervisor restarts the group as one. Never settles otherwise.
   */
  readonly failed: Promise<Error>;
}

function numKvBlocksOf(settings: WorkerSettings): number {
  if (settings.kvCacheBlocks !== undefined) return settings.kvCacheBlocks;
  if (settings.kvCacheBytes === undefined) throw new Error('worker: set kvCacheBlocks or kvCacheBytes');
  // Every rank holds numKvBlocks blocks of its own KV heads, so the bytes buy blocks of a rank's size.
  const { bytesPerBlock } = describeKvCache(
    settings.modelDir,
    settings.dtype,
    settings.kvCacheDtype,
    settings.blockSizeTokens,
    settings.tensorParallelSize ?? 1,
  );
  const numBlocks = Math.floor(settings.kvCacheBytes / bytesPerBlock);
  if (numBlocks < 1) {
    throw new Error(`worker: a KV cache of ${settings.kvCacheBytes} bytes holds no block of ${bytesPerBlock} bytes`);
  }
  return numBlocks;
}

export async function startWorker(settings: WorkerSettings): Promise<RunningWorker> {
  const log = settings.log ?? createWorkerLogger(settings.logLevel ?? 'info');
  const numKvBlocks = numKvBlocksOf(settings);
  const generationDefaults = readGenerationDefaults(settings.modelDir);
  const tensorParallelSize = settings.tensorParallelSize ?? 1;
  const overMpi = tensorParallelSize > 1 && settings.tensorParallelTransport === 'mpi';
  // On GPUs this process drives every rank itself (native/README.md, "CUDA backend").
  const ranksOnGpus = tensorParallelSize > 1 && settings.device === 'cuda';
  const ranks =
    tensorParallelSize > 1 && !overMpi && !ranksOnGpus
      ? startRanks({ ...settings, numKvBlocks, tensorParallelSize })
      : null;
  let model;
  try {
    model = await loadModel({
      modelDir: settings.modelDir,
      dtype: settings.dtype,
      kvCacheDtype: settings.kvCacheDtype,
      numKvBlocks,
      blockSizeTokens: settings.blockSizeTokens,
      numThreads: settings.numThreads,
      kernel: settings.kernel,
      ...(settings.device === undefined ? {} : { device: settings.device }),
      quantization: settings.quantization,
      ...(settings.maxModelLen === undefined ? {} : { maxModelLen: settings.maxModelLen }),
      ...(ranks === null ? {} : { tensorParallel: { size: tensorParallelSize, rank: 0, group: ranks.group, rankPids: ranks.pids } }),
      ...(overMpi ? { tensorParallel: { size: tensorParallelSize, rank: 0, group: MPI_GROUP } } : {}),
      ...(ranksOnGpus && !overMpi ? { tensorParallel: { size: tensorParallelSize, rank: 0, group: GPU_GROUP } } : {}),
    });
  } catch (err) {
    await ranks?.stop();
    throw err;
  }
  if (ranks !== null || overMpi) {
    log.info({ tensor_parallel_size: tensorParallelSize, group: ranks?.group ?? MPI_GROUP, numa_node: model.numaNode }, 'tensor-parallel group joined');
  }
  const { maxPositionEmbeddings, kvCacheGroups } = model.info;
  const cacheTokens = maxTokensWithin(numKvBlocks, settings.blockSizeTokens, kvCacheGroups, settings.maxNumBatchedTokens);
  const maxModelLen = settings.maxModelLen ?? Math.min(maxPositionEmbeddings, cacheTokens);
  if (maxModelLen > maxPositionEmbeddings) {
    model.close();
    throw new Error(`worker: maxModelLen ${maxModelLen} exceeds the checkpoint's max_position_embeddings (${maxPositionEmbeddings})`);
  }
  const runner = new NativeRunner(model, {
    maxModelLen,
    maxNumSeqs: settings.maxNumSeqs,
    maxNumBatchedTokens: settings.maxNumBatchedTokens,
  });
  let draft: DraftProposer | undefined;
  let engine;
  try {
    if (settings.speculative?.method === 'draft_model') {
      draft = await loadDraftProposer({
        modelDir: settings.speculative.draftModel!,
        targetVocabSize: model.info.vocabSize,
        dtype: settings.dtype,
        kvCacheDtype: settings.kvCacheDtype,
        // As many tokens as the target's pool: room for every sequence the target holds.
        numKvBlocks,
        blockSizeTokens: settings.blockSizeTokens,
        numThreads: settings.numThreads,
        kernel: settings.kernel,
        maxNumSeqs: settings.maxNumSeqs,
        maxNumBatchedTokens: settings.maxNumBatchedTokens,
      });
      log.info({ draft_model: settings.speculative.draftModel, num_kv_blocks: numKvBlocks }, 'draft model loaded');
    }
    engine = createEngine(runner, {
      servedName: settings.servedName,
      maxNumSeqs: settings.maxNumSeqs,
      maxNumBatchedTokens: settings.maxNumBatchedTokens,
      prefillLimits: settings.prefillLimits,
      generationDefaults,
      enablePrefixCaching: settings.enablePrefixCaching,
      policy: settings.schedulingPolicy,
      speculative: settings.speculative,
      ...(draft === undefined ? {} : { proposer: draft }),
      grammars: new GrammarService({
        modelDir: settings.modelDir,
        vocabSize: model.info.vocabSize,
        eosTokenIds: generationDefaults.eosTokenIds,
        maxNumSeqs: settings.maxNumSeqs,
        numThreads: settings.grammarThreads,
      }),
      log,
    });
  } catch (err) {
    runner.close();
    draft?.close();
    throw err;
  }
  let server;
  try {
    server = await serveEngine(engine, settings.listen, log);
  } catch (err) {
    await engine.close();
    draft?.close();
    throw err;
  }
  let publisher: RedisPublisher | null = null;
  if (settings.sharedState !== undefined) {
    const { redisUrl, advertiseAddress, heartbeatIntervalMs, heartbeatTtlMs } = settings.sharedState;
    const address = advertiseAddress ?? server.address;
    if (/^(0\.0\.0\.0|\[?::\]?):/.test(address)) {
      await engine.close();
      draft?.close();
      await server.close();
      throw new Error(`worker: listening on ${address}, it needs an advertise address that gateways can reach`);
    }
    publisher = new RedisPublisher(engine, {
      redisUrl, address, model: engine.model, numKvBlocks, maxNumSeqs: settings.maxNumSeqs, heartbeatIntervalMs, heartbeatTtlMs,
    });
  }
  log.info({ model: settings.servedName, address: server.address, num_kv_blocks: numKvBlocks, max_model_len: maxModelLen }, 'worker serving');
  return {
    address: server.address,
    async close() {
      // Out of the registry first, so that gateways stop sending requests.
      await publisher?.close();
      // The engine next, so that clients read why their requests ended before the stream closes.
      await engine.close();
      draft?.close();
      await server.close();
      // Their model's close stopped the ranks' serving; they exit on their own.
      await ranks?.stop();
    },
    failed: ranks?.lost ?? new Promise<Error>(() => {}),
  };
}
