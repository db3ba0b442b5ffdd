// Original file: proto/engine.proto

import type { GenerateRequest as _conduit_engine_v1_GenerateRequest, GenerateRequest__Output as _conduit_engine_v1_GenerateRequest__Output } from '../../../conduit/engine/v1/GenerateRequest.ts';
import type { AbortRequest as _conduit_engine_v1_AbortRequest, AbortRequest__Output as _conduit_engine_v1_AbortRequest__Output } from '../../../conduit/engine/v1/AbortRequest.ts';

export interface ClientMessage {
  'generate'?: (_conduit_engine_v1_GenerateRequest | null);
  'abort'?: (_conduit_engine_v1_AbortRequest | null);
  'kind'?: "generate"|"abort";
}

export interface ClientMessage__Output {
  'generate'?: (_conduit_engine_v1_GenerateRequest__Output | null);
  'abort'?: (_conduit_engine_v1_AbortRequest__Output | null);
  'kind'?: "generate"|"abort";
}
