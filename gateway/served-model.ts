// The models this gateway serves: what the caller hands in, plus the tokenizer and chat
// template loaded from each checkpoint directory.
import { statSync } from 'node:fs';
import type { EngineClient } from '../engine/types.ts';
import { ModelRouter } from '../router/model-router.ts';
import { DEFAULT_ROUTER_SETTINGS } from '../router/settings.ts';
import { readDefaultMaxTokens } from './default-max-tokens.ts';
import { ApiError } from './errors.ts';
import { formatsOf, type ModelFormats } from './tool-calls/families.ts';
import { loadChatTemplate, type ChatTemplate } from './tokenizer/chat-template.ts';
import { loadTokenizer } from './tokenizer/load.ts';
import type { Tokenizer } from './tokenizer/tokenizer.ts';

/**
 * A worker counts its own requests in flight (from generate until its last output or abort):
 * one that left the registry is closed once they are done.
 */
export type ServedWorker = EngineClient & { readonly numInFlight: number };

export interface ServedModel {
  /** What clients put in `model`. */
  name: string;
  /** The checkpoint directory; its tokenizer files are read from here. */
  modelDir: string;
  /** Longest prompt + output in tokens; may be set after the gateway is created (before it is ready). */
  maxModelLen: number;
  /** Deadlines every request gets (the engine ends it with queue_timeout / request_timeout); undefined: none. */
  queueTimeoutMs?: number;
  requestTimeoutMs?: number;
  workers: ServedWorker[];
  /**
   * Picks a worker for each request (router/). Absent: a kv-aware router over `workers`, which
   * learns the block size from them (routerOf fills it in).
   */
  router?: ModelRouter<ServedWorker>;
}

/** The model's router, made on first use when the caller gave none. */
export function routerOf(model: ServedModel): ModelRouter<ServedWorker> {
  if (model.router === undefined) {
    const router = new ModelRouter<ServedWorker>({ modelName: model.name, blockSizeTokens: null, settings: DEFAULT_ROUTER_SETTINGS });
    for (const worker of model.workers) router.addWorker(worker);
    model.router = router;
  }
  return model.router;
}

export interface RegisteredModel extends ServedModel {
  router: ModelRouter<ServedWorker>;
  tokenizer: Tokenizer;
  /** Null when the checkpoint has none; chat requests are then refused. */
  chatTemplate: ChatTemplate | null;
  /** The output length of a request that sets none (generation_config.json's max_new_tokens); null: none named. */
  defaultMaxTokens: number | null;
  /** How its family writes tool calls and reasoning, read from its chat template. */
  formats: ModelFormats;
  /** Unix seconds, for /v1/models. */
  createdAtSec: number;
}

/** A checkpoint directory the gateway cannot read: missing, or its tokenizer files. The message says which and why. */
export class CheckpointError extends Error {
  override name = 'CheckpointError';
}

/** The gateway's part of a checkpoint: its tokenizer, chat template and default output length. */
function readCheckpoint(model: ServedModel) {
  const stat = statSync(model.modelDir, { throwIfNoEntry: false });
  if (stat === undefined) throw new CheckpointError(`model ${model.name}: the directory ${model.modelDir} does not exist`);
  const ggufFile = stat.isFile() && model.modelDir.toLowerCase().endsWith('.gguf');
  if (!stat.isDirectory() && !ggufFile) throw new CheckpointError(`model ${model.name}: ${model.modelDir} is not a directory`);
  try {
    const { tokenizer, config } = loadTokenizer(model.modelDir);
    return {
      tokenizer, chatTemplate: loadChatTemplate(config), formats: formatsOf(config.chatTemplate),
      defaultMaxTokens: ggufFile ? null : readDefaultMaxTokens(model.modelDir),
    };
  } catch (err) {
    throw new CheckpointError(`model ${model.name}: ${(err as Error).message}`);
  }
}

export class ModelRegistry {
  readonly models: readonly RegisteredModel[];
  private readonly modelsByName: Map<string, RegisteredModel>;

  /** Throws a CheckpointError for a model whose directory cannot be read. */
  constructor(models: readonly ServedModel[]) {
    const createdAtSec = Math.floor(Date.now() / 1000);
    this.models = models.map((model) => {
      return {
        ...model, router: routerOf(model), ...readCheckpoint(model), createdAtSec,
        // Read through: a server that listens before its workers answer fills it in when they do.
        get maxModelLen() {
          return model.maxModelLen;
        },
      };
    });
    this.modelsByName = new Map(this.models.map((model) => [model.name, model]));
  }

  get(name: string): RegisteredModel {
    const model = this.modelsByName.get(name);
    if (model === undefined) {
      throw new ApiError('model_not_found', `The model \`${name}\` does not exist.`, 'model');
    }
    return model;
  }
}
