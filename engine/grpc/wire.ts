// The engine's plain types to and from proto/engine.proto's messages, whose TypeScript shapes are
// generated (generated/, `npm run gen:proto`) for the options loadEngineService loads them with:
// camelCase fields, uint64 as decimal strings, enums as their names, unset `optional` fields
// absent. Nothing outside engine/grpc/ sees a wire shape.
import path from 'node:path';
import * as protoLoader from '@grpc/proto-loader';
import * as grpc from '@grpc/grpc-js';
import { packageRoot } from '../../package-root.ts';
import { isEngineErrorCode, type EngineError } from '../errors.ts';
import type {
  FinishReason,
  GenerateRequest,
  KvEvent,
  PromptTokenLogprobs,
  RequestOutput,
  StepReport,
  StepStats,
  StructuredConstraint,
  StructuredOutput,
  TokenLogprobs,
  WorkerLoad,
  WorkerModelInfo,
} from '../types.ts';
import type { EngineError__Output as WireEngineError } from './generated/conduit/engine/v1/EngineError.ts';
import type { FinishReason as WireFinishReason } from './generated/conduit/engine/v1/FinishReason.ts';
import type {
  GenerateRequest as WireGenerateRequest,
  GenerateRequest__Output as WireGenerateRequestOutput,
} from './generated/conduit/engine/v1/GenerateRequest.ts';
import type {
  StructuredOutput as WireStructuredOutput,
  StructuredOutput__Output as WireStructuredOutputOutput,
} from './generated/conduit/engine/v1/StructuredOutput.ts';
import type { HealthResponse, HealthResponse__Output } from './generated/conduit/engine/v1/HealthResponse.ts';
import type { KvEvent as WireKvEvent, KvEvent__Output as WireKvEventOutput } from './generated/conduit/engine/v1/KvEvent.ts';
import type {
  RequestOutput as WireRequestOutput,
  RequestOutput__Output as WireRequestOutputOutput,
} from './generated/conduit/engine/v1/RequestOutput.ts';
import type { StepOutput, StepOutput__Output } from './generated/conduit/engine/v1/StepOutput.ts';
import type { StepStats__Output as WireStepStats } from './generated/conduit/engine/v1/StepStats.ts';
import type { TokenLogprobs__Output as WireTokenLogprobs } from './generated/conduit/engine/v1/TokenLogprobs.ts';
import type { WorkerLoad__Output as WireWorkerLoad } from './generated/conduit/engine/v1/WorkerLoad.ts';

export type { ClientMessage, ClientMessage__Output } from './generated/conduit/engine/v1/ClientMessage.ts';
export type { HealthResponse, HealthResponse__Output, StepOutput, StepOutput__Output, WireRequestOutput };

const protoFile = path.join(packageRoot, 'proto', 'engine.proto');

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

type WireFinishReasonName = Exclude<WireFinishReason, number>;

const finishReasonToWire: Record<FinishReason, WireFinishReasonName> = {
  stop: 'FINISH_REASON_STOP',
  length: 'FINISH_REASON_LENGTH',
  abort: 'FINISH_REASON_ABORT',
  error: 'FINISH_REASON_ERROR',
};

const finishReasonFromWire: Record<WireFinishReasonName, FinishReason | null> = {
  FINISH_REASON_UNSPECIFIED: null,
  FINISH_REASON_STOP: 'stop',
  FINISH_REASON_LENGTH: 'length',
  FINISH_REASON_ABORT: 'abort',
  FINISH_REASON_ERROR: 'error',
};

/**
 * Token ids as GenerateRequest.prompt_token_ids_le carries them, little-endian int32s: protobufjs
 * copies the bytes whole, where a repeated int32 cost a varint per id on the event loop (seconds
 * for a million-token prompt).
 */
export function tokenIdsToBytes(tokenIds: readonly number[]): Uint8Array {
  const bytes = new Uint8Array(4 * tokenIds.length);
  const view = new DataView(bytes.buffer);
  for (let i = 0; i < tokenIds.length; i++) view.setInt32(4 * i, tokenIds[i], true);
  return bytes;
}

