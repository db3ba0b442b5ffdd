// Original file: proto/engine.proto

import type * as grpc from '@grpc/grpc-js'
import type { MethodDefinition } from '@grpc/proto-loader'
import type { ClientMessage as _conduit_engine_v1_ClientMessage, ClientMessage__Output as _conduit_engine_v1_ClientMessage__Output } from '../../../conduit/engine/v1/ClientMessage.ts';
import type { HealthRequest as _conduit_engine_v1_HealthRequest, HealthRequest__Output as _conduit_engine_v1_HealthRequest__Output } from '../../../conduit/engine/v1/HealthRequest.ts';
import type { HealthResponse as _conduit_engine_v1_HealthResponse, HealthResponse__Output as _conduit_engine_v1_HealthResponse__Output } from '../../../conduit/engine/v1/HealthResponse.ts';
import type { StepOutput as _conduit_engine_v1_StepOutput, StepOutput__Output as _conduit_engine_v1_StepOutput__Output } from '../../../conduit/engine/v1/StepOutput.ts';

export interface EngineClient extends grpc.Client {
  Health(argument: _conduit_engine_v1_HealthRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_conduit_engine_v1_HealthResponse__Output>): grpc.ClientUnaryCall;
  Health(argument: _conduit_engine_v1_HealthRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_conduit_engine_v1_HealthResponse__Output>): grpc.ClientUnaryCall;
  Health(argument: _conduit_engine_v1_HealthRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_conduit_engine_v1_HealthResponse__Output>): grpc.ClientUnaryCall;
  Health(argument: _conduit_engine_v1_HealthRequest, callback: grpc.requestCallback<_conduit_engine_v1_HealthResponse__Output>): grpc.ClientUnaryCall;
  health(argument: _conduit_engine_v1_HealthRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_conduit_engine_v1_HealthResponse__Output>): grpc.ClientUnaryCall;
  health(argument: _conduit_engine_v1_HealthRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_conduit_engine_v1_HealthResponse__Output>): grpc.ClientUnaryCall;
  health(argument: _conduit_engine_v1_HealthRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_conduit_engine_v1_HealthResponse__Output>): grpc.ClientUnaryCall;
  health(argument: _conduit_engine_v1_HealthRequest, callback: grpc.requestCallback<_conduit_engine_v1_HealthResponse__Output>): grpc.ClientUnaryCall;
  
  Stream(metadata: grpc.Metadata, options?: grpc.CallOptions): grpc.ClientDuplexStream<_conduit_engine_v1_ClientMessage, _conduit_engine_v1_StepOutput__Output>;
  Stream(options?: grpc.CallOptions): grpc.ClientDuplexStream<_conduit_engine_v1_ClientMessage, _conduit_engine_v1_StepOutput__Output>;
  stream(metadata: grpc.Metadata, options?: grpc.CallOptions): grpc.ClientDuplexStream<_conduit_engine_v1_ClientMessage, _conduit_engine_v1_StepOutput__Output>;
  stream(options?: grpc.CallOptions): grpc.ClientDuplexStream<_conduit_engine_v1_ClientMessage, _conduit_engine_v1_StepOutput__Output>;
  
}

export interface EngineHandlers extends grpc.UntypedServiceImplementation {
  Health: grpc.handleUnaryCall<_conduit_engine_v1_HealthRequest__Output, _conduit_engine_v1_HealthResponse>;
  
  Stream: grpc.handleBidiStreamingCall<_conduit_engine_v1_ClientMessage__Output, _conduit_engine_v1_StepOutput>;
  
}

export interface EngineDefinition extends grpc.ServiceDefinition {
  Health: MethodDefinition<_conduit_engine_v1_HealthRequest, _conduit_engine_v1_HealthResponse, _conduit_engine_v1_HealthRequest__Output, _conduit_engine_v1_HealthResponse__Output>
  Stream: MethodDefinition<_conduit_engine_v1_ClientMessage, _conduit_engine_v1_StepOutput, _conduit_engine_v1_ClientMessage__Output, _conduit_engine_v1_StepOutput__Output>
}
