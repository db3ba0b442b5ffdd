// Original file: proto/engine.proto

import type { SamplingParams as _conduit_engine_v1_SamplingParams, SamplingParams__Output as _conduit_engine_v1_SamplingParams__Output } from '../../../conduit/engine/v1/SamplingParams.ts';
import type { StructuredOutput as _conduit_engine_v1_StructuredOutput, StructuredOutput__Output as _conduit_engine_v1_StructuredOutput__Output } from '../../../conduit/engine/v1/StructuredOutput.ts';

export interface GenerateRequest {
  'requestId'?: (string);
  'sampling'?: (_conduit_engine_v1_SamplingParams | null);
  'priority'?: (number);
  'cacheSalt'?: (string);
  'queueTimeoutMs'?: (number | string);
  'timeoutMs'?: (number | string);
  'externalRequestId'?: (string);
  'structuredOutput'?: (_conduit_engine_v1_StructuredOutput | null);
  'numSpeculativeTokens'?: (number);
  'promptTokenIdsLe'?: (Buffer | Uint8Array | string);
  '_cacheSalt'?: "cacheSalt";
  '_queueTimeoutMs'?: "queueTimeoutMs";
  '_timeoutMs'?: "timeoutMs";
  '_externalRequestId'?: "externalRequestId";
  '_numSpeculativeTokens'?: "numSpeculativeTokens";
}

export interface GenerateRequest__Output {
  'requestId': (string);
  'sampling': (_conduit_engine_v1_SamplingParams__Output | null);
  'priority': (number);
  'cacheSalt'?: (string);
  'queueTimeoutMs'?: (number);
  'timeoutMs'?: (number);
  'externalRequestId'?: (string);
  'structuredOutput': (_conduit_engine_v1_StructuredOutput__Output | null);
  'numSpeculativeTokens'?: (number);
  'promptTokenIdsLe': (Buffer);
  '_cacheSalt'?: "cacheSalt";
  '_queueTimeoutMs'?: "queueTimeoutMs";
  '_timeoutMs'?: "timeoutMs";
  '_externalRequestId'?: "externalRequestId";
  '_numSpeculativeTokens'?: "numSpeculativeTokens";
}
