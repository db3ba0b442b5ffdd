import type * as grpc from '@grpc/grpc-js';
import type { EnumTypeDefinition, MessageTypeDefinition } from '@grpc/proto-loader';

import type { AbortRequest as _conduit_engine_v1_AbortRequest, AbortRequest__Output as _conduit_engine_v1_AbortRequest__Output } from './conduit/engine/v1/AbortRequest.ts';
import type { ClientMessage as _conduit_engine_v1_ClientMessage, ClientMessage__Output as _conduit_engine_v1_ClientMessage__Output } from './conduit/engine/v1/ClientMessage.ts';
import type { EngineClient as _conduit_engine_v1_EngineClient, EngineDefinition as _conduit_engine_v1_EngineDefinition } from './conduit/engine/v1/Engine.ts';
import type { EngineError as _conduit_engine_v1_EngineError, EngineError__Output as _conduit_engine_v1_EngineError__Output } from './conduit/engine/v1/EngineError.ts';
import type { GenerateRequest as _conduit_engine_v1_GenerateRequest, GenerateRequest__Output as _conduit_engine_v1_GenerateRequest__Output } from './conduit/engine/v1/GenerateRequest.ts';
import type { HealthRequest as _conduit_engine_v1_HealthRequest, HealthRequest__Output as _conduit_engine_v1_HealthRequest__Output } from './conduit/engine/v1/HealthRequest.ts';
import type { HealthResponse as _conduit_engine_v1_HealthResponse, HealthResponse__Output as _conduit_engine_v1_HealthResponse__Output } from './conduit/engine/v1/HealthResponse.ts';
import type { KvEvent as _conduit_engine_v1_KvEvent, KvEvent__Output as _conduit_engine_v1_KvEvent__Output } from './conduit/engine/v1/KvEvent.ts';
import type { RequestOutput as _conduit_engine_v1_RequestOutput, RequestOutput__Output as _conduit_engine_v1_RequestOutput__Output } from './conduit/engine/v1/RequestOutput.ts';
import type { SamplingParams as _conduit_engine_v1_SamplingParams, SamplingParams__Output as _conduit_engine_v1_SamplingParams__Output } from './conduit/engine/v1/SamplingParams.ts';
import type { SpecDecodeStats as _conduit_engine_v1_SpecDecodeStats, SpecDecodeStats__Output as _conduit_engine_v1_SpecDecodeStats__Output } from './conduit/engine/v1/SpecDecodeStats.ts';
import type { StepOutput as _conduit_engine_v1_StepOutput, StepOutput__Output as _conduit_engine_v1_StepOutput__Output } from './conduit/engine/v1/StepOutput.ts';
import type { StepStats as _conduit_engine_v1_StepStats, StepStats__Output as _conduit_engine_v1_StepStats__Output } from './conduit/engine/v1/StepStats.ts';
import type { StructuredOutput as _conduit_engine_v1_StructuredOutput, StructuredOutput__Output as _conduit_engine_v1_StructuredOutput__Output } from './conduit/engine/v1/StructuredOutput.ts';
import type { TokenLogprobs as _conduit_engine_v1_TokenLogprobs, TokenLogprobs__Output as _conduit_engine_v1_TokenLogprobs__Output } from './conduit/engine/v1/TokenLogprobs.ts';
import type { WorkerLoad as _conduit_engine_v1_WorkerLoad, WorkerLoad__Output as _conduit_engine_v1_WorkerLoad__Output } from './conduit/engine/v1/WorkerLoad.ts';
import type { WorkerModelInfo as _conduit_engine_v1_WorkerModelInfo, WorkerModelInfo__Output as _conduit_engine_v1_WorkerModelInfo__Output } from './conduit/engine/v1/WorkerModelInfo.ts';

type SubtypeConstructor<Constructor extends new (...args: any) => any, Subtype> = {
  new(...args: ConstructorParameters<Constructor>): Subtype;
};

export interface ProtoGrpcType {
  conduit: {
    engine: {
      v1: {
        AbortRequest: MessageTypeDefinition<_conduit_engine_v1_AbortRequest, _conduit_engine_v1_AbortRequest__Output>
        ClientMessage: MessageTypeDefinition<_conduit_engine_v1_ClientMessage, _conduit_engine_v1_ClientMessage__Output>
        Engine: SubtypeConstructor<typeof grpc.Client, _conduit_engine_v1_EngineClient> & { service: _conduit_engine_v1_EngineDefinition }
        EngineError: MessageTypeDefinition<_conduit_engine_v1_EngineError, _conduit_engine_v1_EngineError__Output>
        FinishReason: EnumTypeDefinition
        GenerateRequest: MessageTypeDefinition<_conduit_engine_v1_GenerateRequest, _conduit_engine_v1_GenerateRequest__Output>
        HealthRequest: MessageTypeDefinition<_conduit_engine_v1_HealthRequest, _conduit_engine_v1_HealthRequest__Output>
        HealthResponse: MessageTypeDefinition<_conduit_engine_v1_HealthResponse, _conduit_engine_v1_HealthResponse__Output>
        KvEvent: MessageTypeDefinition<_conduit_engine_v1_KvEvent, _conduit_engine_v1_KvEvent__Output>
        RequestOutput: MessageTypeDefinition<_conduit_engine_v1_RequestOutput, _conduit_engine_v1_RequestOutput__Output>
        SamplingParams: MessageTypeDefinition<_conduit_engine_v1_SamplingParams, _conduit_engine_v1_SamplingParams__Output>
        SpecDecodeStats: MessageTypeDefinition<_conduit_engine_v1_SpecDecodeStats, _conduit_engine_v1_SpecDecodeStats__Output>
        StepOutput: MessageTypeDefinition<_conduit_engine_v1_StepOutput, _conduit_engine_v1_StepOutput__Output>
        StepStats: MessageTypeDefinition<_conduit_engine_v1_StepStats, _conduit_engine_v1_StepStats__Output>
        StructuredOutput: MessageTypeDefinition<_conduit_engine_v1_StructuredOutput, _conduit_engine_v1_StructuredOutput__Output>
        TokenLogprobs: MessageTypeDefinition<_conduit_engine_v1_TokenLogprobs, _conduit_engine_v1_TokenLogprobs__Output>
        WorkerLoad: MessageTypeDefinition<_conduit_engine_v1_WorkerLoad, _conduit_engine_v1_WorkerLoad__Output>
        WorkerModelInfo: MessageTypeDefinition<_conduit_engine_v1_WorkerModelInfo, _conduit_engine_v1_WorkerModelInfo__Output>
      }
    }
  }
}

