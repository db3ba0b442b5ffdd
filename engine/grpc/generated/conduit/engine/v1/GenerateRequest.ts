// Original file: proto/engine.proto

import type { SamplingParams as _conduit_engine_v1_SamplingParams, SamplingParams__Output as _conduit_engine_v1_SamplingParams__Output } from '../../../conduit/engine/v1/SamplingParams.ts';

export interface GenerateRequest {
  'requestId'?: (string);
  'promptTokenIds'?: (number)[];
  'sampling'?: (_conduit_engine_v1_SamplingParams | null);
  'priority'?: (number);
  'cacheSalt'?: (string);
  'queueTimeoutMs'?: (number | string);
  'timeoutMs'?: (number | string);
  'externalRequestId'?: (string);
  '_cacheSalt'?: "cacheSalt";
  '_queueTimeoutMs'?: "queueTimeoutMs";
  '_timeoutMs'?: "timeoutMs";
  '_externalRequestId'?: "externalRequestId";
}

export interface GenerateRequest__Output {
  'requestId': (string);
  'promptTokenIds': (number)[];
  'sampling': (_conduit_engine_v1_SamplingParams__Output | null);
  'priority': (number);
  'cacheSalt'?: (string);
  'queueTimeoutMs'?: (number);
  'timeoutMs'?: (number);
  'externalRequestId'?: (string);
  '_cacheSalt'?: "cacheSalt";
  '_queueTimeoutMs'?: "queueTimeoutMs";
  '_timeoutMs'?: "timeoutMs";
  '_externalRequestId'?: "externalRequestId";
}
