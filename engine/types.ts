// Plain data that crosses the engine boundary: token ids in, token ids out.

/** Unset fields take the checkpoint's generation_config.json defaults, then the engine's. */
export interface SamplingParams {
  temperature?: number;
  topP?: number;
  topK?: number;
  seed?: bigint;
  maxTokens?: number;
  stopTokenIds?: number[];
  ignoreEos?: boolean;
}

export interface GenerateRequest {
  requestId: string;
  promptTokenIds: number[];
  sampling: SamplingParams;
}

export type FinishReason = 'stop' | 'length' | 'abort' | 'error';

export interface EngineError {
  /** A code from the error catalogue, e.g. 'context_length_exceeded'. */
  code: string;
  message: string;
}

/** One step's worth of news about one request. */
export interface RequestOutput {
  requestId: string;
  newTokenIds: number[];
  /** Log-probabilities of newTokenIds, same length. */
  newLogprobs: number[];
  finishReason: FinishReason | null;
  /**
   * The stop token that ended the request, when finishReason is 'stop'. It is also the last of
   * newTokenIds and counts in numOutputTokens (as OpenAI usage counts EOS); renderers leave its
   * text out.
   */
  stopTokenId?: number;
  numPromptTokens: number;
  numOutputTokens: number;
  error?: EngineError;
}

export interface WorkerLoad {
  numRunning: number;
  numWaiting: number;
  numFreeBlocks: number;
  numTotalBlocks: number;
}

export interface WorkerModelInfo {
  modelName: string;
  maxModelLen: number;
  vocabSize: number;
  blockSizeTokens: number;
  eosTokenIds: number[];
}

/** How the gateway (or any client) talks to one engine worker, local or remote. */
export interface EngineClient {
  readonly address: string;
  /** Streams outputs for one request; the last one has a finishReason. */
  generate(request: GenerateRequest, onOutput: (output: RequestOutput) => void): void;
  abort(requestId: string): void;
  health(): Promise<{ serving: boolean; model: WorkerModelInfo; load: WorkerLoad }>;
  close(): void;
}