/** The ids tokenIdsToBytes wrote; throws a WireFormatError for a length that is not whole ids. */
export function tokenIdsFromBytes(bytes: Uint8Array): number[] {
  if (bytes.byteLength % 4 !== 0) throw new WireFormatError(`prompt_token_ids_le has ${bytes.byteLength} bytes, not a whole number of 4-byte ids`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  // Sized once: growing a million-element array by push costs several times the reads.
  const tokenIds = new Array<number>(bytes.byteLength / 4);
  for (let i = 0; i < tokenIds.length; i++) tokenIds[i] = view.getInt32(4 * i, true);
  return tokenIds;
}

/** A message the peer encoded wrongly (never one our own peers send). */
export class WireFormatError extends Error {}

/** gRPC's own default limit on a received message, kept for everything besides the prompt. */
const DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024;

/**
 * The largest message a worker takes from its gateway: a prompt as long as the model's context
 * (4 bytes an id) beside gRPC's default 4 MiB for the rest, so that a whole context always gets
 * through and anything larger is refused before it is buffered.
 */
export function maxClientMessageBytes(maxModelLen: number): number {
  return 4 * maxModelLen + DEFAULT_MAX_MESSAGE_BYTES;
}

export function generateToWire(request: GenerateRequest): WireGenerateRequest {
  const { sampling } = request;
  return {
    requestId: request.requestId,
    promptTokenIdsLe: tokenIdsToBytes(request.promptTokenIds),
    sampling: {
      temperature: sampling.temperature,
      topP: sampling.topP,
      topK: sampling.topK,
      seed: sampling.seed?.toString(),
      maxTokens: sampling.maxTokens,
      stopTokenIds: sampling.stopTokenIds,
      ignoreEos: sampling.ignoreEos,
      minP: sampling.minP,
      presencePenalty: sampling.presencePenalty,
      frequencyPenalty: sampling.frequencyPenalty,
      repetitionPenalty: sampling.repetitionPenalty,
      logitBias: sampling.logitBias === undefined ? undefined : Object.fromEntries(sampling.logitBias),
      minTokens: sampling.minTokens,
      numTopLogprobs: sampling.numTopLogprobs,
      numPromptLogprobs: sampling.numPromptLogprobs,
    },
    priority: request.priority,
    cacheSalt: request.cacheSalt,
    queueTimeoutMs: request.queueTimeoutMs,
    timeoutMs: request.timeoutMs,
    externalRequestId: request.externalRequestId,
    structuredOutput: request.structuredOutput === undefined ? undefined : structuredToWire(request.structuredOutput),
    numSpeculativeTokens: request.numSpeculativeTokens,
  };
}

function structuredToWire(structured: StructuredOutput): WireStructuredOutput {
  const { constraint } = structured;
  const wire: WireStructuredOutput = { constrainAfter: structured.constrainAfter, jumpForward: structured.jumpForward, prefixTokenIds: structured.prefixTokenIds === undefined ? undefined : [...structured.prefixTokenIds] };
  switch (constraint.kind) {
    case 'json_schema':
      return { ...wire, jsonSchema: constraint.schema };
    case 'json_object':
      return { ...wire, jsonObject: true };
    case 'regex':
      return { ...wire, regex: constraint.pattern };
    case 'choice':
      return { ...wire, choice: { choices: constraint.choices } };
    case 'grammar':
      return { ...wire, grammar: constraint.grammar };
    case 'structural_tag':
      return { ...wire, structuralTag: constraint.structuralTag };
  }
}

/** Undefined for no constraint; an unknown or empty oneof is a choice with no choices, which the engine refuses by name. */
function structuredFromWire(wire: WireStructuredOutputOutput | null): StructuredOutput | undefined {
  if (wire === null) return undefined;
  const constraintOf = (): StructuredConstraint => {
    switch (wire.constraint) {
      case 'jsonSchema':
        return { kind: 'json_schema', schema: wire.jsonSchema! };
      case 'jsonObject':
        return { kind: 'json_object' };
      case 'regex':
        return { kind: 'regex', pattern: wire.regex! };
      case 'grammar':
        return { kind: 'grammar', grammar: wire.grammar! };
      case 'structuralTag':
        return { kind: 'structural_tag', structuralTag: wire.structuralTag! };
      default:
        return { kind: 'choice', choices: wire.choice?.choices ?? [] };
    }
  };
  const prefixTokenIds = wire.prefixTokenIds.length > 0 ? wire.prefixTokenIds : undefined;
  return { constraint: constraintOf(), constrainAfter: wire.constrainAfter, jumpForward: wire.jumpForward, ...(prefixTokenIds === undefined ? {} : { prefixTokenIds }) };
}

export function generateFromWire(wire: WireGenerateRequestOutput): GenerateRequest {
  const sampling = wire.sampling;
  const logitBias = sampling === null ? [] : Object.entries(sampling.logitBias).map(([tokenId, bias]) => [Number(tokenId), bias] as const);
  return {
    requestId: wire.requestId,
    promptTokenIds: tokenIdsFromBytes(wire.promptTokenIdsLe),
    sampling: {
      temperature: sampling?.temperature,
      topP: sampling?.topP,
      topK: sampling?.topK,
      seed: sampling?.seed === undefined ? undefined : BigInt(sampling.seed),
      maxTokens: sampling?.maxTokens,
      // proto3 cannot tell an empty repeated field or map from an unset one; both mean "none".
      stopTokenIds: sampling?.stopTokenIds,
      ignoreEos: sampling?.ignoreEos,
      minP: sampling?.minP,
      presencePenalty: sampling?.presencePenalty,
      frequencyPenalty: sampling?.frequencyPenalty,
      repetitionPenalty: sampling?.repetitionPenalty,
      logitBias: logitBias.length === 0 ? undefined : new Map(logitBias),
      minTokens: sampling?.minTokens,
      numTopLogprobs: sampling?.numTopLogprobs,
      numPromptLogprobs: sampling?.numPromptLogprobs,
    },
    priority: wire.priority,
    cacheSalt: wire.cacheSalt,
    queueTimeoutMs: wire.queueTimeoutMs,
    timeoutMs: wire.timeoutMs,
    externalRequestId: wire.externalRequestId,
    structuredOutput: structuredFromWire(wire.structuredOutput),
    numSpeculativeTokens: wire.numSpeculativeTokens,
  };
}

function logprobsFromWire(wire: WireTokenLogprobs): TokenLogprobs {
  return { logprob: wire.logprob, topTokenIds: wire.topTokenIds, topLogprobs: wire.topLogprobs };
}

function promptLogprobsFromWire(wire: WireTokenLogprobs): PromptTokenLogprobs {
  return { ...logprobsFromWire(wire), rank: wire.rank };
}

function errorFromWire(wire: WireEngineError): EngineError {
  return isEngineErrorCode(wire.code)
    ? { code: wire.code, message: wire.message }
    : { code: 'internal_error', message: `The worker reported an unknown error ${wire.code}: ${wire.message}` };
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
    numCachedTokens: output.numCachedTokens,
    numOutputTokens: output.numOutputTokens,
    error: output.error ?? null,
    newTopLogprobs: output.newTopLogprobs,
    promptLogprobs: output.promptLogprobs,
    queueTimeMs: output.queueTimeMs,
    prefillTimeMs: output.prefillTimeMs,
    numDraftTokens: output.numDraftTokens ?? 0,
    numAcceptedDraftTokens: output.numAcceptedDraftTokens ?? 0,
  };
}

