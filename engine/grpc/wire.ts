// The shapes @grpc/proto-loader gives proto/engine.proto messages (camelCase fields, uint64 as
// decimal strings, enums as their names, unset `optional` fields absent), and their conversion
// to and from the engine's plain types. Nothing outside engine/grpc/ sees a wire shape.
import { fileURLToPath } from 'node:url';
import * as protoLoader from '@grpc/proto-loader';
import * as grpc from '@grpc/grpc-js';
import type {
  EngineError,
  FinishReason,
  GenerateRequest,
  RequestOutput,
  WorkerLoad,
  WorkerModelInfo,
} from '../types.ts';

const protoFile = fileURLToPath(new URL('../../proto/engine.proto', import.meta.url));

export function loadEngineService(): grpc.ServiceClientConstructor {
  const packageDefinition = protoLoader.loadSync(protoFile, {
    keepCase: false,
    longs: String,
    enums: String,
    defaults: true,
    arrays: true,
    oneofs: true,
  });
  const root = grpc.loadPackageDefinition(packageDefinition) as unknown as {
    conduit: { engine: { v1: { Engine: grpc.ServiceClientConstructor } } };
  };
  return root.conduit.engine.v1.Engine;
}

interface WireSamplingParams {
  temperature?: number;
  topP?: number;
  topK?: number;
  seed?: string;
  maxTokens?: number;
  stopTokenIds?: number[];
  ignoreEos?: boolean;
}

export interface WireGenerateRequest {
  requestId: string;
  promptTokenIds: number[];
  sampling: WireSamplingParams | null;
}

export interface WireClientMessage {
  generate?: WireGenerateRequest | null;
  abort?: { requestId: string } | null;
}

type WireFinishReason =
  | 'FINISH_REASON_UNSPECIFIED'
  | 'FINISH_REASON_STOP'
  | 'FINISH_REASON_LENGTH'
  | 'FINISH_REASON_ABORT'
  | 'FINISH_REASON_ERROR';

export interface WireRequestOutput {
  requestId: string;
  newTokenIds: number[];
  newLogprobs: number[];
  finishReason: WireFinishReason;
  stopTokenId?: number;
  numPromptTokens: number;
  numOutputTokens: number;
  error: EngineError | null;
}

export interface WireServerMessage {
  output: WireRequestOutput | null;
}

export interface WireHealthResponse {
  serving: boolean;
  model: WorkerModelInfo | null;
  load: WorkerLoad | null;
}

const finishReasonToWire: Record<FinishReason, WireFinishReason> = {
  stop: 'FINISH_REASON_STOP',
  length: 'FINISH_REASON_LENGTH',
  abort: 'FINISH_REASON_ABORT',
  error: 'FINISH_REASON_ERROR',
};

const finishReasonFromWire: Record<WireFinishReason, FinishReason | null> = {
  FINISH_REASON_UNSPECIFIED: null,
  FINISH_REASON_STOP: 'stop',
  FINISH_REASON_LENGTH: 'length',
  FINISH_REASON_ABORT: 'abort',
  FINISH_REASON_ERROR: 'error',
};

export function generateToWire(request: GenerateRequest): WireGenerateRequest {
  const { sampling } = request;
  return {
    requestId: request.requestId,
    promptTokenIds: request.promptTokenIds,
    sampling: {
      temperature: sampling.temperature,
      topP: sampling.topP,
      topK: sampling.topK,
      seed: sampling.seed?.toString(),
      maxTokens: sampling.maxTokens,
      stopTokenIds: sampling.stopTokenIds,
      ignoreEos: sampling.ignoreEos,
    },
  };
}

export function generateFromWire(wire: WireGenerateRequest): GenerateRequest {
  const sampling = wire.sampling ?? {};
  return {
    requestId: wire.requestId,
    promptTokenIds: wire.promptTokenIds,
    sampling: {
      temperature: sampling.temperature,
      topP: sampling.topP,
      topK: sampling.topK,
      seed: sampling.seed === undefined ? undefined : BigInt(sampling.seed),
      maxTokens: sampling.maxTokens,
      // proto3 cannot tell an empty repeated field from an unset one; both mean "none".
      stopTokenIds: sampling.stopTokenIds,
      ignoreEos: sampling.ignoreEos,
    },
  };
}

/** requestId replaces output.requestId: the service keys engine requests per stream. */
export function outputToWire(output: RequestOutput, requestId: string): WireRequestOutput {
  return {
    requestId,
    newTokenIds: output.newTokenIds,
    newLogprobs: output.newLogprobs,
    finishReason: output.finishReason === null ? 'FINISH_REASON_UNSPECIFIED' : finishReasonToWire[output.finishReason],
    stopTokenId: output.stopTokenId,
    numPromptTokens: output.numPromptTokens,
    numOutputTokens: output.numOutputTokens,
    error: output.error ?? null,
  };
}

export function outputFromWire(wire: WireRequestOutput): RequestOutput {
  const output: RequestOutput = {
    requestId: wire.requestId,
    newTokenIds: wire.newTokenIds,
    newLogprobs: wire.newLogprobs,
    finishReason: finishReasonFromWire[wire.finishReason],
    numPromptTokens: wire.numPromptTokens,
    numOutputTokens: wire.numOutputTokens,
  };
  if (wire.stopTokenId !== undefined) output.stopTokenId = wire.stopTokenId;
  if (wire.error !== null) output.error = wire.error;
  return output;
}
