// Original file: proto/engine.proto

import type { FinishReason as _conduit_engine_v1_FinishReason, FinishReason__Output as _conduit_engine_v1_FinishReason__Output } from '../../../conduit/engine/v1/FinishReason.ts';
import type { EngineError as _conduit_engine_v1_EngineError, EngineError__Output as _conduit_engine_v1_EngineError__Output } from '../../../conduit/engine/v1/EngineError.ts';
import type { TokenLogprobs as _conduit_engine_v1_TokenLogprobs, TokenLogprobs__Output as _conduit_engine_v1_TokenLogprobs__Output } from '../../../conduit/engine/v1/TokenLogprobs.ts';

export interface RequestOutput {
  'requestId'?: (string);
  'newTokenIds'?: (number)[];
  'newLogprobs'?: (number | string)[];
  'finishReason'?: (_conduit_engine_v1_FinishReason);
  'stopTokenId'?: (number);
  'numPromptTokens'?: (number);
  'numOutputTokens'?: (number);
  'error'?: (_conduit_engine_v1_EngineError | null);
  'numCachedTokens'?: (number);
  'newTopLogprobs'?: (_conduit_engine_v1_TokenLogprobs)[];
  'promptLogprobs'?: (_conduit_engine_v1_TokenLogprobs)[];
  'queueTimeMs'?: (number | string);
  'prefillTimeMs'?: (number | string);
  'numDraftTokens'?: (number);
  'numAcceptedDraftTokens'?: (number);
  '_stopTokenId'?: "stopTokenId";
  '_queueTimeMs'?: "queueTimeMs";
  '_prefillTimeMs'?: "prefillTimeMs";
}

export interface RequestOutput__Output {
  'requestId': (string);
  'newTokenIds': (number)[];
  'newLogprobs': (number)[];
  'finishReason': (_conduit_engine_v1_FinishReason__Output);
  'stopTokenId'?: (number);
  'numPromptTokens': (number);
  'numOutputTokens': (number);
  'error': (_conduit_engine_v1_EngineError__Output | null);
  'numCachedTokens': (number);
  'newTopLogprobs': (_conduit_engine_v1_TokenLogprobs__Output)[];
  'promptLogprobs': (_conduit_engine_v1_TokenLogprobs__Output)[];
  'queueTimeMs'?: (number);
  'prefillTimeMs'?: (number);
  'numDraftTokens': (number);
  'numAcceptedDraftTokens': (number);
  '_stopTokenId'?: "stopTokenId";
  '_queueTimeMs'?: "queueTimeMs";
  '_prefillTimeMs'?: "prefillTimeMs";
}