export function outputFromWire(wire: WireRequestOutputOutput): RequestOutput {
  const output: RequestOutput = {
    requestId: wire.requestId,
    newTokenIds: wire.newTokenIds,
    newLogprobs: wire.newLogprobs,
    finishReason: finishReasonFromWire[wire.finishReason as WireFinishReasonName],
    numPromptTokens: wire.numPromptTokens,
    numCachedTokens: wire.numCachedTokens,
    numOutputTokens: wire.numOutputTokens,
  };
  if (wire.stopTokenId !== undefined) output.stopTokenId = wire.stopTokenId;
  if (wire.error !== null) output.error = errorFromWire(wire.error);
  if (wire.newTopLogprobs.length > 0) output.newTopLogprobs = wire.newTopLogprobs.map(logprobsFromWire);
  if (wire.promptLogprobs.length > 0) output.promptLogprobs = wire.promptLogprobs.map(promptLogprobsFromWire);
  if (wire.queueTimeMs !== undefined) output.queueTimeMs = wire.queueTimeMs;
  if (wire.prefillTimeMs !== undefined) output.prefillTimeMs = wire.prefillTimeMs;
  if (wire.numDraftTokens > 0) {
    output.numDraftTokens = wire.numDraftTokens;
    output.numAcceptedDraftTokens = wire.numAcceptedDraftTokens;
  }
  return output;
}

const kvEventKindToWire = { stored: 'KIND_STORED', removed: 'KIND_REMOVED', cleared: 'KIND_CLEARED' } as const;

function kvEventToWire(event: KvEvent): WireKvEvent {
  return { kind: kvEventKindToWire[event.kind], blockHashes: event.kind === 'cleared' ? [] : event.blockHashes };
}

function kvEventFromWire(wire: WireKvEventOutput): KvEvent | null {
  switch (wire.kind) {
    case 'KIND_STORED': return { kind: 'stored', blockHashes: wire.blockHashes };
    case 'KIND_REMOVED': return { kind: 'removed', blockHashes: wire.blockHashes };
    case 'KIND_CLEARED': return { kind: 'cleared' };
    default: return null;
  }
}

function loadFromWire(wire: WireWorkerLoad): WorkerLoad {
  return {
    numRunning: wire.numRunning,
    numWaiting: wire.numWaiting,
    numFreeBlocks: wire.numFreeBlocks,
    numTotalBlocks: wire.numTotalBlocks,
    numQueuedPrefillTokens: wire.numQueuedPrefillTokens,
    numCachedBlocks: wire.numCachedBlocks,
  };
}

function statsFromWire(wire: WireStepStats): StepStats {
  const { specDecode, ...stats } = wire;
  if (specDecode === null) return stats;
  return {
    ...stats,
    specDecode: {
      numDrafts: specDecode.numDrafts,
      numDraftTokens: specDecode.numDraftTokens,
      numAcceptedTokens: specDecode.numAcceptedTokens,
      numAcceptedTokensPerPosition: specDecode.numAcceptedTokensPerPos,
    },
  };
}

/** One message for a stream: its outputs of the step, and the step's report. */
export function stepToWire(outputs: readonly WireRequestOutput[], report: StepReport): StepOutput {
  const { stats } = report;
  const specDecode = stats?.specDecode;
  const wireStats = stats === null || specDecode === undefined ? stats : { ...stats, specDecode: { ...specDecode, numAcceptedTokensPerPos: specDecode.numAcceptedTokensPerPosition } };
  return { outputs: [...outputs], kvEvents: report.events.map(kvEventToWire), load: report.load, stats: wireStats };
}

/** Throws on a message without load: the worker always sends one. */
export function stepFromWire(wire: StepOutput__Output): { outputs: RequestOutput[]; report: StepReport } {
  if (wire.load === null) throw new Error('a step output without load');
  const events: KvEvent[] = [];
  for (const event of wire.kvEvents) {
    const converted = kvEventFromWire(event);
    if (converted !== null) events.push(converted);
  }
  return {
    outputs: wire.outputs.map(outputFromWire),
    report: { events, load: loadFromWire(wire.load), stats: wire.stats === null ? null : statsFromWire(wire.stats) },
  };
}

export function healthToWire(health: { serving: boolean; model: WorkerModelInfo; load: WorkerLoad }): HealthResponse {
  return health;
}

/** Throws on a response without model or load. */
export function healthFromWire(wire: HealthResponse__Output): { serving: boolean; model: WorkerModelInfo; load: WorkerLoad } {
  if (wire.model === null || wire.load === null) throw new Error('a health response without model or load');
  return { serving: wire.serving, model: wire.model, load: loadFromWire(wire.load) };
}
